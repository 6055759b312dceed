// The few-rows (decode) tile products of the AVX-512 path for the emulated
// AVX-512 Kernels. On AVX-512 CPUs avx512::Kernels derives from the AVX2
// products of src/isa/avx2/few_rows_kernels.hpp, which run natively here; but
// the emulated translation units must not include <immintrin.h> (its macro
// forms of the AVX-512 intrinsics at -O0, and its __m256i, would collide with
// the emulation's names). So the same header is compiled in a translation unit
// of its own with -mavx2 -mfma -mf16c (native_few_rows_kernels.cpp), and this
// struct, which the emulated Kernels derives from, forwards to it.
#pragma once

#include <cstdint>

#include "core/row_prefetch.hpp"
#include "tileattn/types.hpp"

namespace tileattn::detail::avx512_emulated_native {

struct NativeFewRowsKernels {
  // The products' own limit; native_few_rows_kernels.cpp checks it is theirs.
  static constexpr int kFewRowsMax = 8;

  // Same contracts as FewRowsKernels in src/isa/avx2/few_rows_kernels.hpp.
  static void few_rows_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                              const void* const* key_rows, DType dtype, int64_t stride, float* s,
                              int64_t lds, const RowsToPrefetch& ahead = {});
  static void few_rows_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                  const void* const* value_rows, DType dtype, int64_t stride,
                                  float* acc, int64_t ldacc);

  // Calls of either product since the start of the process, so that a test
  // can tell that the main loop took the few-rows path and not the packed one.
  static int64_t calls();
};
// They run only where isa_available(Isa::avx2) (AVX2, FMA and F16C).

}  // namespace tileattn::detail::avx512_emulated_native
