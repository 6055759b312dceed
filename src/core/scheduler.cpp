#include <algorithm>

#include "core/problem.hpp"
#include "isa/avx512/few_rows_vnni.hpp"

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

ForwardScratchLayout forward_scratch_layout(const Problem& p) {
  ForwardScratchLayout l;
  const int64_t bq = p.block_q, dp = p.head_dim_padded, dvp = p.v_head_dim_padded;
  const int64_t rows = p.heads_per_item * p.kv_heads_per_item * bq;  // stacked rows of an item
  const bool bf16 = p.product == TileProduct::bf16_dot;
  l.kv_pad = round_up(p.block_kv, kPanelWidth);
  l.bf16_k = round_up(p.args.shape.head_dim, kBf16PairBlock);
  l.bf16_kv_pad = round_up(p.block_kv, kBf16PairBlock);
  // The bf16 A operands (Q, P) carry 16 rows of slack: AMX loads whole
  // 16-row tiles, and a tail's extra rows only feed discarded results.
  constexpr int64_t kSlackRows = 16;
  auto bf16_floats = [](int64_t elements) { return (elements + 1) / 2; };
  auto take = [&](int64_t floats) {  // 64-byte aligned pieces
    const int64_t at = l.total;
    l.total += round_up(floats, 16);
    return at;
  };
  l.q_tile = take(bf16 ? bf16_floats((rows + kSlackRows) * l.bf16_k) : rows * dp);
  l.acc = take(rows * dvp);
  l.row_max = take(rows);
  l.row_sum = take(rows);
  // The few-rows products keep their row tables (4 x kv_pad pointers) in
  // k_tile instead: it always holds at least 8 x kv_pad floats.
  l.k_tile = take(bf16 ? bf16_floats(l.kv_pad * l.bf16_k) : dp * l.kv_pad);
  l.v_tile = take(bf16 ? bf16_floats(l.bf16_kv_pad * dvp) : l.kv_pad * dvp);
  // bf16: 16 slack rows, for AMX's P V, which may read P from S's own rows
  // (mainloop.hpp's Bf16Operands) in whole 16-row tiles.
  l.s_tile = take((score_tile_rows(p) + (bf16 ? kSlackRows : 0)) * l.kv_pad);
  const int64_t p_rows = score_tile_rows(p) + kSlackRows;  // rows of P's bf16 operands
  l.p_hi = take(bf16 ? bf16_floats(p_rows * l.bf16_kv_pad) : 0);
  l.p_lo = take(bf16 ? bf16_floats(p_rows * l.bf16_kv_pad) : 0);
  const bool lo = bf16 && !p.args.bf16_probabilities;  // P V's lo (on int8 products where the rung can)
  l.p_lo_scales = take(lo ? p_rows : 0);
  l.p_lo_offsets = take(lo ? p_rows : 0);
  l.v_q = take(lo ? l.bf16_kv_pad * dvp / 4 : 0);
  l.v_q_scales = take(lo ? dvp : 0);
  l.key_rows = take(2 * l.kv_pad * int64_t(sizeof(void*) / sizeof(float)));
  l.kv_scales = take(p.args.kv.quant != KvQuant::none ? 2 * l.kv_pad : 0);
  // Staged bf16 rows only for a quantized cache read with an element stride:
  // unit-stride rows pack straight from the cache's bytes (mainloop.hpp).
  const bool staged =
      bf16 && p.args.kv.quant != KvQuant::none && (p.args.k.stride[3] != 1 || p.args.v.stride[3] != 1);
  l.kv_staged_row = staged ? max64(l.bf16_k, round_up(dvp, kBf16PairBlock)) : 0;
  l.kv_staged = take(staged ? bf16_floats(l.kv_pad * l.kv_staged_row) : 0);
  l.kv_staged_f32 = take(l.kv_staged_row);
  l.kv_staged_rows = take(staged ? l.kv_pad * int64_t(sizeof(void*) / sizeof(float)) : 0);
  // The VNNI scores' Q (isa/avx512/few_rows_vnni.hpp): one int16 row and one
  // step per query row, only where the few-rows products read an int8 cache.
  const bool int8_rows = p.args.kv.quant == KvQuant::int8 && p.heads_per_item * p.block_q <= kFewRowsMax;
  l.q16 = take(int8_rows ? rows * q16_row_stride(p.args.shape.head_dim) / 2 : 0);
  l.q16_steps = take(int8_rows ? rows : 0);
  return l;
}

}  // namespace tileattn::detail
