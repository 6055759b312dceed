// The mask step of a score tile, one row at a time: the score modifiers (soft
// cap, then band and mask tensor); shared by the forward and backward main
// loops so both see exactly the same scores and visible set.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
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

// `mask_tensor`: the tile needs the mask tensor (false for a tile a boolean
// mask keeps whole, boolean_mask_tile).
static inline bool needs_mask_step(const Problem& p, bool band_partial, bool mask_tensor = true) {
  return band_partial || (mask_tensor && p.args.mask.kind != MaskSpec::Kind::none) || p.softcap_log2 > 0.0f ||
         p.args.alibi_slopes != nullptr;
}

// What a boolean mask does to a whole tile: keys [j0, j1) against rows
// [i0, i1) of query heads [h0, h1) of sequence `batch`. `hidden` (every entry
// False): the tile adds nothing to any row, and the float64 reference does
// not even read its keys and values, so the forward skips it (no K/V
// packing, no products). `visible` (every entry kept): the tensor changes no
// score, and the mask step leaves it out. `partial` otherwise, and for any
// mask that is not boolean (an additive -inf is added to the score by the
// reference, so a NaN score there stays NaN). Scans row by row, eight keys a
// word (branch-free within a row), stops once the tile is known partial;
// heads and rows that a stride of 0 repeats are read once.
// Measured (Intel Xeon model 167, B1 H8 N2048 D128, 2 threads, quiet, in
// one process, bench/mask_tiles.py): a boolean causal mask [N, N]
// took 1.92x is_causal's time before (fp32: 63.5 against 33.1 ms), 1.14-1.19x
// after (fp32), 1.3-1.35x (bf16: 9.6-10.1 against 7.1-7.8 ms; no mask 12.2);
// with 512 left-padding keys hidden too, 0.72-0.86x is_causal's time.
enum class MaskTile { hidden, partial, visible };
static inline MaskTile boolean_mask_tile(const Problem& p, int64_t batch, int64_t h0, int64_t h1, int64_t i0,
                                         int64_t i1, int64_t j0, int64_t j1) {
  const MaskSpec& mask = p.args.mask;
  if (mask.kind != MaskSpec::Kind::boolean || j1 <= j0) return MaskTile::partial;
  const auto& ms = mask.stride;
  if (ms[1] == 0) h1 = min64(h1, h0 + 1);
  if (ms[2] == 0) i1 = min64(i1, i0 + 1);
  const int64_t n = j1 - j0;
  constexpr uint64_t kOnes = 0x0101010101010101ull, kHighs = 0x8080808080808080ull;
  bool kept = false, dropped = false;
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t i = i0; i < i1; ++i) {
      const uint8_t* keep = static_cast<const uint8_t*>(mask.data) + batch * ms[0] + h * ms[1] + i * ms[2] + j0 * ms[3];
      uint64_t any = 0, zero_byte = 0;
      int64_t c = 0;
      if (ms[3] == 1) {
        for (; c + 8 <= n; c += 8) {
          uint64_t word;
          std::memcpy(&word, keep + c, sizeof word);
          any |= word;
          zero_byte |= (word - kOnes) & ~word & kHighs;  // the high bit of each zero byte (and maybe above one)
        }
      }
      for (; c < n; ++c) {
        any |= keep[c * ms[3]];
        zero_byte |= keep[c * ms[3]] == 0;
      }
      kept = kept || any != 0;
      dropped = dropped || zero_byte != 0;
      if (kept && dropped) return MaskTile::partial;
    }
  return kept ? MaskTile::visible : MaskTile::hidden;
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
                                  bool band_partial, float* softcap_tanh = nullptr, bool mask_tensor = true) {
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
  if (mask.kind == MaskSpec::Kind::none || !mask_tensor) return;
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
