// Portable tile products for a few stacked query rows (decode), same contract
// as src/isa/avx2/few_rows_kernels.hpp: K and V rows are read from the
// source through a row table and converted element by element, no packing.
// Each loaded element is used for all the rows before the next one is read.
#pragma once

#include <cstdint>

#include "core/half.hpp"
#include "tileattn/types.hpp"

namespace tileattn::detail::generic {

struct FewRowsKernels {
  static constexpr int kFewRowsMax = 8;

  // s[r * lds + c] = sum_t q[r * ldq + t] * key_rows[c][t * stride], r < m <= 8, c < n, t < d.
  static void few_rows_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                              const void* const* key_rows, DType dtype, int64_t stride, float* s,
                              int64_t lds) {
    for (int64_t c = 0; c < n; ++c) {
      float sum[kFewRowsMax] = {};
      for (int64_t t = 0; t < d; ++t) {
        const float k = load_element(key_rows[c], int(dtype), t * stride);
        for (int64_t r = 0; r < m; ++r) sum[r] += q[r * ldq + t] * k;
      }
      for (int64_t r = 0; r < m; ++r) s[r * lds + c] = sum[r];
    }
  }

  // acc[r * ldacc + t] += sum_c p[r * ldp + c] * value_rows[c][t * stride], r < m <= 8, c < n, t < d.
  static void few_rows_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                  const void* const* value_rows, DType dtype, int64_t stride,
                                  float* acc, int64_t ldacc) {
    for (int64_t c = 0; c < n; ++c)
      for (int64_t t = 0; t < d; ++t) {
        const float v = load_element(value_rows[c], int(dtype), t * stride);
        for (int64_t r = 0; r < m; ++r) acc[r * ldacc + t] += p[r * ldp + c] * v;
      }
  }
};

}  // namespace tileattn::detail::generic
