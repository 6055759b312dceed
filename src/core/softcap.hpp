// The soft cap of the scores (FlashAttention-2's `softcap`, Gemma 2's logit
// soft-capping): a natural-unit score x = scale * q.k becomes c * tanh(x / c).
//
// Units: the main loops keep scores in log2 units, s = L * x with
// L = log2(e). The capped score in log2 units is
//   L * c * tanh(x / c) = C * tanh(s / C),   C = c * L,
// the same form with the cap converted to log2 units (Problem::softcap_log2).
// The backward needs d(capped) / d(uncapped) = 1 - tanh^2(s / C), the same in
// either unit (both sides scale by L).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/exp2_poly.hpp"

namespace tileattn::detail {

// tanh(y) in fp32 within 2 ulp (checked against float64 on a dense grid in
// tests/core/softcap_test.cpp), branch-free so that a loop over it
// vectorizes with the including ISA's flags: below |y| = 0.625 an odd
// polynomial y + y^3 P(y^2) (least-squares fit on Chebyshev nodes, relative
// error 0.7 ulp), above it 1 - 2 / (2^(2|y| log2(e)) + 1) with the shared
// exp2 polynomial (no cancellation: tanh > 0.55 there). NaN stays NaN (it
// fails the |y| >= 0.625 test and takes the polynomial), +-inf gives +-1.
// About 0.5 ns per score with AVX-512 at D = 128 causal (a 13% overhead on
// the fp32 forward); docs/benchmarks.md has the cheaper, less accurate forms
// that were measured.
static inline float softcap_tanh(float y) {
  constexpr float kSplit = 0.625f;
  constexpr float kTwoLog2e = 2.0f * 1.4426950408889634f;
  constexpr float kP0 = -0.3333328068256378f, kP1 = 0.13331381976604462f, kP2 = -0.05373531952500343f,
                  kP3 = 0.020626291632652283f, kP4 = -0.005691985599696636f;
  const float a = std::fabs(y);
  const float u = y * y;
  const float p = (((kP4 * u + kP3) * u + kP2) * u + kP1) * u + kP0;
  const float small = y + y * u * p;
  // 2^v for v = 2|y| log2(e) in [0, 40] (tanh rounds to 1 beyond |y| = 9.01).
  float v = a * kTwoLog2e;
  v = v < 40.0f ? v : 40.0f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (v + kRound) - kRound;
  const float f = v - n;  // [-1/2, 1/2]
  using namespace exp2_poly;
  const float poly =
      1.0f + f * (kC1 + f * (kC2 + f * (kC3 + f * (kC4 + f * (kC5 + f * kC6)))));
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const float large = 1.0f - 2.0f / (poly * two_n + 1.0f);
  return a >= kSplit ? std::copysign(large, y) : small;
}

// s[0, n) := cap * tanh(s / cap) (cap > 0, in the scores' units); with
// `tanh_out`, tanh(s / cap) there too (the backward's derivative).
static inline void softcap_row(float* s, int64_t n, float cap, float* tanh_out) {
  const float inv_cap = 1.0f / cap;
  if (tanh_out) {
    for (int64_t c = 0; c < n; ++c) {
      const float t = softcap_tanh(s[c] * inv_cap);
      tanh_out[c] = t;
      s[c] = cap * t;
    }
    return;
  }
  for (int64_t c = 0; c < n; ++c) s[c] = cap * softcap_tanh(s[c] * inv_cap);
}

}  // namespace tileattn::detail
