// The fp8 e4m3 decode products on AVX512-VBMI byte permutes and vdpbf16ps
// (few_rows_dot.hpp: the scores, and P V with P rounded to bf16; P V at fp32
// precision is the AVX-512 rung's, isa/avx512/few_rows_vbmi.cpp), and the
// packers of fp8 K/V tiles on the same permutes (bf16_kernels.hpp). This
// file alone gets -mavx512vbmi on top of the avx512bf16 flags (CMakeLists.txt),
// in a namespace of its own, so no other code of the rung can pick up VBMI
// instructions; the rung calls these only where CPUID has VBMI.
#define TILEATTN_AVX512_NAMESPACE avx512bf16_vbmi
#include "isa/avx512bf16/bf16_kernels.hpp"

namespace tileattn::detail {

void few_rows_dot_scores_e4m3(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                              const void* const* key_rows, float scale, float* s, int64_t lds,
                              const RowsToPrefetch& ahead) {
  using namespace avx512bf16_vbmi;
  auto run = [&]<DType kType, int M>() {
    few_rows_dot::scores<kType, M>(n, d, q, ldq, key_rows, scale, s, lds, ahead);
  };
  few_rows::with_rows<DType::f8_e4m3>(m, run);
}

void few_rows_dot_accumulate_e4m3(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                  const void* const* value_rows, float* acc, int64_t ldacc,
                                  const RowsToPrefetch& next) {
  using namespace avx512bf16_vbmi;
  const NextRows ahead = NextRows::values_of(next);
  few_rows_dot::with_rows(m, [&]<int M>() {
    few_rows_dot::accumulate_bf16_probabilities<M, DType::f8_e4m3>(n, d, p, ldp, value_rows, acc, ldacc, ahead);
  });
}

void bf16_pack_k_e4m3(const void* const* rows, int64_t n, int64_t d, uint16_t* dst, int64_t k) {
  using namespace avx512bf16_vbmi;
  Bf16Packing::bf16_pack_k(rows, n, d, 1, dst, k, E4m3PermuteRows{});
}

void bf16_pack_v_e4m3(const void* const* rows, int64_t n, int64_t d, uint16_t* dst, int64_t kv_pad) {
  using namespace avx512bf16_vbmi;
  Bf16Packing::bf16_pack_v(rows, n, d, 1, dst, kv_pad, E4m3PermuteRows{});
}

}  // namespace tileattn::detail
