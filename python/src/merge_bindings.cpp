// tileattn._tileattn.merge_states: merge.hpp's merge_states on caller-owned memory.
#include <array>
#include <cstdint>

#include <nanobind/stl/array.h>

#include "bindings.hpp"
#include "tileattn/merge.hpp"

namespace tileattn::python {

namespace {

// Shape [batch, heads, rows, head_dim].
void merge(int dtype, const std::array<int64_t, 4>& shape, Address o_a, const Stride4& o_a_stride,
           Address lse_a, const Stride3& lse_a_stride, Address o_b, const Stride4& o_b_stride,
           Address lse_b, const Stride3& lse_b_stride, Address o_out, const Stride4& o_out_stride,
           Address lse_out, const Stride3& lse_out_stride) {
  if (dtype < 0 || dtype > int(DType::bf16)) throw Error("dtype: unknown code");
  MergeArgs a;
  a.batch = shape[0];
  a.heads = shape[1];
  a.rows = shape[2];
  a.head_dim = shape[3];
  a.dtype = DType(dtype);
  a.o_a = InputView{from_address<const void>(o_a), o_a_stride};
  a.lse_a = from_address<const float>(lse_a);
  a.lse_a_stride = lse_a_stride;
  a.o_b = InputView{from_address<const void>(o_b), o_b_stride};
  a.lse_b = from_address<const float>(lse_b);
  a.lse_b_stride = lse_b_stride;
  a.o_out = OutputView{from_address<void>(o_out), o_out_stride};
  a.lse_out = from_address<float>(lse_out);
  a.lse_out_stride = lse_out_stride;
  nb::gil_scoped_release release;
  merge_states(a);
}

}  // namespace

void bind_merge(nb::module_& m) {
  m.def("merge_states", &merge, nb::arg("dtype"), nb::arg("shape"), nb::arg("o_a"),
        nb::arg("o_a_stride"), nb::arg("lse_a"), nb::arg("lse_a_stride"), nb::arg("o_b"),
        nb::arg("o_b_stride"), nb::arg("lse_b"), nb::arg("lse_b_stride"), nb::arg("o_out"),
        nb::arg("o_out_stride"), nb::arg("lse_out"), nb::arg("lse_out_stride"),
        "merge_states on raw addresses; element strides in [batch, head, row, dim] order");
}

}  // namespace tileattn::python
