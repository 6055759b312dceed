// The (query, key) pairs a causal / sliding-window mask leaves visible, with
// the bottom-right alignment of MaskSpec: key j is visible to query i when
// i + (nk - nq) - left <= j <= i + (nk - nq) + right.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tileattn::cli {

struct BandMask {
  int64_t left = -1, right = -1;  // inclusive; -1 = unbounded (causal: right = 0)

  static BandMask from(bool causal, int64_t window_left, int64_t window_right) {
    BandMask b{window_left, window_right};
    if (causal) b.right = b.right < 0 ? 0 : std::min<int64_t>(b.right, 0);
    return b;
  }
  // Visible keys [first, last) of query i.
  void keys(int64_t i, int64_t nq, int64_t nk, int64_t& first, int64_t& last) const {
    const int64_t center = i + nk - nq;
    first = left < 0 ? 0 : std::max<int64_t>(0, center - left);
    last = right < 0 ? nk : std::min<int64_t>(nk, center + right + 1);
    if (last < first) last = first;
  }
  // Visible pairs of one (batch, head): exact, one query row at a time.
  int64_t pairs(int64_t nq, int64_t nk) const {
    int64_t total = 0;
    for (int64_t i = 0; i < nq; ++i) {
      int64_t first, last;
      keys(i, nq, nk, first, last);
      total += last - first;
    }
    return total;
  }
};

}  // namespace tileattn::cli
