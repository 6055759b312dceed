// The bf16 kernel sets that the kernel-level tests run (bf16_kernel_sets.hpp):
// the emulated vdpbf16ps and AMX kernels on every machine, the native ones
// where the CPU has the instructions (bf16_native_gate.hpp), and a
// 64-byte-aligned buffer for the pair layouts' aligned stores.
#pragma once

#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "isa/bf16_kernel_sets.hpp"
#include "isa/bf16_native_gate.hpp"

namespace tileattn::testing {

struct Bf16KernelParam {
  const char* name;
  Isa isa;  // Isa::avx512bf16 (Bf16DotKernels) or Isa::amx (AmxKernels)
  bool native;
};

inline void PrintTo(const Bf16KernelParam& p, std::ostream* os) { *os << p.name; }

inline std::vector<Bf16KernelParam> bf16_kernel_params() {
  return {{"emulated_dot", Isa::avx512bf16, false},
          {"emulated_amx", Isa::amx, false},
          {"native_dot", Isa::avx512bf16, true},
          {"native_amx", Isa::amx, true}};
}

inline Bf16KernelSet bf16_kernel_set(const Bf16KernelParam& p) {
  if (p.native) return p.isa == Isa::amx ? native_amx_kernels() : native_dot_kernels();
  return p.isa == Isa::amx ? emulated_amx_kernels() : emulated_dot_kernels();
}

inline std::string bf16_kernel_param_name(const ::testing::TestParamInfo<Bf16KernelParam>& info) {
  return info.param.name;
}

// `count` elements of T, 64-byte aligned, filled with `fill`.
template <class T>
struct AlignedBuffer {
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> data;
  size_t count;
  AlignedBuffer(size_t n, T fill) : count(n) {
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    data.reset(static_cast<T*>(std::aligned_alloc(64, bytes ? bytes : 64)));
    for (size_t i = 0; i < n; ++i) data[i] = fill;
  }
  T* get() { return data.get(); }
  T& operator[](size_t i) { return data[i]; }
};

}  // namespace tileattn::testing

// In a test of the fixture: the kernel set of the parameter, or skip / fail
// where it is native and cannot run here.
#define TILEATTN_BF16_KERNELS(set)                                     \
  if (GetParam().native) {                                             \
    TILEATTN_REQUIRE_NATIVE(GetParam().isa);                           \
  }                                                                    \
  const ::tileattn::testing::Bf16KernelSet set = ::tileattn::testing::bf16_kernel_set(GetParam())
