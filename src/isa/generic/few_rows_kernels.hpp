// Portable tile products for a few stacked query rows (decode), same contract
// as src/isa/avx2/few_rows_kernels.hpp: K and V rows are read from the
// source through a row table, no tile is packed. Each row is converted once
// into a small fp32 buffer (the dtype switch outside the element loop) and
// used for all the stacked rows; the loops are written so that the compiler
// can vectorize them without reassociating any sum (eight interleaved
// partial sums for the dot products, independent columns for P V).
#pragma once

#include <cstdint>

#include "core/half.hpp"
#include "core/row_prefetch.hpp"
#include "tileattn/types.hpp"

namespace tileattn::detail::generic {

struct FewRowsKernels {
  static constexpr int kFewRowsMax = 8;

  // s[r * lds + c] = sum_t q[r * ldq + t] * key_rows[c][t * stride], r < m <= 8, c < n, t < d;
  // prefetches the rows of `ahead` on the way (one K and one V row per key).
  static void few_rows_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                              const void* const* key_rows, DType dtype, int64_t stride, float* s,
                              int64_t lds, const RowsToPrefetch& ahead = {}) {
    float k[tileattn::kMaxHeadDim];  // (head_dim,)
    const int64_t d8 = d / 8 * 8;
    // Prefetch contiguous rows only: an element stride may be negative or so
    // large that d * stride overflows (head_dim 1 allows any stride; found by
    // fuzz_kv_cache under UBSan).
    const int64_t row_bytes = stride == 1 ? d * int64_t(dtype_size(dtype)) : 0;
    for (int64_t c = 0; c < n; ++c) {
      prefetch_rows<false>(ahead, c, c + 1, row_bytes);
      to_float_row(key_rows[c], dtype, stride, d, k);
      for (int64_t r = 0; r < m; ++r) {
        const float* qr = q + r * ldq;
        float part[8] = {};
        for (int64_t t = 0; t < d8; t += 8)
          for (int l = 0; l < 8; ++l) part[l] += qr[t + l] * k[t + l];
        float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        for (int64_t t = d8; t < d; ++t) sum += qr[t] * k[t];
        s[r * lds + c] = sum;
      }
    }
  }

  // acc[r * ldacc + t] += sum_c p[r * ldp + c] * value_rows[c][t * stride], r < m <= 8, c < n, t < d.
  static void few_rows_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                  const void* const* value_rows, DType dtype, int64_t stride,
                                  float* acc, int64_t ldacc) {
    float v[tileattn::kMaxValueHeadDim];  // (v_head_dim,)
    for (int64_t c = 0; c < n; ++c) {
      to_float_row(value_rows[c], dtype, stride, d, v);
      for (int64_t r = 0; r < m; ++r) {
        const float pr = p[r * ldp + c];
        float* out = acc + r * ldacc;
        for (int64_t t = 0; t < d; ++t) out[t] += pr * v[t];
      }
    }
  }

 private:
  static void to_float_row(const void* src, DType dtype, int64_t stride, int64_t d, float* dst) {
    switch (dtype) {
      case DType::f32:
        for (int64_t t = 0; t < d; ++t) dst[t] = static_cast<const float*>(src)[t * stride];
        break;
      case DType::f16:
        for (int64_t t = 0; t < d; ++t) dst[t] = f16_to_float(static_cast<const uint16_t*>(src)[t * stride]);
        break;
      case DType::bf16:
        for (int64_t t = 0; t < d; ++t) dst[t] = bf16_to_float(static_cast<const uint16_t*>(src)[t * stride]);
        break;
      case DType::i8:
        for (int64_t t = 0; t < d; ++t) dst[t] = float(static_cast<const int8_t*>(src)[t * stride]);
        break;
      case DType::f8_e4m3:
        for (int64_t t = 0; t < d; ++t) dst[t] = f8e4m3_to_float(static_cast<const uint8_t*>(src)[t * stride]);
        break;
    }
  }
};

}  // namespace tileattn::detail::generic
