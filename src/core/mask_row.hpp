// The mask step of a score tile, one row at a time: the score modifiers (soft
// cap, then band and mask tensor); shared by the forward and backward main
// loops so both see exactly the same scores and visible set.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/problem.hpp"
#include "core/sink.hpp"
#include "core/softcap.hpp"

namespace tileattn::detail {

// Whether a tile needs the mask step: a band-partial tile, a mask tensor, or
// a score modifier (soft cap, ALiBi: they change every score of every tile,
// fully visible ones too).
// x * factor, a finite x kept finite (clamped to +-FLT_MAX); infinities and
// NaN scale as they are. Scores and biases beyond FLT_MAX in log2 units then
// tie at the limit instead of overflowing (additive masks, and the softmax's
// huge scores on the bf16 rungs, mainloop.hpp).
static inline float scale_keeping_finite(float x, float factor) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const float scaled = x * factor;
  return std::fabs(x) <= kMax ? std::fmin(std::fmax(scaled, -kMax), kMax) : scaled;
}

static inline bool needs_mask_step(const Problem& p, bool band_partial) {
  return band_partial || p.args.mask.kind != MaskSpec::Kind::none || p.softcap_log2 > 0.0f ||
         p.args.alibi_slopes != nullptr;
}

// s[0, n) holds the scores (log2 units, scaled; unscaled where the softmax
// takes the scale, deferred_score_scale, which only -inf then reach) of query row i of sequence
// `seq` against keys j0 .. j0 + n - 1, for query head `head` of batch
// `batch`. Caps them (Problem::softcap_log2 > 0; with `softcap_tanh`, the
// tanh of each is stored there for the backward), adds the ALiBi bias, hides
// the keys outside the band (only when the tile is partial for the band) and
// applies the boolean or additive mask tensor, in FlashAttention-2's order:
// cap first, biases and masks after.
static inline void mask_score_row(float* s, int64_t n, const Problem& p, const Sequence& seq,
                                  int64_t batch, int64_t head, int64_t i, int64_t j0,
                                  bool band_partial, float* softcap_tanh = nullptr) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  if (p.softcap_log2 > 0.0f) softcap_row(s, n, p.softcap_log2, softcap_tanh);
  if (p.args.alibi_slopes) {
    // -slope * |i + offset - j| in log2 units. Distances are exact in fp32
    // below 2^24 keys.
    const float slope = p.args.alibi_slopes[batch * p.args.alibi_batch_stride + head] * kLog2e;
    const float d0 = static_cast<float>(i + seq.offset - j0);
    for (int64_t c = 0; c < n; ++c) s[c] -= slope * std::fabs(d0 - static_cast<float>(c));
  }
  if (band_partial) {
    // Visible columns of this row form one interval [lo, hi).
    const int64_t lo = min64(n, max64(0, i + seq.offset - p.band.left - j0));
    const int64_t hi = max64(lo, min64(n, i + seq.offset + p.band.right + 1 - j0));
    for (int64_t c = 0; c < lo; ++c) s[c] = kMinusInf;
    for (int64_t c = hi; c < n; ++c) s[c] = kMinusInf;
  }
  const MaskSpec& mask = p.args.mask;
  if (mask.kind == MaskSpec::Kind::none) return;
  const auto& ms = mask.stride;
  const int64_t row_offset = batch * ms[0] + head * ms[1] + i * ms[2];
  if (mask.kind == MaskSpec::Kind::boolean) {
    const uint8_t* keep = static_cast<const uint8_t*>(mask.data) + row_offset;
    for (int64_t c = 0; c < n; ++c)
      if (!keep[(j0 + c) * ms[3]]) s[c] = kMinusInf;
  } else {
    // A finite bias stays finite in log2 units: bias * log2(e) overflows to
    // -inf for |bias| > FLT_MAX / log2(e) ~ 2.36e38, and a row of
    // numpy.finfo(float32).min (a common "masked" value) would then see no
    // key at all, where naive attention (and the float64 reference) average
    // its keys uniformly. Clamped to +-FLT_MAX such a row stays uniform. Two
    // different biases beyond 2.36e38 in one row become equal: both are
    // "infinitely" far from every ordinary score, only their tie changes.
    const float* bias = static_cast<const float*>(mask.data) + row_offset;
    for (int64_t c = 0; c < n; ++c) s[c] += scale_keeping_finite(bias[(j0 + c) * ms[3]], kLog2e);
  }
}

}  // namespace tileattn::detail
