// KV cache for incremental decoding: append new keys/values in place and
// attend new queries to everything cached, in the manner of
// FlashAttention-2's flash_attn_with_kvcache.
//
// Two cache layouts, both in the query's dtype (fp32, fp16 or bf16):
//  - contiguous: k_cache/v_cache [batch, kv_heads, capacity, head_dim];
//  - paged (vLLM style, when block_table is set): pages
//    [num_pages, kv_heads, page_size, head_dim]; key j of sequence b lives in
//    page block_table[b * block_table_stride + j / page_size], row
//    j % page_size. Any page_size >= 1; pages may be in any order. Attention
//    gathers pages tile by tile in the forward's loader; the sequence is
//    never copied out.
// Strides are int64, in elements, in [outer, head, row, dim] order; a
// page's stride is the cache's stride[0].
//
// cache_seqlens[b] is how many tokens sequence b holds. An append writes the
// new rows at positions cache_seqlens[b] .. cache_seqlens[b] + count - 1 and,
// when the whole call succeeds, advances cache_seqlens[b] by count.
//
// Every argument is validated before anything is written: on an Error
// (naming the argument) the cache, cache_seqlens and the outputs are left
// exactly as they were.
#pragma once

#include <array>
#include <cstdint>
#include <limits>

#include "tileattn/attention.hpp"

namespace tileattn {

struct KvCacheArgs {
  int64_t batch = 0;
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // divides heads (GQA / MQA)
  int64_t head_dim = 0;  // Q and K: 1..576 (V's: v_head_dim, at the end)
  DType dtype = DType::f32;  // of q, o (see fp32_output), k_new, v_new and the cache

  // New queries: seqlen_q rows per sequence, [batch, heads, seqlen_q, head_dim].
  // Query t of sequence b sits at position L_b - seqlen_q + t, where L_b is
  // the sequence length after the append (bottom-right alignment, as
  // FlashAttention-2). With seqlen_q equal to the appended count this is
  // cache_seqlens[b] + t, the position of the token appended alongside it.
  int64_t seqlen_q = 0;
  InputView q;
  OutputView o;  // [batch, heads, seqlen_q, v_head_dim], dtype (fp32 with fp32_output)
  float* lse = nullptr;  // optional, fp32 natural log, [batch, heads, seqlen_q]
  std::array<int64_t, 3> lse_stride{0, 0, 1};

  // The cache.
  OutputView k_cache;  // contiguous [batch, kv_heads, capacity, head_dim] or
  OutputView v_cache;  // paged [num_pages, kv_heads, page_size, head_dim]
                       // (v_cache, v_new: v_head_dim in place of head_dim)
  int64_t capacity = 0;              // contiguous only: rows per sequence
  int32_t* cache_seqlens = nullptr;  // [batch], read and (on success) advanced
  const int32_t* block_table = nullptr;  // [batch, block_table_stride]; null: contiguous
  int64_t block_table_stride = 0;        // entries per sequence (max pages per sequence)
  int64_t page_size = 0;
  int64_t num_pages = 0;

  // New keys/values, [batch, kv_heads, seqlen_new, head_dim], any strides.
  // seqlen_new = 0: nothing is appended (attend to the cache as it is).
  int64_t seqlen_new = 0;
  InputView k_new;
  InputView v_new;
  // Optional [batch]: sequence b appends only its first new_counts[b] rows
  // (0 .. seqlen_new). Null: every sequence appends seqlen_new rows.
  const int32_t* new_counts = nullptr;

  // Optional rotary embedding (see rope.hpp), fp32 tables
  // [rotary_positions, rotary_dim / 2], row = position. Applied to the new
  // keys as they are appended (the cache stores rotated keys) and to the
  // new queries; values are never rotated. Positions of new tokens are
  // cache_seqlens[b] + t. The rotation is computed in float64 and rounded once
  // to dtype (fp16 / bf16 too: no double rounding through fp32). Queries are
  // rotated into a per-call buffer of batch x heads x seqlen_q rows -- decode
  // queries are a handful of rows.
  const float* rotary_cos = nullptr;
  const float* rotary_sin = nullptr;
  int64_t rotary_dim = 0;        // even, 2..head_dim
  int64_t rotary_positions = 0;  // rows of the tables; every position used must be below it
  bool rotary_interleaved = false;  // false: NeoX half rotation; true: GPT-J pairs

  float scale = std::numeric_limits<float>::quiet_NaN();  // NaN: 1/sqrt(head_dim)
  float softcap = 0.0f;       // ForwardArgs::softcap: c * tanh(x / c) of each scaled score; 0: off
  const float* alibi_slopes = nullptr;  // ForwardArgs::alibi_slopes ([heads] or [batch, heads])
  int64_t alibi_batch_stride = 0;
  const float* sinks = nullptr;  // ForwardArgs::sinks: fp32 [heads] sink logits; null: off
  // ForwardArgs::bf16_probabilities: P rounded to bf16 for the packed P V
  // products (prefill, and decode steps stacking more query rows than the
  // few-rows products take, e.g. MLA's 128 heads on one KV head) and, on the
  // avx512bf16 rung with a bf16 cache (or an fp8 e4m3 or int8 one and bf16
  // queries),
  // for the few-rows decode products too
  // (vdpbf16ps; CPUs with AVX512-VBMI, as the decode dot scores). With
  // AVX512-VNNI an int8 cache's few-rows scores run on vpdpwssd with Q
  // rounded to 16-bit integers per row (the LSE moves by ~2^-17 of a score)
  // on the avx512, avx512bf16 and amx rungs, and on the avx512 rung its P V too,
  // with P rounded to 16-bit integers per row and 32 keys (within 2^-16 of
  // their largest P); the amx rung's few-rows decode products keep P at
  // fp32 precision.
  bool bf16_probabilities = false;
  bool causal = true;         // bottom-right aligned with the updated cache length
  int64_t window_left = -1;   // sliding window, inclusive; -1 = unbounded
  int64_t window_right = -1;

  int threads = 0;           // 0: every hardware thread
  Isa isa = Isa::automatic;

  // FlashAttention-2's cache_batch_idx and cache_leftpad (contiguous caches
  // only; with block_table they are NotSupported). Appended after the fields above.
  // cache_batch_idx [batch]: sequence b reads and appends cache row
  // cache_batch_idx[b] in 0 .. cache_batch - 1 (the caches are then
  // [cache_batch, kv_heads, capacity, head_dim]); cache_seqlens, new_counts,
  // q, k_new and v_new stay indexed by b. Two sequences that append to the same
  // row are an Error (FlashAttention-2 leaves which write wins unspecified).
  const int32_t* cache_batch_idx = nullptr;
  int64_t cache_batch = 0;  // rows of the caches with cache_batch_idx; 0: batch
  // cache_leftpad [batch]: sequence b's keys start at cache row
  // cache_leftpad[b] (0 .. cache_seqlens[b]); the rows before it are ignored.
  // cache_seqlens[b] stays the end row (FlashAttention-2: the length includes
  // the pad), so appends land at cache_seqlens[b] and rotary positions are
  // cache rows; the causal / window / ALiBi alignment uses the sequence's own
  // length cache_seqlens[b] - cache_leftpad[b] (+ appended rows).
  const int32_t* cache_leftpad = nullptr;
  // FlashAttention-2's rotary positions of the queries: query t of sequence b
  // is rotated at cache_seqlens[b] + t (the length before the append) when
  // causal or windowed, else every query at cache_seqlens[b]. false: at its
  // own position L_b - seqlen_q + t (the two agree for causal calls whose
  // queries are the appended tokens).
  bool rotary_fa2_query_positions = false;
  // Quantized cache (docs/inference.md, "Quantized caches"). With kv_quant
  // int8 or fp8_e4m3, k_cache and v_cache hold that type (dtype stays the
  // type of q, o, k_new and v_new). An append quantizes each new row after
  // rotating it (the row a `dtype` cache would store, quantized); attention
  // converts the elements in registers and applies the scales per key.
  //  - int8: symmetric, one scale per (token, KV head). k_scale / v_scale are
  //    fp32 [batch, kv_heads, capacity] (paged: [num_pages, kv_heads,
  //    page_size]) with element strides *_scale_stride in [outer, head, row]
  //    order. An append writes scale = max|x| / 127 (fp32) and
  //    round-to-nearest-even(x / scale) clamped to -127..127; a row of zeros
  //    stores scale 0, a row with an inf or NaN stores scale NaN (its key
  //    then gives NaN, as it would in an unquantized cache).
  //  - fp8_e4m3 (torch.float8_e4m3fn): one scale per KV head, k_scale /
  //    v_scale fp32 [kv_heads] (contiguous), set by the caller, finite and
  //    > 0, read only; an append stores e4m3(clamp(x / scale, -448, 448))
  //    (float_to_f8e4m3 in core/half.hpp: torch's rounding; NaN stays NaN).
  // value = stored element x scale. Scales are validated like the cache
  // (shapes, null, overlaps; fp8 values each call); int8 scales of cached
  // rows are the cache's contents and are not re-read by validation.
  KvQuant kv_quant = KvQuant::none;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  std::array<int64_t, 3> k_scale_stride{0, 0, 1};  // int8 only
  std::array<int64_t, 3> v_scale_stride{0, 0, 1};
  // V's head dim (and O's), 1..512; 0: head_dim (AttentionShape::v_head_dim).
  // MLA's absorbed decode keeps a 576-wide K cache and a 512-wide V cache
  // with one KV head.
  int64_t v_head_dim = 0;
  // ForwardArgs::fp32_output: O in fp32 whatever `dtype` is (the pieces of a
  // cascade, e.g. a shared prefix's attention and each request's own cache,
  // merged in fp32 by merge_states before one rounding). The cache, q and the
  // new keys keep `dtype`.
  bool fp32_output = false;
};

// The dtype of o: fp32 with fp32_output, else dtype.
inline DType output_dtype(const KvCacheArgs& args) { return args.fp32_output ? DType::f32 : args.dtype; }

// The head dim of V, v_new, the V cache and O: v_head_dim, or head_dim when it is 0.
inline int64_t value_head_dim(const KvCacheArgs& args) { return args.v_head_dim > 0 ? args.v_head_dim : args.head_dim; }

namespace detail {
// The rotary position of query t of sequence b: `old_length` = cache_seqlens[b]
// before the call, `new_length` after the append (see rotary_fa2_query_positions).
inline int64_t rotary_query_position(const KvCacheArgs& a, int64_t old_length, int64_t new_length, int64_t t) {
  if (!a.rotary_fa2_query_positions) return new_length - a.seqlen_q + t;
  const bool per_token = a.causal || a.window_left >= 0 || a.window_right >= 0;
  return old_length + (per_token ? t : 0);
}
}  // namespace detail

// Appends k_new/v_new (rotating keys when rotary tables are given) into the
// cache and advances cache_seqlens. Uses the cache, new-token and rotary
// fields of `args`; q, o, lse and the mask fields are ignored. Throws Error
// (nothing written) on bad input: overflow of capacity or of the pages the
// block table gives, page indices out of range, a page written by one
// sequence that another table entry also uses, rotary tables too short.
void kv_cache_append(const KvCacheArgs& args);

// Appends (when seqlen_new > 0), then computes O (and LSE) for the new
// queries against the cached keys 0 .. L_b - 1 of each sequence, with the
// causal mask and window aligned bottom-right. cache_seqlens is advanced only
// after the attention has been computed.
void attention_with_kvcache(const KvCacheArgs& args);

// The forward-operator arguments that attend `args.q` to the cache, for
// sequence lengths `seqlens` (e.g. after an append). Exposed so tests and
// benchmarks can run the float64 reference on exactly what the cache holds.
ForwardArgs kvcache_forward_args(const KvCacheArgs& args, const int32_t* seqlens);

}  // namespace tileattn
