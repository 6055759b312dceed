// See native_avx512_few_rows.hpp; tests.cmake gives this file the AVX-512 flags.
#define TILEATTN_AVX512_NAMESPACE avx512_native_test
#include "isa/avx512/kernels.hpp"

#include "isa/native_avx512_few_rows.hpp"

namespace tileattn::testing::native_avx512 {

using Products = detail::avx512_native_test::FewRows16Kernels;

void few_rows_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq, const void* const* key_rows,
                     DType dtype, float* s, int64_t lds, bool fp16_route) {
  if (!fp16_route) return Products::few_rows_scores(m, n, d, q, ldq, key_rows, dtype, 1, s, lds);
  detail::avx512_native_test::few_rows::with_type_and_rows(dtype, m, [&]<DType kType, int M>() {
    detail::avx512_native_test::few_rows16::scores<kType, M>(n, d, q, ldq, key_rows, s, lds, {});
  });
}

void few_rows_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                         const void* const* value_rows, DType dtype, float* acc, int64_t ldacc, bool fp16_route) {
  if (!fp16_route) return Products::few_rows_accumulate(m, n, d, p, ldp, value_rows, dtype, 1, acc, ldacc);
  detail::avx512_native_test::few_rows::with_type_and_rows(dtype, m, [&]<DType kType, int M>() {
    detail::avx512_native_test::few_rows16::accumulate<kType, M>(n, d, p, ldp, value_rows, acc, ldacc);
  });
}

}  // namespace tileattn::testing::native_avx512
