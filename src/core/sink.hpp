// Attention sinks (ForwardArgs::sinks): one logit per query head that joins
// each row's softmax denominator and carries no value. They are folded into
// a row once, after its keys, into the online softmax's (max, sum) pair, so
// they cost one exp2 per row and nothing per tile.
#pragma once

#include <cmath>

namespace tileattn::detail {

// `max` and `sum` describe a row as sum = sum_j exp2(s_j - max) (log2 units;
// max = -inf and sum = 0 for a row that saw no key, NaN for a NaN row).
// Adds the term exp2(sink_log2 - max) to them, raising max to the sink when
// the sink is larger, and returns the factor alpha by which the row's
// accumulator sum_j exp2(s_j - max) v_j must be multiplied to stay relative
// to the new max: O = acc * alpha / sum. A row that saw no key ends with
// max = sink_log2, sum = 1, alpha = 0 (O = 0); NaN stays NaN.
static inline float fold_sink(float sink_log2, float& max, float& sum) {
  const float new_max = sink_log2 > max ? sink_log2 : max;  // NaN max stays NaN
  const float alpha = std::exp2(max - new_max);               // 0 for max = -inf
  sum = sum * alpha + std::exp2(sink_log2 - new_max);
  max = new_max;
  return alpha;
}

}  // namespace tileattn::detail
