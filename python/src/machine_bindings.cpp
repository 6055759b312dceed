// What the library knows about the machine, for tileattn.info().
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::python {

namespace {

nb::dict machine_info() {
  nb::dict d;
  const CpuFeatures& f = cpu_features();
  d["isa"] = std::string(isa_name(resolve_isa(Isa::automatic)));
  d["best_isa"] = std::string(isa_name(best_isa()));
  d["cpu"] = f.brand;
  d["cpu_family"] = f.family;
  d["cpu_model"] = f.model;
  d["avx2"] = f.avx2;
  d["fma"] = f.fma;
  d["f16c"] = f.f16c;
  d["avx512f"] = f.avx512f;
  d["avx512_bf16"] = f.avx512_bf16;
  d["avx512_vbmi"] = f.avx512_vbmi;  // the fp8 decode products' byte permutes
  d["avx512_vnni"] = f.avx512_vnni;  // the int8 decode products of bf16_probabilities
  d["amx_bf16"] = f.amx_bf16;
  d["amx_int8"] = f.amx_int8;
  d["bf16_isa"] = std::string(isa_name(bf16_isa()));  // the rung bf16 inputs take
  d["threads"] = hardware_threads();
  const CacheSizes& c = cache_sizes();
  d["l1d_bytes"] = c.l1d;
  d["l2_bytes"] = c.l2;
  d["l3_bytes"] = c.l3;
  return d;
}

}  // namespace

void bind_machine(nb::module_& m) {
  m.def("machine_info", &machine_info, "ISA chosen, CPU features, cache sizes, hardware threads");
  m.def("hardware_threads", [] { return hardware_threads(); }, "threads the hardware offers (at least 1)");
  m.def("set_bf16_probabilities", [](bool enabled) { bf16_probabilities_setting().store(enabled); },
        "ForwardArgs::bf16_probabilities for every later forward call from Python");
  m.def("get_bf16_probabilities", [] { return bf16_probabilities_setting().load(); });
}

}  // namespace tileattn::python
