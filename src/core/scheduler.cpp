#include <algorithm>

#include "core/problem.hpp"

namespace tileattn::detail {

std::vector<WorkItem> make_schedule(const Problem& p, int threads) {
  const ForwardArgs& a = p.args;
  std::vector<WorkItem> items;
  // Head-major order (all query tiles of one head group, then the next):
  // consecutive items reuse the same K/V from L2/L3.
  for (int64_t b = 0; b < a.shape.batch; ++b) {
    const Sequence s = sequence_of(p, b);
    for (int64_t kvh = 0; kvh < a.shape.kv_heads; kvh += p.kv_heads_per_item) {
      const int64_t kv_count = min64(p.kv_heads_per_item, a.shape.kv_heads - kvh);
      for (int64_t g0 = 0; g0 < p.group; g0 += p.heads_per_item) {
        for (int64_t q0 = 0; q0 < s.nq; q0 += p.block_q) {
          const int64_t q1 = min64(q0 + p.block_q, s.nq);
          const KeyRange keys = visible_keys(p.band, s, q0, q1);
          const int64_t pairs = (q1 - q0) * (keys.last - keys.first);
          for (int64_t split = 0; split < p.kv_splits; ++split) {
            WorkItem w;
            w.batch = b;
            w.kv_head = kvh;
            w.kv_head_count = kv_count;
            w.head_begin = kvh * p.group + g0;
            // Several KV heads only with whole groups (plan_forward).
            w.head_count = min64(p.heads_per_item, p.group - g0) * kv_count;
            w.q_begin = q0;
            w.q_end = q1;
            int64_t split_pairs = pairs;
            if (p.kv_splits > 1) {
              w.split = split;
              w.key_begin = split * p.split_keys;
              w.key_end = w.key_begin + p.split_keys;
              const int64_t overlap = min64(keys.last, w.key_end) - max64(keys.first, w.key_begin);
              split_pairs = (q1 - q0) * max64(0, overlap);
            }
            // Rows with no visible key still cost their epilogue.
            w.cost = w.head_count * (split_pairs + (q1 - q0));
            items.push_back(w);
          }
        }
      }
    }
  }
  if (threads > 1) {
    std::stable_sort(items.begin(), items.end(),
                     [](const WorkItem& x, const WorkItem& y) { return x.cost > y.cost; });
  }
  return items;
}

int64_t forward_scratch_floats(const Problem& p) {
  const int64_t bq = p.block_q, bkv = round_up(p.block_kv, kPanelWidth);
  const int64_t dp = p.head_dim_padded, hc = p.heads_per_item * p.kv_heads_per_item;
  auto aligned = [](int64_t floats) { return round_up(floats, 16); };  // 64-byte aligned pieces
  return aligned(hc * bq * dp)          // q_tile   (heads, BLOCK_Q, D_pad), pre-scaled Q
         + aligned(hc * bq * dp)        // acc      (heads, BLOCK_Q, D_pad), un-normalized O
         + 2 * aligned(hc * bq)         // row_max, row_sum (heads, BLOCK_Q)
         + aligned(dp * bkv)            // k_t      (D, BLOCK_KV_pad), K transposed
         + aligned(bkv * dp)            // v_tile   (BLOCK_KV_pad, D_pad)
         + aligned(score_tile_rows(p) * bkv)  // s_tile (stacked rows, BLOCK_KV_pad), scores then P
         + 4 * bkv;                     // key-row pointer tables (2 * BLOCK_KV_pad 8-byte slots)
}

}  // namespace tileattn::detail
