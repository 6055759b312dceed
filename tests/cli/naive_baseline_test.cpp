// The bench's baseline must compute attention (and its gradients) correctly,
// or its timings mean nothing: compared here with the library on a small
// GQA causal problem.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cli/naive_baseline.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/backward.hpp"

namespace tileattn::cli {
namespace {

double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1e-6, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::abs(b[i])));
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
  }
  return diff / scale;
}

// V's head dim `dv` (the same as Q/K's 16, or another).
void expect_baseline_matches_library(int64_t dv_dim) {
  const OpenBlas& blas = load_openblas();
  ASSERT_TRUE(blas.loaded) << blas.error;
  const BaselineShape s{2, 4, 2, 40, 50, 16, dv_dim};
  const int64_t q_elems = s.batch * s.heads * s.seqlen_q * s.head_dim;
  const int64_t k_elems = s.batch * s.kv_heads * s.seqlen_k * s.head_dim;
  const int64_t v_elems = s.batch * s.kv_heads * s.seqlen_k * dv_dim;
  const int64_t o_elems = s.batch * s.heads * s.seqlen_q * dv_dim;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1, 1);
  auto random = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = uniform(rng);
    return x;
  };
  const std::vector<float> q = random(q_elems), k = random(k_elems), v = random(v_elems), d_o = random(o_elems);
  const float scale = 0.25f;
  // Causal and a left window, so that some keys and the band are exercised.
  const detail::Band band = detail::make_band(true, 20, -1);

  ForwardArgs fa;
  fa.shape = {s.batch, s.heads, s.kv_heads, s.seqlen_q, s.seqlen_k, s.head_dim, dv_dim};
  std::vector<float> o(static_cast<size_t>(o_elems)), lse(static_cast<size_t>(s.batch * s.heads * s.seqlen_q));
  fa.q = {q.data(), dense_strides(Layout::bhsd, s.batch, s.heads, s.seqlen_q, s.head_dim)};
  fa.k = {k.data(), dense_strides(Layout::bhsd, s.batch, s.kv_heads, s.seqlen_k, s.head_dim)};
  fa.v = {v.data(), dense_strides(Layout::bhsd, s.batch, s.kv_heads, s.seqlen_k, dv_dim)};
  fa.o = {o.data(), dense_strides(Layout::bhsd, s.batch, s.heads, s.seqlen_q, dv_dim)};
  fa.lse = lse.data();
  fa.lse_stride = {s.heads * s.seqlen_q, s.seqlen_q, 1};
  fa.mask.causal = true;
  fa.mask.window_left = 20;
  fa.scale = scale;
  attention_forward(fa);

  std::vector<float> o_naive(static_cast<size_t>(o_elems));
  naive_attention(blas, s, band, scale, 2, q.data(), k.data(), v.data(), o_naive.data());
  EXPECT_LT(max_relative_difference(o_naive, o), 1e-5);

  std::vector<float> dq(static_cast<size_t>(q_elems)), dk(static_cast<size_t>(k_elems)), dv(static_cast<size_t>(v_elems));
  BackwardArgs ba;
  ba.forward = fa;
  ba.o = {o.data(), fa.o.stride};
  ba.d_o = {d_o.data(), fa.o.stride};
  ba.lse = lse.data();
  ba.lse_stride = fa.lse_stride;
  ba.dq = {dq.data(), fa.q.stride};
  ba.dk = {dk.data(), fa.k.stride};
  ba.dv = {dv.data(), fa.v.stride};
  attention_backward(ba);
  std::vector<float> dq_naive(static_cast<size_t>(q_elems)), dk_naive(static_cast<size_t>(k_elems), 0.0f), dv_naive(static_cast<size_t>(v_elems), 0.0f);
  naive_attention_backward(blas, s, band, scale, 2, q.data(), k.data(), v.data(), o_naive.data(), d_o.data(),
                           dq_naive.data(), dk_naive.data(), dv_naive.data());
  EXPECT_LT(max_relative_difference(dq_naive, dq), 1e-4);
  EXPECT_LT(max_relative_difference(dk_naive, dk), 1e-4);
  EXPECT_LT(max_relative_difference(dv_naive, dv), 1e-4);
}

TEST(cliBaseline, MatchesTheLibraryForwardAndBackward) { expect_baseline_matches_library(16); }

// V's head dim other than Q/K's (DeepSeek MLA's shapes, small).
TEST(cliBaseline, MatchesTheLibraryWithValueHeadDim) {
  expect_baseline_matches_library(24);
  expect_baseline_matches_library(8);
}

}  // namespace
}  // namespace tileattn::cli
