// Public entry of the forward operator: validate, pick the ISA path and the
// tiles once, build the schedule, size scratch up front, run the work items.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>
#include <cstring>
#include <memory>
#include <new>

#include "core/half.hpp"
#include "core/forward_plan.hpp"
#include "core/isa_entry.hpp"
#include "core/problem.hpp"
#include "core/thread_pool.hpp"
#include "core/validate.hpp"
#include "core/workspace.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/reference.hpp"

namespace tileattn {

namespace detail {

ForwardItemFn forward_item_fn(Isa isa, DType dtype) {
  switch (isa) {
    case Isa::amx: return dtype == DType::bf16 ? forward_item_amx : forward_item_avx512;
    case Isa::avx512bf16: return dtype == DType::bf16 ? forward_item_avx512bf16 : forward_item_avx512;
    case Isa::avx512: return forward_item_avx512;
    case Isa::avx2: return forward_item_avx2;
    default: return forward_item_generic;
  }
}

int effective_threads(int requested) {
  const int hw = hardware_threads();
  return requested <= 0 || requested > hw ? hw : requested;
}

Problem plan_forward(const ForwardArgs& args, Isa isa, int threads) {
  Problem p = describe(args);
  TileShape tiles = choose_tiles(isa, args.shape.head_dim, args.dtype, p.v_head_dim);
  p.block_q = args.block_q > 0 ? args.block_q : tiles.block_q;
  p.block_kv = args.block_kv > 0 ? args.block_kv : tiles.block_kv;
  // Short query sequences (decode) shrink the query tile below to what is there.
  int64_t max_nq = args.shape.seqlen_q;
  if (args.cu_seqlens_q) {
    max_nq = 0;
    for (int64_t b = 0; b < args.shape.batch; ++b)
      max_nq = max64(max_nq, args.cu_seqlens_q[b + 1] - args.cu_seqlens_q[b]);
  }
  // A quantized cache takes the fp32 products where a step stacks at most
  // the few-rows products' rows (decode reads the cache in place; fp32 and
  // fp16 queries: packed tiles convert int8 / fp8 to fp32), and the rung's
  // products (bf16 for bf16 queries) with their wider tiles (below) in steps
  // that stack more: prefill, chunked prefill, speculative verification, MLA
  // decode. Checked again once heads_per_item is known (below).
  const bool quantized_stacks_many = p.group * min64(p.block_q, max64(1, max_nq)) > kFewRowsMax;
  p.product = args.kv.quant == KvQuant::none || quantized_stacks_many ? tile_product(isa, args.dtype)
                                                                        : TileProduct::fp32_fma;
  // bf16 products without a band take wider tiles where they still fit L2:
  // each P V product reuses its accumulator tiles over more keys, and on AMX
  // each packed K/V tile serves more query rows. avx512bf16: 256 keys, else
  // 128 (AMX Xeon, paired, 2 threads: 256x128 took 0.95 of 256x64's time at
  // H32 N2048 D128 and 0.91 at H16 N4096 D64; AMD EPYC Zen 4, 2026-12-04,
  // noisy host, alternating, medians of 5-6: 256x256 took 0.96-0.99 of
  // 256x128's time, H8 N4096 D128 2 threads 0.96 (0.99 with
  // bf16_probabilities), H4 1 thread 0.99 (0.96), H16 D64 2 threads 0.96,
  // each of the five medians below 1). amx: 512x256, else 256x256, else
  // 256x128. AMX Xeon, 1 thread, quiet, min of 10: H8 N4096 D128 256x128
  // 182 ms, 256x256 167, 384x256 160, 512x256 158-160, 256x512 175, 512x512
  // 180; H16 N4096 D64 275 / 251 / 242 (512x256); H4 N4096 D256 139 / 130 /
  // 128. 512-row tiles only where the shape still gives kMinWideItems query
  // tiles (a row's result does not depend on its query tile, so the choice
  // may follow the shape alone). Causal bands (no left edge) on amx: 256x256
  // (H8 N4096 D128, 1 thread, noisy host, alternating, min / p25 of 25:
  // 93-100 / 121-135 ms against 111 / 141 for 256x64 and 105 / 134 for
  // 512x256, whose diagonal tiles waste more). Since the diagonal tiles'
  // bands stop at their last visible key (ForwardMainloop::run's
  // band_keys), causal MHA on amx takes 512x256 (AMX Xeon model 167,
  // 2026-12-05, 2 threads, medians of 3-5, ms 256x256 / 512x256: H8 N4096
  // D128 32.5 / 30.4, H32 N2048 34.1 / 33.3, H16 N4096 D64 44.3 / 43.9, H4
  // N8192 62.6 / 60.0) and GQA keeps 256x256 (32/8 N2048 31.0 / 32.0, N4096
  // 110.9 / 117.6: each item's accumulators for the group's heads double
  // with the rows). Causal bands on avx512bf16:
  // 128 keys (AMD EPYC Zen 4, 2 threads, 2026-12-04, alternating, medians of
  // 3: 256x128 took 0.96 of 256x64's time at H8 N4096 D128 with
  // bf16_probabilities and 0.98 without, 0.94 at H16 N4096 D64, 0.99 at GQA
  // 32/8 N2048 D128; 256x256 0.96, 0.98, 0.96 and 1.06, whose diagonal tiles
  // waste more at N2048). Other bands keep the cache model's tiles.
  const bool unbanded = p.band.left >= kUnbounded && p.band.right >= kUnbounded;
  const bool causal_like = p.band.left >= kUnbounded && !unbanded;
  const bool amx = isa == Isa::amx;
  if (p.product == TileProduct::bf16_dot && (unbanded || causal_like) && args.block_kv <= 0 &&
      tiles.reason.rfind("cache model", 0) == 0) {
    struct Wide {
      int block_q, block_kv;  // block_q 0: the cache model's
    };
    constexpr int64_t kMinWideItems = 32;
    static constexpr Wide kAmxTiles[] = {{512, 256}, {256, 256}, {256, 128}};
    static constexpr Wide kAmxCausalTiles[] = {{256, 256}, {256, 128}};
    static constexpr Wide kDotTiles[] = {{0, 256}, {0, 128}};
    static constexpr Wide kDotCausalTiles[] = {{0, 128}};
    const bool mha = p.group == 1;
    const Wide* wide = !amx ? (unbanded ? kDotTiles : kDotCausalTiles) : unbanded || mha ? kAmxTiles : kAmxCausalTiles;
    const int count = !amx ? (unbanded ? 2 : 1) : unbanded || mha ? 3 : 2;
    for (int i = 0; i < count; ++i) {
      const int64_t q = args.block_q > 0 ? args.block_q : wide[i].block_q > 0 ? wide[i].block_q : p.block_q;
      if (wide[i].block_kv <= p.block_kv && q <= p.block_q) break;  // no wider than the cache model's
      // Query tiles at q rows, counted without overflow for hostile shapes.
      const int64_t q_tiles = max_nq / q + (max_nq % q != 0), b = args.shape.batch, h = args.shape.heads;
      const bool enough = b >= kMinWideItems || h >= kMinWideItems || q_tiles >= kMinWideItems ||
                          b * h >= kMinWideItems || b * h * q_tiles >= kMinWideItems;
      if (q > p.block_q && !enough) continue;
      if (tile_working_set_bytes(q, wide[i].block_kv, args.shape.head_dim, p.v_head_dim) > cache_sizes().l2) continue;
      p.block_q = int(q);
      p.block_kv = wide[i].block_kv;
      break;
    }
  }
  p.stack_rows = p.block_q;
  if (max_nq > 0 && max_nq < p.block_q) p.block_q = int(max_nq);
  // Query heads of one KV group share each packed K/V tile; cap the group's
  // Q and accumulator tiles at half of L2, or at the rows of the query tile
  // the cache model sized (stack_rows) where those are more, and split a
  // larger group evenly. MLA's absorbed decode (128 heads on one KV head,
  // 576 / 512, 1 MiB L2): half of L2 gave items of 120 + 8 heads, each
  // packing every K/V tile; one item of 128 (the 128-row tile's working
  // set) is measured with the key tiles below.
  const int64_t per_head_bytes = int64_t(p.block_q) * (p.head_dim_padded + p.v_head_dim_padded) * 4;
  const int64_t head_cap = max64(max64(1, cache_sizes().l2 / 2 / per_head_bytes), p.stack_rows / max64(1, p.block_q));
  const int64_t group_items = (p.group + head_cap - 1) / head_cap;
  p.heads_per_item = int((p.group + group_items - 1) / group_items);
  // bf16 queries against an int8 / fp8 e4m3 cache in steps of more than the
  // few-rows products' rows: the bf16 products, their packed tiles converted
  // to bf16 exactly (Bf16Operands::pack_k / pack_v), with the wider tiles above.
  // Measured (AMD EPYC Zen 4, `tileattn decode --new-tokens 512`): docs/inference.md.
  if (args.kv.quant != KvQuant::none && int64_t(p.heads_per_item) * p.block_q <= kFewRowsMax)
    p.product = TileProduct::fp32_fma;
  // Decode steps stacking more rows than the few-rows products take (MLA)
  // on bf16 products: the widest of 256 or 128 keys whose per-thread scratch
  // (bf16 K/V tiles, not the cache model's fp32 ones) fits L2, as unbanded
  // calls take (above): the causal band of a step's few query rows cuts at
  // most one tile either way. AMD EPYC Zen 4, MLA decode (8192 tokens in L3,
  // bf16_probabilities, one thread, medians of 10 calls, two alternating
  // rounds): 120 + 8 heads with 64-key tiles 15.7-16.2 ms, 128 heads with 128
  // keys 13.3-13.8, with 256 keys (scratch past L2) 14.2; a later paired run
  // of old and new plans: 0.95 (0.94 without bf16_probabilities), and two
  // threads 0.96 (1.00). A quantized cache's MLA decode takes the same
  // tiles since the staged rows' scratch is laid out only for element-strided
  // caches (128 keys where it had 64; AMD EPYC Zen 4, int8, 1 thread, 2 rounds, 16.8-17.1 ms
  // against 17.2-17.5; 2 threads, with a second process on one core, int8 and
  // fp8 5 of 6 pairs faster, by ~3%).
  if (p.product == TileProduct::bf16_dot && !amx && args.block_kv <= 0 && max_nq < p.stack_rows &&
      int64_t(p.heads_per_item) * p.block_q > kFewRowsMax && tiles.reason.rfind("cache model", 0) == 0) {
    const int cache_model_kv = p.block_kv;
    for (const int keys : {256, 128}) {
      if (keys <= cache_model_kv) break;
      p.block_kv = keys;
      if (forward_scratch_layout(p).total * int64_t(sizeof(float)) <= cache_sizes().l2) break;
      p.block_kv = cache_model_kv;
    }
  }
  // Split-KV when there are too few work items to keep threads busy (decode:
  // few sequences and KV heads, one query tile). Decided from the shape alone
  // so that the result does not depend on the thread count.
  constexpr int64_t kMinItems = 8;         // items wanted without splitting keys
  constexpr int64_t kMinSplitKeys = 512;   // keys per split, to amortize the merge
  (void)threads;
  int64_t max_nk = args.shape.seqlen_k;
  if (args.cu_seqlens_k || args.kv.seqlens) {
    max_nk = 0;
    for (int64_t b = 0; b < args.shape.batch; ++b)
      max_nk = max64(max_nk, args.kv.seqlens ? args.kv.seqlens[b] - (args.kv.row_start ? args.kv.row_start[b] : 0)
                                             : args.cu_seqlens_k[b + 1] - args.cu_seqlens_k[b]);
  }
  // Rounded up without max_nq + block_q - 1, which overflows for the row
  // counts an empty batch may claim (fuzz_kv_cache, UBSan).
  const int64_t block_q = max64(1, p.block_q);
  const int64_t q_tiles = max_nq / block_q + (max_nq % block_q != 0);
  // Decode on a paged cache with small pages walks every KV head per item,
  // a key tile at a time. A page [Hkv, page_size, D] holds the heads' rows
  // side by side: one head per item reads 4 KiB runs 32 KiB apart (page 16,
  // bf16, D = 128, 8 KV heads), and the hardware prefetcher restarts at
  // every run. Paired against contiguous (Llama-3-8B decode, 8192 tokens,
  // random page order, page 16): one head per item 0.82-0.88 (2 threads)
  // and 0.65-0.80 (1 thread); all heads per item with 64-key tiles
  // 0.91-0.93 / 0.80-0.84, with 32-key tiles 0.94-0.98 / 0.90-1.01, with
  // 16-key tiles 0.91-0.95 / 0.86-0.92. The walk wins for runs of up to
  // 8 KiB (page 8: 0.84 against 0.71, page 32: 0.97 against 0.94) and loses
  // for 16 KiB (page 64: 0.96 against 0.95-1.01), where one head's run is
  // long enough for the prefetcher. Contiguous caches keep one head per item
  // (each head's rows are one sequential run) but take the same key tile
  // and key splits, so that paged and contiguous results stay bitwise
  // equal; 32-key tiles cost contiguous decode 0-2%. Items keep whole GQA
  // groups of at most kFewRowsMax stacked rows (the decode products) and their
  // Q and accumulator tiles within a quarter of L2.
  // A quantized cache (1-byte elements) takes 64 keys, the bytes of 32
  // 2-byte keys: Llama-3-8B decode, 8192 tokens, 2 threads, cold, 4 rounds
  // alternating (Intel Xeon model 207): int8 0.98-0.99 of the time with
  // 32-key tiles, with bf16_probabilities 0.95-0.96, fp8 0.96-0.97, paged
  // int8 (pages of 16) 0.98.
  const int decode_key_tile = args.kv.quant == KvQuant::none ? 32 : 64;
  constexpr int64_t kMaxWalkedRunBytes = 8192;
  int64_t walk = 1;  // KV heads per item, for the key splits
  if (p.heads_per_item == p.group && p.group * int64_t(p.block_q) <= kFewRowsMax) {
    if (args.block_kv <= 0 && tiles.reason != "TILEATTN_TILES") p.block_kv = decode_key_tile;
    const int64_t per_kv_head_bytes = p.group * int64_t(p.block_q) * (p.head_dim_padded + p.v_head_dim_padded) * 4;
    walk = min64(args.shape.kv_heads, max64(1, cache_sizes().l2 / 4 / per_kv_head_bytes));
    // Fewer heads per item where the keys are too few to split enough.
    const int64_t max_splits = max_nk >= 2 * kMinSplitKeys ? max_nk / kMinSplitKeys : 1;
    while (walk > 1 && args.shape.batch * q_tiles * ((args.shape.kv_heads + walk - 1) / walk) *
                               max_splits < kMinItems)
      walk = (walk + 1) / 2;
  }
  // One head's run of a page: page_size * head_dim * element bytes (divided,
  // not multiplied: page sizes near INT64_MAX are valid); K's, the longer
  // one where V's head dim differs.
  const int64_t row_bytes = max64(1, max64(args.shape.head_dim, p.v_head_dim) *
                                         int64_t(dtype_size(kv_storage_dtype(args.dtype, args.kv.quant))));
  if (args.kv.block_table && args.kv.page_size <= kMaxWalkedRunBytes / row_bytes)
    p.kv_heads_per_item = walk;
  const int64_t base_items = args.shape.batch * ((args.shape.kv_heads + walk - 1) / walk) * q_tiles *
                             ((p.group + p.heads_per_item - 1) / p.heads_per_item);
  p.max_rows_q = max_nq;
  if (base_items > 0 && base_items < kMinItems && max_nk >= 2 * kMinSplitKeys) {
    const int64_t splits = min64((kMinItems + base_items - 1) / base_items, max_nk / kMinSplitKeys);
    p.split_keys = round_up((max_nk + splits - 1) / splits, p.block_kv);
    p.kv_splits = (max_nk + p.split_keys - 1) / p.split_keys;
  }
  return p;
}

// Writes the float64 reference into args.o / args.lse (Isa::reference).
void write_reference(const ForwardArgs& a) {
  ReferenceOutput ref = reference_forward(a);
  const AttentionShape& s = a.shape;
  const int64_t q_batches = a.cu_seqlens_q ? 1 : s.batch;
  const Problem p = describe(a);
  for (int64_t b = 0; b < s.batch; ++b) {
    const Sequence seq = sequence_of(p, b);
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < seq.nq; ++i) {
        const int64_t row = seq.q_row0 + i;
        const int64_t ref_row = (seq.q_batch * s.heads + h) * s.seqlen_q + row;
        const int64_t o_off = seq.q_batch * a.o.stride[0] + h * a.o.stride[1] + row * a.o.stride[2];
        for (int64_t c = 0; c < p.v_head_dim; ++c) {
          const float value = float(ref.o[size_t(ref_row * p.v_head_dim + c)]);
          const int64_t off = o_off + c * a.o.stride[3];
          store_element(a.o.data, int(output_dtype(a)), off, value);
        }
        if (a.lse)
          a.lse[seq.q_batch * a.lse_stride[0] + h * a.lse_stride[1] + row * a.lse_stride[2]] =
              float(ref.lse[size_t(ref_row)]);
      }
  }
  (void)q_batches;
}

// Merges the key splits of every query row, in split order (deterministic),
// with the row's sink when there are sinks, and writes O in the output dtype
// and the LSE. One (sequence, head) at a time, on `threads` threads where the
// merge reads enough partial rows to pay for the parallel region: each row's
// arithmetic is the same on any thread.
void merge_splits(const Problem& p, int threads) {
  const ForwardArgs& a = p.args;
  const int64_t d = p.v_head_dim, dp = p.v_head_dim_padded;  // O's rows
  const DType o_dtype = output_dtype(a);
  const int64_t esize = int64_t(dtype_size(o_dtype));
  const auto merge_head = [&](int64_t bh, std::vector<float>& row) {
    const int64_t b = bh / a.shape.heads, h = bh % a.shape.heads;
    const Sequence seq = sequence_of(p, b);
    constexpr float kInf = std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < seq.nq; ++i) {
      // Split s weighs 2^(max_s - max + log2_sum_s): the difference of the
      // maxima first (0 for splits of a row biased by -FLT_MAX alike), then
      // the log-sum. The sink (ForwardArgs::sinks) is one more state with
      // max = sink (log2 units), sum 1 and O = 0, merged here once (the
      // splits' partials exclude it).
      const float sink = a.sinks ? a.sinks[h] * kLog2e : -kInf;
      float max = sink;
      bool nan = false;
      for (int64_t s = 0; s < p.kv_splits; ++s) {
        const int64_t slot = partial_slot(p, s, b, h, i);
        const float m = p.partial_max[slot];
        nan |= m != m || p.partial_log2_sum[slot] != p.partial_log2_sum[slot];
        max = m > max ? m : max;
      }
      std::fill(row.begin(), row.end(), nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
      float lse = nan ? std::numeric_limits<float>::quiet_NaN() : -kInf;
      if (!nan && max != -kInf) {
        float weight_sum = a.sinks ? std::exp2(sink - max) : 0.0f;
        for (int64_t s = 0; s < p.kv_splits; ++s) {
          const int64_t slot = partial_slot(p, s, b, h, i);
          const float m = p.partial_max[slot];
          if (m == -kInf) continue;
          const float weight = std::exp2((m - max) + p.partial_log2_sum[slot]);
          weight_sum += weight;
          const float* o = p.partial_o + slot * dp;
          for (int64_t c = 0; c < d; ++c) row[size_t(c)] += weight * o[c];
        }
        for (float& x : row) x /= weight_sum;
        lse = (max + std::log2(weight_sum)) * kLn2;
      }
      const int64_t out_row = seq.q_row0 + i;
      char* o_row = static_cast<char*>(a.o.data) +
                    (seq.q_batch * a.o.stride[0] + h * a.o.stride[1] + out_row * a.o.stride[2]) * esize;
      for (int64_t c = 0; c < d; ++c) {
        const int64_t off = c * a.o.stride[3];
        if (o_dtype == DType::f32) reinterpret_cast<float*>(o_row)[off] = row[size_t(c)];
        else if (o_dtype == DType::f16) reinterpret_cast<uint16_t*>(o_row)[off] = float_to_f16(row[size_t(c)]);
        else reinterpret_cast<uint16_t*>(o_row)[off] = float_to_bf16(row[size_t(c)]);
      }
      if (a.lse) a.lse[seq.q_batch * a.lse_stride[0] + h * a.lse_stride[1] + out_row * a.lse_stride[2]] = lse;
    }
  };
  // MLA's decode (128 heads x 512 columns x 8 splits, 2 MiB of partial
  // rows) merged on one thread for ~0.3 ms of a ~8 ms step (AMD EPYC Zen 4).
  constexpr int64_t kMinParallelMerge = 256 * 1024;  // partial elements read
  const int64_t heads = a.shape.batch * a.shape.heads;
  if (threads > 1 && p.kv_splits * heads * p.max_rows_q * dp >= kMinParallelMerge) {
    parallel_for(heads, threads, [&](int64_t bh, int) {
      thread_local std::vector<float> row;
      row.resize(size_t(d));
      merge_head(bh, row);
    });
    return;
  }
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t bh = 0; bh < heads; ++bh) merge_head(bh, row);
}

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
std::atomic<int>& last_workers() {
  static std::atomic<int> workers{0};
  return workers;
}
// When the last forward call (any thread's) ended, in steady_ns().
std::atomic<int64_t>& last_call_end() {
  static std::atomic<int64_t> end{INT64_MIN / 2};
  return end;
}
// Whether this call comes within the workers' polling window of the last
// one's end: calls back to back, whose workers poll between them once woken
// (a loop that started while they slept). A model's attention calls come
// farther apart (its other layers run between them).
bool soon_after_last_call() {
  return steady_ns() - last_call_end().load(std::memory_order_relaxed) < spin_window_ns();
}

}  // namespace

int last_forward_plan_workers() { return last_workers().load(std::memory_order_relaxed); }

void run_forward_plan(Problem& p, int threads, ForwardItemFn run_item) {
  const std::vector<WorkItem> items = make_schedule(p, threads);
  if (items.empty()) return;
  int workers = int(min64(threads, int64_t(items.size())));
  // A call this small runs on the calling thread: waking a sleeping worker
  // costs more than the work (~100 us on the Zen 3 VM where this was set,
  // 35-40 us on the Xeon model 207, see thread_pool.cpp). Work = (query, key)
  // pairs x heads x head_dim over the items. Decode at 32/8 heads, D = 128,
  // bf16, the worker asleep at the call: 16 cached tokens (70 K) took 21 us
  // on one thread and 50 us on two; 256 tokens (1 M) 152 against 134 us.
  // Where the worker sleeps (what a model's decode meets: its other layers
  // run between two attention calls) the bar is 4x higher: Intel Xeon model
  // 207, the same decode with the caches evicted before each call, one
  // thread against two (medians of 60 calls): bf16 128 tokens 84 against 106
  // us, 256 tokens 131 against 125, 512 tokens 237 against 200; int8 64
  // tokens 41 against 74, 128 tokens 78 against 109, 256 tokens 114 against
  // 113. A worker still polling keeps the lower bar, and so do calls back to
  // back (soon_after_last_call), which wake it once and find it polling from
  // then on: bf16 128 tokens in a loop, in cache, 17-18 us either way.
  // The results do not depend on it (the plan does not); the
  // thread-determinism tests turn it off (every_thread_runs_items).
  constexpr int64_t kMinParallelWork = 256 * 1024;
  constexpr int64_t kMinParallelWorkAsleep = 1024 * 1024;
  int64_t work = 0;
  for (const WorkItem& w : items) work += w.cost * p.head_dim_padded;
  if (!every_thread_runs_items() && workers > 1 &&
      (work < kMinParallelWork ||
       (work < kMinParallelWorkAsleep && pool_workers_asleep() && !soon_after_last_call())))
    workers = 1;
  last_workers().store(workers, std::memory_order_relaxed);
  Workspace scratch(forward_scratch_floats(p), workers);
  std::vector<float> partial_o, partial_max, partial_log2_sum;
  if (p.kv_splits > 1) {
    const int64_t slots = p.kv_splits * p.args.shape.batch * p.args.shape.heads * p.max_rows_q;
    partial_o.resize(size_t(slots * p.v_head_dim_padded));
    partial_max.resize(size_t(slots));
    partial_log2_sum.resize(size_t(slots));
    p.partial_o = partial_o.data();
    p.partial_max = partial_max.data();
    p.partial_log2_sum = partial_log2_sum.data();
  }
  parallel_for(int64_t(items.size()), workers, [&](int64_t item, int worker) {
    run_item(p, items[size_t(item)], scratch.for_worker(worker));
  });
  if (p.kv_splits > 1) merge_splits(p, workers);
  last_call_end().store(steady_ns(), std::memory_order_relaxed);
}

}  // namespace detail

TileShape forward_tiles(const ForwardArgs& args) {
  detail::validate(args);
  const Isa isa = resolve_isa(args.isa);
  TileShape tiles = choose_tiles(isa, args.shape.head_dim, args.dtype, value_head_dim(args.shape));
  if (isa == Isa::reference) return tiles;
  const detail::Problem p = detail::plan_forward(args, isa, detail::effective_threads(args.threads));
  if (p.block_q != tiles.block_q || p.block_kv != tiles.block_kv) {
    tiles.reason += "; this call: " + std::to_string(tiles.block_q) + "x" + std::to_string(tiles.block_kv) + " -> " +
                    std::to_string(p.block_q) + "x" + std::to_string(p.block_kv) +
                    (p.block_kv != tiles.block_kv && p.product == detail::TileProduct::bf16_dot
                         ? " (bf16 products take wider tiles)"
                         : "");
    tiles.block_q = p.block_q;
    tiles.block_kv = p.block_kv;
  }
  return tiles;
}

void attention_forward(const ForwardArgs& args) {
  detail::validate(args);
  if (args.dropout_p > 0.0f && resolve_isa(args.isa) == Isa::reference)
    throw NotSupported("dropout: the float64 reference path (isa reference) has no dropout");
  const Isa isa = resolve_isa(args.isa);
  // No query row (sizes whose product is 0, however large the others): no
  // element of O or LSE to write, and no per-(sequence, head) walk.
  const AttentionShape& s = args.shape;
  if (s.batch == 0 || s.heads == 0 || s.seqlen_q == 0) return;
  if (isa == Isa::reference) {
    detail::write_reference(args);
    return;
  }
  const int threads = detail::effective_threads(args.threads);
  detail::Problem p = detail::plan_forward(args, isa, threads);
  detail::run_forward_plan(p, threads, detail::forward_item_fn(isa, args.dtype));
}

}  // namespace tileattn
