#include "cli/naive_baseline.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "core/thread_pool.hpp"

namespace tileattn::cli {

void naive_attention(const OpenBlas& blas, const BaselineShape& s, const BandMask& band, float scale,
                     int threads, const float* q, const float* k, const float* v, float* o) {
  const int64_t nq = s.seqlen_q, nk = s.seqlen_k, d = s.head_dim;
  const int64_t group = s.heads / s.kv_heads;
  std::vector<float> scores(size_t(nq * nk));  // (Nq, Nk): the matrix FlashAttention avoids
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const float* qh = q + (b * s.heads + h) * nq * d;
      const float* kh = k + (b * s.kv_heads + h / group) * nk * d;
      const float* vh = v + (b * s.kv_heads + h / group) * nk * d;
      float* oh = o + (b * s.heads + h) * nq * d;
      blas.sgemm(OpenBlas::kRowMajor, OpenBlas::kNoTrans, OpenBlas::kTrans, int(nq), int(nk), int(d),
                 scale, qh, int(d), kh, int(d), 0.0f, scores.data(), int(nk));
      detail::parallel_for(nq, threads, [&](int64_t i, int) {
        float* row = scores.data() + i * nk;
        int64_t first, last;
        band.keys(i, nq, nk, first, last);
        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = first; j < last; ++j) row_max = std::max(row_max, row[j]);
        float sum = 0;
        for (int64_t j = 0; j < nk; ++j) {
          const float p = j >= first && j < last ? std::exp(row[j] - row_max) : 0.0f;
          row[j] = p;
          sum += p;
        }
        const float inv = sum > 0 ? 1.0f / sum : 0.0f;  // a row with no visible key gives zeros
        for (int64_t j = 0; j < nk; ++j) row[j] *= inv;
      });
      blas.sgemm(OpenBlas::kRowMajor, OpenBlas::kNoTrans, OpenBlas::kNoTrans, int(nq), int(d), int(nk),
                 1.0f, scores.data(), int(nk), vh, int(d), 0.0f, oh, int(d));
    }
}

}  // namespace tileattn::cli
