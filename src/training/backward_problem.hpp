// The normalized problem one backward call solves, shared by the planner
// (backward.cpp) and every ISA's backward main loop (backward_mainloop.hpp).
//
// Work split (decided from the shape alone, never from the thread count, so
// the gradients are bitwise the same for any number of threads):
//  - pass 1 (a prologue in backward.cpp): per query row, the
//    log2-unit LSE and D = rowsum(dO o O);
//  - pass 2 (the main loop): one item per (sequence, KV head, key chunk). The
//    item owns the dK/dV rows of its keys, loops over the query heads of the
//    group and the query tiles that see each key tile, and accumulates dQ of
//    those rows into its own fp32 slice of dq_partial (one slice per chunk):
//    no two items write the same memory, no atomics;
//  - pass 3: dQ = scale * sum of the chunk slices, in chunk order.
// Keys are cut into chunks only when there are few (sequence, KV head) pairs.
#pragma once

#include <cstdint>

#include "core/dropout.hpp"
#include "core/isa_entry.hpp"
#include "core/problem.hpp"
#include "tileattn/backward.hpp"

namespace tileattn::detail {

struct BackwardProblem {
  Problem fwd;  // describe(args.forward) with the backward's tile shape
  const BackwardArgs* args = nullptr;
  DropoutSpec dropout;
  int64_t kv_chunks = 1;   // key chunks per sequence
  int64_t chunk_keys = 0;  // keys per chunk (a multiple of block_kv)
  int64_t max_rows_q = 0;  // longest query sequence
  // Per query row (slot (b * heads + h) * max_rows_q + i): P = exp2(S -
  // row_lse2) * row_inv_sum. Usually row_lse2 is the LSE in log2 units (+inf
  // for a row that sees no key, so that exp2(s - it) = 0) and row_inv_sum 1;
  // for a row with a huge |LSE| they are its score max and 1 / sum, recomputed
  // (see row_statistics in backward.cpp). And D = rowsum(dO o O).
  float* row_lse2 = nullptr;
  float* row_inv_sum = nullptr;
  float* row_delta = nullptr;
  // args->lse is the LSE over exactly the keys this call sees (false: ring
  // attention's blocks, whose LSE covers every rank's keys).
  bool lse_of_these_keys = true;
  // [chunk, batch, heads, max_rows_q, D_pad] fp32 dQ partial sums (unscaled).
  float* dq_partial = nullptr;
};

static inline int64_t row_slot(const BackwardProblem& p, int64_t b, int64_t h, int64_t i) {
  return (b * p.fwd.args.shape.heads + h) * p.max_rows_q + i;
}
static inline int64_t dq_slot(const BackwardProblem& p, int64_t chunk, int64_t b, int64_t h,
                              int64_t i) {
  return chunk * p.fwd.args.shape.batch * p.fwd.args.shape.heads * p.max_rows_q + row_slot(p, b, h, i);
}

struct BackwardItem {
  int64_t batch = 0;
  int64_t kv_head = 0;
  int64_t chunk = 0;
  int64_t key_begin = 0, key_end = 0;  // keys of this chunk, clipped to the sequence
  int64_t cost = 0;                    // visible pairs x heads, for ordering
};

void validate(const BackwardArgs& args);

// attention_backward, told whether args.lse is the LSE over exactly the keys
// of this call (attention_backward: yes; a ring attention block: no, its LSE
// covers every rank's keys, and a row's normalizer cannot be recomputed from
// this block's keys alone).
void run_backward(const BackwardArgs& args, bool lse_of_these_keys);

// run_backward's passes on `isa` (not Isa::reference) with the main loop's
// item and normalizer functions given, for a validated call: run_backward
// passes the ones it chooses for that isa and dtype; tests pass the bf16
// rungs' main loop compiled against the AVX-512 emulation and the AMX model.
void run_backward_passes(const BackwardArgs& args, bool lse_of_these_keys, Isa isa, BackwardItemFn run_item,
                         BackwardNormalizersFn recompute_rows);

// Query rows [first, last) that may see some key in [j_begin, j_end): the
// inverse of visible_keys().
static inline KeyRange visible_queries(const Band& band, const Sequence& s, int64_t j_begin,
                                       int64_t j_end) {
  KeyRange r;
  r.first = max64(0, j_begin - s.offset - band.right);
  r.last = min64(s.nq, j_end - 1 - s.offset + band.left + 1);
  if (r.last < r.first) r.last = r.first;
  return r;
}

// Per-thread scratch of the backward main loop, as float offsets of its
// pieces (each 64-byte aligned). One definition serves the sizing in
// backward.cpp and the carving in backward_mainloop.hpp.
struct BackwardScratchLayout {
  int64_t k_rows, k_t, v_t, dk, dv, q, d_o, s, dp, z, pd, softcap_tanh, transposed, row_ptrs, key_ptrs;
  // bf16 products (fwd.product == bf16_dot; 0 otherwise), bf16 pieces in the
  // pair layout of isa/avx512bf16/bf16_kernels.hpp, reductions padded to 32:
  int64_t bf16_kv;     // BLOCK_KV rounded up to 32
  int64_t bf16_q;      // BLOCK_Q rounded up to 32
  int64_t bf16_d;      // head_dim rounded up to 32
  int64_t bf16_dv;     // V's head dim rounded up to 32 (dP = dO V^T's reduction)
  int64_t q16;         // Q rows bf16, unscaled (A of S = Q K^T), 16 slack rows
  int64_t k_d_pairs;   // K, pairs along D (B of S = Q K^T)
  int64_t k_pairs;     // K, pairs along keys (B of dQ += dS K)
  int64_t v_pairs;     // V, pairs along Dv (B of dP = dO V^T)
  int64_t d_o16;       // dO rows bf16 (A of dP), 16 slack rows
  int64_t d_o_pairs;   // dO, pairs along query rows (B of dV += P^T dO)
  int64_t q_pairs;     // Q unscaled, pairs along query rows (B of dK += dS^T Q)
  int64_t a_hi, a_lo;  // an fp32 A operand split into bf16 hi + lo, 16 slack rows
  int64_t total;
};
static inline BackwardScratchLayout backward_scratch_layout(const BackwardProblem& p) {
  const int64_t bq = round_up(p.fwd.block_q, kPanelWidth), kv = round_up(p.fwd.block_kv, kPanelWidth);
  const int64_t dp = p.fwd.head_dim_padded, dvp = p.fwd.v_head_dim_padded;  // Q/K's, V's (O's)
  const int64_t tile = bq * kv;  // (BLOCK_Q, BLOCK_KV_pad)
  BackwardScratchLayout l{};
  int64_t cursor = 0;
  auto take = [&](int64_t floats) {
    const int64_t at = cursor;
    cursor += round_up(floats, 16);
    return at;
  };
  l.k_rows = take(kv * dp);   // (BLOCK_KV_pad, D_pad)  K rows
  l.k_t = take(dp * kv);      // (D_pad, BLOCK_KV_pad)  K^T (fp32 scores)
  l.v_t = take(dvp * kv);     // (Dv_pad, BLOCK_KV_pad) V^T
  l.dk = take(kv * dp);       // (BLOCK_KV_pad, D_pad)  dK accumulator
  l.dv = take(kv * dvp);      // (BLOCK_KV_pad, Dv_pad) dV accumulator
  l.q = take(bq * dp);        // (BLOCK_Q, D_pad)       Q * scale * log2(e)
  l.d_o = take(bq * dvp);     // (BLOCK_Q, Dv_pad)      dO
  l.s = take(tile);           // scores, then P
  l.dp = take(tile);          // dO V^T, then dS
  l.z = p.dropout.active ? take(tile) : 0;   // dropout factors
  l.pd = p.dropout.active ? take(tile) : 0;  // P o Z
  l.softcap_tanh = p.fwd.softcap_log2 > 0.0f ? take(tile) : 0;  // tanh of each capped score
  // (BLOCK_KV_pad, BLOCK_Q_pad): (P o Z)^T, then dS^T, for the FMA products
  // (the bf16 products split the transposes straight from the score rows)
  l.transposed = take(p.fwd.product == TileProduct::bf16_dot ? 0 : kv * bq);
  l.row_ptrs = take(2 * bq);                 // row pointers for the transposes (8-byte slots)
  l.key_ptrs = take(2 * kv);                 // K/V row pointers
  if (p.fwd.product == TileProduct::bf16_dot) {
    auto bf16 = [](int64_t elements) { return (elements + 1) / 2; };  // floats holding them
    l.bf16_kv = round_up(p.fwd.block_kv, kBf16PairBlock);
    l.bf16_q = round_up(p.fwd.block_q, kBf16PairBlock);
    l.bf16_d = round_up(p.fwd.args.shape.head_dim, kBf16PairBlock);
    l.bf16_dv = round_up(p.fwd.v_head_dim, kBf16PairBlock);
    const int64_t a_rows = max64(kv, bq) + 16, a_cols = max64(l.bf16_kv, l.bf16_q);
    l.q16 = take(bf16((bq + 16) * l.bf16_d));    // (BLOCK_Q_pad + 16, bf16_d)
    l.k_d_pairs = take(bf16(kv * l.bf16_d));     // kv_pad / 16 panels of (bf16_d / 2, 16, 2)
    l.k_pairs = take(bf16(l.bf16_kv * dp));
    l.v_pairs = take(bf16(kv * l.bf16_dv));
    l.d_o16 = take(bf16((bq + 16) * l.bf16_dv));
    l.d_o_pairs = take(bf16(l.bf16_q * dvp));
    l.q_pairs = take(bf16(l.bf16_q * dp));
    l.a_hi = take(bf16(a_rows * a_cols));
    l.a_lo = take(bf16(a_rows * a_cols));
  }
  l.total = cursor;
  return l;
}

}  // namespace tileattn::detail
