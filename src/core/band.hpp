// The causal / sliding-window band, the one rule the library, the CLI's
// FLOP counts and baseline, the float64 reference and the C++ tests share:
// with offset = nk - nq (bottom-right alignment, as FlashAttention-2 and
// PyTorch's causal_lower_right), key j is visible to query i when
//   i + offset - left <= j <= i + offset + right.
// Public spelling: a window side of -1 is unbounded; causal clips the right
// side to 0 (causal with a window: the narrower right side). Helpers are
// `static inline` (as in problem.hpp) so that each ISA translation unit keeps
// its own copy.
#pragma once

#include <cstdint>

namespace tileattn::detail {

constexpr int64_t kUnbounded = int64_t{1} << 60;  // a window side of -1

struct Band {
  int64_t left = kUnbounded;
  int64_t right = kUnbounded;
};

// Keys (or query rows) [first, last).
struct KeyRange {
  int64_t first = 0, last = 0;
};

// The band of a causal flag and window (-1 = unbounded). A side wider than
// any sequence (validation allows up to INT64_MAX) is unbounded; clamping
// keeps i + offset -/+ side inside int64.
static inline Band make_band(bool causal, int64_t window_left, int64_t window_right) {
  Band band;
  band.left = window_left < 0 || window_left > kUnbounded ? kUnbounded : window_left;
  band.right = window_right < 0 || window_right > kUnbounded ? kUnbounded : window_right;
  if (causal && band.right > 0) band.right = 0;
  return band;
}

// Whether query i sees key j.
static inline bool band_keeps(const Band& band, int64_t offset, int64_t i, int64_t j) {
  return j >= i + offset - band.left && j <= i + offset + band.right;
}

// Keys of [0, nk) that any query row of [i_begin, i_end) may see.
static inline KeyRange band_keys(const Band& band, int64_t offset, int64_t nk, int64_t i_begin,
                                 int64_t i_end) {
  KeyRange r;
  r.first = i_begin + offset - band.left;
  if (r.first < 0) r.first = 0;
  r.last = i_end - 1 + offset + band.right + 1;
  if (r.last > nk) r.last = nk;
  if (r.last < r.first) r.last = r.first;
  return r;
}

// Visible (query, key) pairs of one (sequence, head) of nq queries and nk keys.
static inline int64_t band_pairs(const Band& band, int64_t nq, int64_t nk) {
  int64_t total = 0;
  for (int64_t i = 0; i < nq; ++i) {
    const KeyRange r = band_keys(band, nk - nq, nk, i, i + 1);
    total += r.last - r.first;
  }
  return total;
}

}  // namespace tileattn::detail
