// The AVX-512 FMA few-rows products of an fp8 e4m3 cache on AVX512-VBMI byte
// permutes (few_rows_vbmi.hpp). This file alone of the directory gets
// -mavx512vbmi (CMakeLists.txt), in a namespace of its own, so no other
// AVX-512 code can pick up VBMI instructions; FewRows16Kernels calls these
// only where CPUID has VBMI.
#define TILEATTN_AVX512_NAMESPACE avx512_vbmi
#include "isa/avx512/kernels.hpp"

namespace tileattn::detail {

void few_rows_scores_e4m3(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                          const void* const* key_rows, float* s, int64_t lds, const RowsToPrefetch& ahead) {
  avx512_vbmi::FewRows16Kernels::few_rows_scores(m, n, d, q, ldq, key_rows, DType::f8_e4m3, 1, s, lds, ahead);
}

void few_rows_accumulate_e4m3(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                              const void* const* value_rows, float* acc, int64_t ldacc,
                              const RowsToPrefetch& next) {
  avx512_vbmi::FewRows16Kernels::few_rows_accumulate(m, n, d, p, ldp, value_rows, DType::f8_e4m3, 1, acc, ldacc,
                                                     next);
}

}  // namespace tileattn::detail
