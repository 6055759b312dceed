#include "cli/naive_baseline.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/thread_pool.hpp"

namespace tileattn::cli {

namespace {

// scores (Nq, Nk) = scale * Q K^T, then each row softmaxed in place over its
// visible keys (rows with none become zeros).
void probabilities(const OpenBlas& blas, int64_t nq, int64_t nk, int64_t d, const detail::Band& band,
                   float scale, int threads, const float* qh, const float* kh, float* scores) {
  blas.sgemm(OpenBlas::kRowMajor, OpenBlas::kNoTrans, OpenBlas::kTrans, int(nq), int(nk), int(d), scale, qh,
             int(d), kh, int(d), 0.0f, scores, int(nk));
  detail::parallel_for(nq, threads, [&](int64_t i, int) {
    float* row = scores + i * nk;
    const detail::KeyRange keys = detail::band_keys(band, nk - nq, nk, i, i + 1);
    const int64_t first = keys.first, last = keys.last;
    float row_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = first; j < last; ++j) row_max = std::max(row_max, row[j]);
    float sum = 0;
    for (int64_t j = 0; j < nk; ++j) {
      const float p = j >= first && j < last ? std::exp(row[j] - row_max) : 0.0f;
      row[j] = p;
      sum += p;
    }
    const float inv = sum > 0 ? 1.0f / sum : 0.0f;
    for (int64_t j = 0; j < nk; ++j) row[j] *= inv;
  });
}

}  // namespace

void naive_attention(const OpenBlas& blas, const BaselineShape& s, const detail::Band& band, float scale,
                     int threads, const float* q, const float* k, const float* v, float* o) {
  const int64_t nq = s.seqlen_q, nk = s.seqlen_k, d = s.head_dim, dv = s.v_head_dim > 0 ? s.v_head_dim : d;
  const int64_t group = s.heads / s.kv_heads;
  std::vector<float> scores(size_t(nq * nk));  // (Nq, Nk): the matrix FlashAttention avoids
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kv = b * s.kv_heads + h / group;
      probabilities(blas, nq, nk, d, band, scale, threads, q + (b * s.heads + h) * nq * d, k + kv * nk * d,
                    scores.data());
      blas.sgemm(OpenBlas::kRowMajor, OpenBlas::kNoTrans, OpenBlas::kNoTrans, int(nq), int(dv), int(nk), 1.0f,
                 scores.data(), int(nk), v + kv * nk * dv, int(dv), 0.0f, o + (b * s.heads + h) * nq * dv, int(dv));
    }
}

void naive_attention_backward(const OpenBlas& blas, const BaselineShape& s, const detail::Band& band,
                              float scale, int threads, const float* q, const float* k, const float* v,
                              const float* o, const float* d_o, float* dq, float* dk, float* dv) {
  const int64_t nq = s.seqlen_q, nk = s.seqlen_k, d = s.head_dim, dv_dim = s.v_head_dim > 0 ? s.v_head_dim : d;
  const int64_t group = s.heads / s.kv_heads;
  std::vector<float> p(size_t(nq * nk)), dp(size_t(nq * nk));  // (Nq, Nk) each
  using B = OpenBlas;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t qo = (b * s.heads + h) * nq * d, kvo = (b * s.kv_heads + h / group) * nk * d;
      const int64_t oo = (b * s.heads + h) * nq * dv_dim, vo = (b * s.kv_heads + h / group) * nk * dv_dim;  // Dv wide
      probabilities(blas, nq, nk, d, band, scale, threads, q + qo, k + kvo, p.data());
      // dV (Nk, Dv) += P^T dO;  dP (Nq, Nk) = dO V^T
      blas.sgemm(B::kRowMajor, B::kTrans, B::kNoTrans, int(nk), int(dv_dim), int(nq), 1.0f, p.data(), int(nk),
                 d_o + oo, int(dv_dim), 1.0f, dv + vo, int(dv_dim));
      blas.sgemm(B::kRowMajor, B::kNoTrans, B::kTrans, int(nq), int(nk), int(dv_dim), 1.0f, d_o + oo, int(dv_dim),
                 v + vo, int(dv_dim), 0.0f, dp.data(), int(nk));
      // dS = P o (dP - D), D_i = dO_i . O_i; kept in dp.
      detail::parallel_for(nq, threads, [&](int64_t i, int) {
        float delta = 0;
        for (int64_t c = 0; c < dv_dim; ++c) delta += d_o[oo + i * dv_dim + c] * o[oo + i * dv_dim + c];
        float* ds = dp.data() + i * nk;
        const float* pr = p.data() + i * nk;
        for (int64_t j = 0; j < nk; ++j) ds[j] = pr[j] * (ds[j] - delta);
      });
      // dQ (Nq, D) = scale dS K;  dK (Nk, D) += scale dS^T Q
      blas.sgemm(B::kRowMajor, B::kNoTrans, B::kNoTrans, int(nq), int(d), int(nk), scale, dp.data(), int(nk),
                 k + kvo, int(d), 0.0f, dq + qo, int(d));
      blas.sgemm(B::kRowMajor, B::kTrans, B::kNoTrans, int(nk), int(d), int(nq), scale, dp.data(), int(nk),
                 q + qo, int(d), 1.0f, dk + kvo, int(d));
    }
}

}  // namespace tileattn::cli
