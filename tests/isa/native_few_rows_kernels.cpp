// src/isa/avx2/few_rows_kernels.hpp compiled natively (tests.cmake gives this
// file -mavx2 -mfma -mf16c) in a namespace of its own, behind the plain
// declarations of native_few_rows_kernels.hpp that the emulated AVX-512
// Kernels derive from. See that header for why it is a separate file.
#include <immintrin.h>

#include <atomic>
#include <cstdint>

#include "core/half.hpp"
#include "isa/native_few_rows_kernels.hpp"
#include "tileattn/types.hpp"

namespace tileattn::detail::avx512_emulated_native {

#include "isa/avx2/few_rows_kernels.hpp"

static_assert(NativeFewRowsKernels::kFewRowsMax == FewRowsKernels::kFewRowsMax,
              "native_few_rows_kernels.hpp must state the products' own row limit");

namespace {
std::atomic<int64_t> call_count{0};
}  // namespace

void NativeFewRowsKernels::few_rows_scores(int64_t m, int64_t n, int64_t d, const float* q,
                                           int64_t ldq, const void* const* key_rows, DType dtype,
                                           int64_t stride, float* s, int64_t lds,
                                           const RowsToPrefetch& ahead) {
  call_count.fetch_add(1, std::memory_order_relaxed);
  FewRowsKernels::few_rows_scores(m, n, d, q, ldq, key_rows, dtype, stride, s, lds, ahead);
}

void NativeFewRowsKernels::few_rows_accumulate(int64_t m, int64_t n, int64_t d, const float* p,
                                               int64_t ldp, const void* const* value_rows,
                                               DType dtype, int64_t stride, float* acc,
                                               int64_t ldacc) {
  call_count.fetch_add(1, std::memory_order_relaxed);
  FewRowsKernels::few_rows_accumulate(m, n, d, p, ldp, value_rows, dtype, stride, acc, ldacc);
}

int64_t NativeFewRowsKernels::calls() { return call_count.load(std::memory_order_relaxed); }

}  // namespace tileattn::detail::avx512_emulated_native
