// The mask step of a score tile, one row at a time; shared by the forward and
// backward main loops so both see exactly the same visible set.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/problem.hpp"

namespace tileattn::detail {

// s[0, n) holds the scores (log2 units) of query row i of sequence `seq`
// against keys j0 .. j0 + n - 1, for query head `head` of batch `batch`.
// Hides the keys outside the band (only when the tile is partial for the
// band) and applies the boolean or additive mask tensor.
static inline void mask_score_row(float* s, int64_t n, const Problem& p, const Sequence& seq,
                                  int64_t batch, int64_t head, int64_t i, int64_t j0,
                                  bool band_partial) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
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
    constexpr float kMax = std::numeric_limits<float>::max();
    const float* bias = static_cast<const float*>(mask.data) + row_offset;
    for (int64_t c = 0; c < n; ++c) {
      const float b = bias[(j0 + c) * ms[3]];
      const float scaled = b * kLog2e;
      s[c] += std::fabs(b) <= kMax ? std::fmin(std::fmax(scaled, -kMax), kMax) : scaled;
    }
  }
}

}  // namespace tileattn::detail
