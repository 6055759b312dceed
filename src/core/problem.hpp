// The normalized problem one forward call solves, as plain data shared by the
// scheduler and every ISA's main loop. Helpers here are `static inline` so that
// each ISA translation unit gets its own copy, compiled with its own flags,
// and the linker never swaps an AVX-512 body into the portable path.
#pragma once

#include <cstdint>
#include <vector>

#include "core/band.hpp"
#include "core/bf16_block.hpp"
#include "tileattn/attention.hpp"

namespace tileattn::detail {

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) = exp2(x * log2(e))
constexpr float kLn2 = 0.6931471805599453f;    // ln(2): converts log2 units back to natural log
constexpr int kPanelWidth = 16;  // every packed row length is a multiple of this (floats)

static inline int64_t round_up(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// The packed tile products of a call (decode's few-rows products read K/V in
// place and ignore this): fp32 FMAs on fp32 operands, or bf16 dot products
// with fp32 sums on bf16 operands in the VNNI pair layout (bf16 inputs on
// the avx512bf16 and amx rungs).
enum class TileProduct { fp32_fma, bf16_dot };

constexpr int64_t kBf16PairBlock = 32;  // bf16 reduction dims pad to this (one AMX tile row)

// The packed products a call of `dtype` inputs on `isa` takes: bf16 dot
// products for bf16 inputs on the bf16 rungs, FP32 FMAs otherwise.
static inline TileProduct tile_product(Isa isa, DType dtype) {
  const bool bf16_rung = isa == Isa::amx || isa == Isa::avx512bf16;
  return bf16_rung && dtype == DType::bf16 ? TileProduct::bf16_dot : TileProduct::fp32_fma;
}

struct Problem {
  ForwardArgs args;
  TileProduct product = TileProduct::fp32_fma;
  int64_t group = 1;           // query heads per KV head
  float score_scale = 0.0f;    // softmax scale * log2(e): scores live in log2 units
  float softcap_log2 = 0.0f;   // args.softcap * log2(e): the cap in those units (0: off)
  Band band;
  int64_t head_dim_padded = 0;  // head_dim (Q, K) rounded up to kPanelWidth
  int64_t v_head_dim = 0;       // value_head_dim(args.shape): V and O
  int64_t v_head_dim_padded = 0;  // v_head_dim rounded up to kPanelWidth (the accumulator rows)
  int block_q = 0;              // query rows per tile
  int block_kv = 0;             // keys per tile
  int heads_per_item = 1;       // query heads of one KV group handled together
  // KV heads one work item walks together, tile by tile (each with its whole
  // query group): > 1 for decode on a paged cache of small pages, which hold every KV
  // head's rows side by side, so that the item reads each page front to back
  // instead of one 4 KiB run per head (see plan_forward).
  int64_t kv_heads_per_item = 1;
  // Rows of the score tile: stacked (head, query) rows of one product. At
  // least block_q; a decode step keeps the prefill tile's rows here so that
  // a whole GQA group of single queries stacks into one product. 0 = block_q.
  int stack_rows = 0;
  // Split-KV: each sequence's keys are cut into kv_splits ranges of
  // split_keys keys (a multiple of block_kv); each range's normalized O and
  // LSE go to the partial buffers, [split, batch, heads, max_rows_q, Dv_pad]
  // and [split, batch, heads, max_rows_q], and are merged afterwards. The
  // split depends on the shape only, never on the thread count, so results
  // are the same for any number of threads.
  int64_t kv_splits = 1;
  int64_t split_keys = 0;
  int64_t max_rows_q = 0;
  float* partial_o = nullptr;
  // Per split and row: the row's max score and log2 of its sum of
  // exponentials (log2 units), kept apart rather than as one LSE, whose
  // fp32 sum of the two loses the log-sum where |max| is huge (rows biased by
  // -1e9 or -FLT_MAX: the splits then weigh as their key counts, as naive
  // attention averages such a row's keys). Empty: max -inf.
  float* partial_max = nullptr;
  float* partial_log2_sum = nullptr;
};

// The factor the packed products leave to the softmax (1: none): the scores
// are then the plain dot products of the inputs' elements and the softmax
// folds the scale into its exponentials (one FMA, exp2(s * scale - max)), so
// no query element is rounded by a pre-multiplication. A positive scale
// commutes with the row max exactly (rounding is monotonic) and leaves -inf
// (masked) scores -inf; an additive mask (added in log2 units), a soft cap
// (tanh of the scaled score), an ALiBi bias or a scale <= 0 needs the scale
// applied first, and then Q carries it.
// The folded exponential exp2(fma(s, scale, -max)) subtracts the rounded max
// from the exact product; they differ by up to half an ulp of the max, below
// 2^-12 while |max| < kScoreFoldLimit (log2 units). Beyond it that reaches
// whole units (at |max| ~ 1e37 every P of the row underflowed to 0), so rows
// or tiles there take their scores scaled first (scale_keeping_finite) and
// P = exp2(s - max).
inline constexpr float kScoreFoldLimit = 4096.0f;
// A scale * log2(e) beyond FLT_MAX (scales above ~2.36e38) is inf: folded in,
// it turned every row empty (O = 0, LSE = -inf); pre-multiplied, the rows come
// out NaN, the documented limit (docs/accuracy.md).
static inline float deferred_score_scale(const Problem& p) {
  const bool fold = p.score_scale > 0.0f && p.score_scale <= 3.4028235e38f &&
                    p.args.mask.kind != MaskSpec::Kind::additive && p.softcap_log2 == 0.0f &&
                    p.args.alibi_slopes == nullptr;
  return fold ? p.score_scale : 1.0f;
}

// The factor fp32 Q rows are loaded with for the FMA products: 1 where the
// softmax takes the scale (deferred_score_scale), else scale * log2(e).
static inline float query_scale(const Problem& p) {
  return deferred_score_scale(p) != 1.0f ? 1.0f : p.score_scale;
}

// Stacked query rows the decode (few-rows) tile products take at most: every
// ISA's Kernels::kFewRowsMax (checked in mainloop.hpp). plan_forward plans
// decode work items around it.
inline constexpr int64_t kFewRowsMax = 8;

static inline int64_t score_tile_rows(const Problem& p) {
  return p.stack_rows > p.block_q ? p.stack_rows : p.block_q;
}

static inline int64_t partial_slot(const Problem& p, int64_t split, int64_t batch, int64_t head,
                                   int64_t i) {
  return ((split * p.args.shape.batch + batch) * p.args.shape.heads + head) * p.max_rows_q + i;
}

// One sequence's geometry.
struct Sequence {
  int64_t nq = 0, nk = 0;        // rows
  int64_t q_row0 = 0, k_row0 = 0;  // first row in the (packed) row dimension
  int64_t q_batch = 0, k_batch = 0;  // index multiplied by the batch stride
  int64_t offset = 0;            // nk - nq: bottom-right alignment of the band
};

static inline Sequence sequence_of(const Problem& p, int64_t b) {
  const ForwardArgs& a = p.args;
  Sequence s;
  if (a.cu_seqlens_q) {
    s.q_row0 = a.cu_seqlens_q[b];
    s.nq = a.cu_seqlens_q[b + 1] - s.q_row0;
  } else {
    s.q_batch = b;
    s.nq = a.shape.seqlen_q;
  }
  if (a.cu_seqlens_k) {
    s.k_row0 = a.cu_seqlens_k[b];
    s.nk = a.cu_seqlens_k[b + 1] - s.k_row0;
  } else {
    s.k_batch = b;
    s.nk = a.shape.seqlen_k;
  }
  if (a.kv.seqlens) s.nk = a.kv.seqlens[b];
  if (a.kv.batch_index) s.k_batch = a.kv.batch_index[b];
  if (a.kv.row_start) {
    s.k_row0 = a.kv.row_start[b];
    s.nk -= s.k_row0;
  }
  s.offset = s.nk - s.nq;
  return s;
}

// Keys [first, last) that any query row in [i_begin, i_end) may see.
static inline KeyRange visible_keys(const Band& band, const Sequence& s, int64_t i_begin,
                                    int64_t i_end) {
  return band_keys(band, s.offset, s.nk, i_begin, i_end);
}

// Query rows of [i_begin, i_end) that see at least one key of [j_begin,
// j_end) (the inverse of visible_keys), as [first, last); empty when none.
static inline KeyRange visible_rows(const Band& band, const Sequence& s, int64_t i_begin,
                                    int64_t i_end, int64_t j_begin, int64_t j_end) {
  KeyRange r;
  r.first = max64(i_begin, j_begin - s.offset - band.right);
  r.last = min64(i_end, j_end - 1 - s.offset + band.left + 1);
  if (r.last < r.first) r.last = r.first;
  return r;
}

// Per-tile verdict (CUTLASS's masked / unmasked trip counts, per tile):
// `full` tiles run without any mask work; `partial` ones apply the mask.
// Tiles outside visible_keys() are skipped without being loaded.
static inline bool tile_fully_visible(const Band& band, const Sequence& s, int64_t i_begin,
                                      int64_t i_end, int64_t j_begin, int64_t j_end) {
  return i_end - 1 + s.offset - band.left <= j_begin && j_end - 1 <= i_begin + s.offset + band.right;
}

struct WorkItem {
  int64_t batch = 0;
  int64_t kv_head = 0;        // first KV head
  int64_t kv_head_count = 1;  // consecutive KV heads (Problem::kv_heads_per_item)
  int64_t head_begin = 0;  // first query head (absolute index)
  int64_t head_count = 0;  // consecutive query heads of these KV heads (whole groups when
                           // kv_head_count > 1)
  int64_t q_begin = 0, q_end = 0;
  int64_t split = 0;                            // key split index (0 without split-KV)
  int64_t key_begin = 0, key_end = kUnbounded;  // keys of this split
  int64_t cost = 0;        // visible (query, key) pairs x heads, for ordering
};

// Bytes one thread's tiles take per (q-tile, kv-tile) step for one head, in
// fp32 (tiles.cpp's cache model): Q and accumulator, K^T and V, scores.
int64_t tile_working_set_bytes(int64_t block_q, int64_t block_kv, int64_t head_dim, int64_t v_head_dim);

// The band of a mask spec: causal clips the right side to 0.
Band make_band(const MaskSpec& mask);
// Problem with everything but the tile fields filled in (args must be valid).
Problem describe(const ForwardArgs& args);

// Work items in the order threads take them: most expensive first, so that
// causal and windowed problems end balanced.
std::vector<WorkItem> make_schedule(const Problem& p, int threads);

// The forward main loop's per-thread scratch: each piece's offset in floats
// from the 64-byte aligned start (every piece 64-byte aligned). The one
// place the layout is written; mainloop.hpp takes its pointers from here.
struct ForwardScratchLayout {
  int64_t kv_pad = 0;         // BLOCK_KV rounded up to kPanelWidth
  int64_t bf16_k = 0;         // bf16_dot: D rounded up to kBf16PairBlock (Q K^T's reduction)
  int64_t bf16_kv_pad = 0;    // bf16_dot: BLOCK_KV rounded up to kBf16PairBlock (P V's reduction)
  int64_t q_tile = 0;         // fp32: (heads * rows, D_pad) pre-scaled Q;
                              // bf16_dot: (heads * rows + 16, bf16_k) bf16, unscaled Q
                              // (D: head_dim, Dv: v_head_dim, _pad: rounded up to 16)
  int64_t acc = 0;            // (heads * rows, Dv_pad) fp32, un-normalized O
  int64_t row_max = 0;        // (heads * rows), log2 units
  int64_t row_sum = 0;        // (heads * rows)
  int64_t k_tile = 0;         // fp32: K^T (D, kv_pad) panel-major; bf16_dot: K pairs
                              // (kv_pad / 16 panels of (bf16_k / 2, 16, 2)) bf16
  int64_t v_tile = 0;         // fp32: V (kv_pad, Dv_pad) panel-major; bf16_dot: V pairs
                              // (Dv_pad / 16 panels of (bf16_kv_pad / 2, 16, 2)) bf16
  int64_t s_tile = 0;         // (stacked rows [+ 16 for bf16], kv_pad) fp32: scores, then P
  int64_t p_hi = 0;           // bf16_dot: P as bf16 hi, (stacked rows + 16, bf16_kv_pad)
  int64_t p_lo = 0;           // bf16_dot: P - hi as bf16, the same shape (or as bytes,
                              // isa/avx512bf16/lo_int8.hpp, the same row stride in bytes)
  int64_t p_lo_scales = 0;    // bf16_dot, P as hi + lo: lo bytes' scales, (stacked rows + 16)
                              // fp32, isa/avx512bf16/lo_int8.hpp
  int64_t p_lo_offsets = 0;   // their row offsets, (stacked rows + 16) int32
  int64_t v_q = 0;            // bf16_dot, P as hi + lo: V as int8 + 128 (Dv_pad / 16 panels of
                              // (bf16_kv_pad / 4, 16, 4) bytes), lo_int8.hpp
  int64_t v_q_scales = 0;     // their column scales (Dv_pad)
  int64_t key_rows = 0;       // 2 x kv_pad row addresses (8-byte slots)
  int64_t kv_scales = 0;      // quantized K/V: this tile's K scales, then its V scales (2 x kv_pad)
  int64_t kv_staged = 0;      // bf16_dot with a quantized cache: the tile's rows converted to bf16,
                              // (kv_pad, kv_staged_row), for the pair packers (Bf16Operands::stage_rows)
  int64_t kv_staged_row = 0;  // elements of a staged row: max(bf16_k, Dv_pad rounded up to 32)
  int64_t kv_staged_f32 = 0;  // one row on its way there, (kv_staged_row) fp32
  int64_t kv_staged_rows = 0; // the staged rows' addresses, kv_pad 8-byte slots
  int64_t q16 = 0;            // int8 cache, few rows: Q rounded to int16 for the VNNI scores,
                              // (rows, q16_row_stride(D)) (isa/avx512/few_rows_vnni.hpp)
  int64_t q16_steps = 0;      // their steps, (rows) fp32
  int64_t total = 0;          // floats in all
};
ForwardScratchLayout forward_scratch_layout(const Problem& p);

// Floats of per-thread scratch the forward main loop needs.
static inline int64_t forward_scratch_floats(const Problem& p) { return forward_scratch_layout(p).total; }

}  // namespace tileattn::detail
