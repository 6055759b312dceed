// Public entry of the backward operator: validate, plan (tiles, key chunks:
// from the shape only), then three parallel passes -- row statistics, the
// main loop over (sequence, KV head, key chunk) items, and the dQ sum.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/half.hpp"
#include "core/isa_entry.hpp"
#include "core/mask_row.hpp"
#include "core/thread_pool.hpp"
#include "core/workspace.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/machine.hpp"
#include "training/backward_problem.hpp"
#include "training/reference_backward.hpp"

namespace tileattn {

namespace detail {

namespace {

// The bf16 rungs run the AVX-512 backward for fp32 and fp16 inputs. The
// normalizer pass forms the scores with the main loop's kernels (bf16 dot
// products for bf16 inputs on these rungs): a row's max must be bitwise one
// of the scores the main loop subtracts it from.
BackwardNormalizersFn backward_normalizers_fn(Isa isa, DType dtype) {
  switch (isa) {
    case Isa::amx: return dtype == DType::bf16 ? backward_normalizers_amx : backward_normalizers_avx512;
    case Isa::avx512bf16:
      return dtype == DType::bf16 ? backward_normalizers_avx512bf16 : backward_normalizers_avx512;
    case Isa::avx512: return backward_normalizers_avx512;
    case Isa::avx2: return backward_normalizers_avx2;
    default: return backward_normalizers_generic;
  }
}

BackwardItemFn backward_item_fn(Isa isa, DType dtype) {
  switch (isa) {
    case Isa::amx: return dtype == DType::bf16 ? backward_item_amx : backward_item_avx512;
    case Isa::avx512bf16: return dtype == DType::bf16 ? backward_item_avx512bf16 : backward_item_avx512;
    case Isa::avx512: return backward_item_avx512;
    case Isa::avx2: return backward_item_avx2;
    default: return backward_item_generic;
  }
}

// Bytes one thread touches per (query tile, key tile) pair: K, K^T and the dK
// accumulator (D wide), V^T and the dV accumulator (Dv wide), Q (D) and dO
// (Dv), and the P/dS tiles.
int64_t backward_working_set(int64_t block_q, int64_t block_kv, int64_t dp, int64_t dvp) {
  return 4 * (block_kv * (3 * dp + 2 * dvp) + block_q * (dp + dvp) + 3 * block_q * block_kv);
}

// Tiles: the first candidate whose working set fits 3/4 of L2 (the rest
// holds the dQ rows being accumulated and the next rows streaming in).
// 64 x 128 first where L2 has 1 MiB or more: on the Intel Xeon VM (model
// 207, 2 MiB L2, 2 threads, H8 N2048, medians of 5) it took 0.93x the time of
// 64 x 64 for fp32 D = 128 and D = 64, 0.95x for bf16 D = 128, 0.96x at
// D = 256, and the same under a causal mask; on AMD EPYC Zen 4 (1 MiB L2, 2
// threads, H8 N2048 D128, 4 alternating rounds) 0.95x for bf16 and ~0.97x
// for fp32; on a Zen 3 (512 KiB L2) it was slower (docs/training.md).
void choose_backward_tiles(Problem& p, const ForwardArgs& args) {
  struct Candidate {
    int block_q, block_kv;
  };
  static const Candidate candidates[] = {{64, 128}, {64, 64}, {32, 64}, {32, 32}, {16, 16}};
  const int64_t l2 = cache_sizes().l2, budget = l2 * 3 / 4;
  const bool wide_keys = l2 >= (int64_t{1} << 20);
  Candidate chosen = candidates[4];
  for (const Candidate& c : candidates) {
    if (c.block_kv == 128 && !wide_keys) continue;
    if (backward_working_set(c.block_q, c.block_kv, p.head_dim_padded, p.v_head_dim_padded) <= budget) {
      chosen = c;
      break;
    }
  }
  p.block_q = args.block_q > 0 ? args.block_q : chosen.block_q;
  p.block_kv = args.block_kv > 0 ? args.block_kv : chosen.block_kv;
}

// Longest sequence: `rows` without cu_seqlens, else the largest difference.
int64_t longest(const int32_t* cu, int64_t batch, int64_t rows) {
  if (!cu) return rows;
  int64_t m = 0;
  for (int64_t b = 0; b < batch; ++b) m = max64(m, int64_t(cu[b + 1]) - cu[b]);
  return m;
}

BackwardProblem plan_backward(const BackwardArgs& args) {
  const ForwardArgs& a = args.forward;
  BackwardProblem p;
  p.fwd = describe(a);
  p.args = &args;
  p.dropout = make_dropout(a.dropout_p, a.seed);
  choose_backward_tiles(p.fwd, a);
  p.max_rows_q = longest(a.cu_seqlens_q, a.shape.batch, a.shape.seqlen_q);
  const int64_t max_nk = longest(a.cu_seqlens_k, a.shape.batch, a.shape.seqlen_k);
  // Key chunks only when (sequence, KV head) pairs are too few to feed the
  // threads of a typical machine; each chunk adds one fp32 dQ-sized buffer.
  // Decided from the shape alone: the result is the same for any thread count.
  constexpr int64_t kMinItems = 8;
  constexpr int64_t kMinChunkKeys = 512;            // keys per chunk, to amortize the dQ sum
  constexpr int64_t kMaxPartialFloats = int64_t{1} << 28;  // 1 GiB of dQ partial sums
  const int64_t base_items = a.shape.batch * a.shape.kv_heads;
  const int64_t dq_floats = a.shape.batch * a.shape.heads * p.max_rows_q * p.fwd.head_dim_padded;
  int64_t chunks = 1;
  if (base_items > 0 && base_items < kMinItems && max_nk >= 2 * kMinChunkKeys) {
    chunks = min64((kMinItems + base_items - 1) / base_items, max_nk / kMinChunkKeys);
    while (chunks > 1 && chunks * dq_floats > max64(dq_floats, kMaxPartialFloats)) --chunks;
  }
  p.chunk_keys = round_up(max64(1, (max_nk + chunks - 1) / chunks), p.fwd.block_kv);
  p.kv_chunks = max64(1, (max_nk + p.chunk_keys - 1) / p.chunk_keys);
  return p;
}

std::vector<BackwardItem> make_backward_schedule(const BackwardProblem& p, int threads) {
  const ForwardArgs& a = p.fwd.args;
  std::vector<BackwardItem> items;
  for (int64_t b = 0; b < a.shape.batch; ++b) {
    const Sequence seq = sequence_of(p.fwd, b);
    for (int64_t chunk = 0; chunk < p.kv_chunks; ++chunk) {
      BackwardItem w;
      w.batch = b;
      w.chunk = chunk;
      w.key_begin = chunk * p.chunk_keys;
      w.key_end = min64(seq.nk, w.key_begin + p.chunk_keys);
      if (w.key_begin >= w.key_end) continue;
      int64_t pairs = 0;
      for (int64_t j0 = w.key_begin; j0 < w.key_end; j0 += p.fwd.block_kv) {
        const int64_t j1 = min64(j0 + p.fwd.block_kv, w.key_end);
        const KeyRange qs = visible_queries(p.fwd.band, seq, j0, j1);
        pairs += (qs.last - qs.first + 1) * (j1 - j0);  // +1: every key row is stored
      }
      w.cost = pairs * p.fwd.group;
      for (int64_t kvh = 0; kvh < a.shape.kv_heads; ++kvh) {
        w.kv_head = kvh;
        items.push_back(w);
      }
    }
  }
  if (threads > 1)
    std::stable_sort(items.begin(), items.end(),
                     [](const BackwardItem& x, const BackwardItem& y) { return x.cost > y.cost; });
  return items;
}

// |LSE| (natural log) from which a row's normalizer is recomputed instead of
// taken from the LSE. The LSE is m + log(sum) rounded to fp32, and P =
// exp(S - LSE) inherits that rounding, ~|LSE| x 2^-24 relative, in every
// entry, where naive attention (S - max, divided by the sum) keeps a row's
// dominant entry near exact. With a large finite mask bias the log(sum) part
// is rounded away entirely (fp32 spacing at 1e9 is 64): a row masked with
// -1e9 (Hugging Face's padding) got P = 1 for each key instead of 1 / n and
// dQ 4.8 off; with large logits (scale 10-100, |LSE| 250-2500) dV was
// 3.6-20x naive's error. From 32 on such rows get their max and sum
// recomputed from the scores (BackwardMainloop::recompute_normalizers,
// after pass 1); ordinary attention (scale 1/sqrt(D),
// |LSE| ~ log(keys) + a few) stays below 32 and costs nothing. Between ~8
// and 32 a peaked row's P keeps up to 2^-20 relative error from the LSE
// (docs/accuracy.md).
constexpr float kRecomputedNormalizerLse = 32.0f;

// Pass 1, one (sequence, head): LSE in log2 units and D = rowsum(dO o O) per
// query row; zeroes this head's dQ partial rows of every chunk. Returns the
// rows whose normalizer is to be recomputed (kRecomputedNormalizerLse).
std::vector<int64_t> row_statistics(const BackwardProblem& p, int64_t b, int64_t h) {
  const BackwardArgs& args = *p.args;
  const ForwardArgs& a = args.forward;
  const Sequence seq = sequence_of(p.fwd, b);
  const int dt = int(a.dtype);
  const int64_t dv = p.fwd.v_head_dim, dp = p.fwd.head_dim_padded;  // O and dO: Dv wide; dQ: D
  std::vector<int64_t> recompute;  // rows whose normalizer the LSE does not hold precisely
  for (int64_t i = 0; i < seq.nq; ++i) {
    const int64_t row = seq.q_row0 + i;
    const float lse = args.lse[seq.q_batch * args.lse_stride[0] + h * args.lse_stride[1] +
                               row * args.lse_stride[2]];
    // A row that sees no key has LSE -inf: +inf makes its P = exp2(s - inf) = 0.
    const int64_t slot = row_slot(p, b, h, i);
    p.row_lse2[slot] =
        lse == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::infinity() : lse * kLog2e;
    p.row_inv_sum[slot] = 1.0f;
    if (p.lse_of_these_keys && std::fabs(lse) >= kRecomputedNormalizerLse &&
        std::fabs(lse) <= std::numeric_limits<float>::max())
      recompute.push_back(i);
    const int64_t o_off = seq.q_batch * args.o.stride[0] + h * args.o.stride[1] + row * args.o.stride[2];
    const int64_t g_off = seq.q_batch * args.d_o.stride[0] + h * args.d_o.stride[1] + row * args.d_o.stride[2];
    float delta = 0.0f;
    for (int64_t c = 0; c < dv; ++c)
      delta += load_element(args.o.data, dt, o_off + c * args.o.stride[3]) *
               load_element(args.d_o.data, dt, g_off + c * args.d_o.stride[3]);
    p.row_delta[slot] = delta;
    for (int64_t chunk = 0; chunk < p.kv_chunks; ++chunk)
      std::memset(p.dq_partial + dq_slot(p, chunk, b, h, i) * dp, 0, sizeof(float) * dp);
  }
  return recompute;
}

// Pass 3, one (sequence, head): dQ = scale * (chunk 0 + chunk 1 + ...), in
// chunk order, rounded to the output dtype once.
void finish_dq(const BackwardProblem& p, int64_t b, int64_t h) {
  const BackwardArgs& args = *p.args;
  const Sequence seq = sequence_of(p.fwd, b);
  const int64_t d = args.forward.shape.head_dim, dp = p.fwd.head_dim_padded;
  const float scale = p.fwd.score_scale / kLog2e;
  for (int64_t i = 0; i < seq.nq; ++i) {
    const int64_t row = seq.q_row0 + i;
    const int64_t out = seq.q_batch * args.dq.stride[0] + h * args.dq.stride[1] + row * args.dq.stride[2];
    const float* first = p.dq_partial + dq_slot(p, 0, b, h, i) * dp;
    for (int64_t c = 0; c < d; ++c) {
      float sum = first[c];
      for (int64_t chunk = 1; chunk < p.kv_chunks; ++chunk)
        sum += p.dq_partial[dq_slot(p, chunk, b, h, i) * dp + c];
      store_element(args.dq.data, int(gradient_dtype(args)), out + c * args.dq.stride[3], sum * scale);
    }
  }
}

// d_sinks[h] = -sum over sequences and rows of P_sink * D, P_sink =
// exp2(sink - lse2) * inv_sum with the row statistics pass 1 (and the
// recomputed normalizers) left; summed in float64, in row order: the same
// for any number of threads.
void write_sink_gradients(const BackwardProblem& p) {
  const BackwardArgs& args = *p.args;
  const ForwardArgs& a = args.forward;
  for (int64_t h = 0; h < a.shape.heads; ++h) {
    const float sink2 = a.sinks[h] * kLog2e;
    double sum = 0.0;
    for (int64_t b = 0; b < a.shape.batch; ++b) {
      const Sequence seq = sequence_of(p.fwd, b);
      for (int64_t i = 0; i < seq.nq; ++i) {
        const int64_t slot = row_slot(p, b, h, i);
        sum += double(std::exp2(sink2 - p.row_lse2[slot]) * p.row_inv_sum[slot]) * double(p.row_delta[slot]);
      }
    }
    args.d_sinks[h] = float(-sum);
  }
}

// Isa::reference: the float64 gradients, rounded to the output dtype. With
// lse_of_these_keys false the given LSE (and O, for D) cover more keys than
// args holds, so P comes from them, not from a softmax over these keys.
void write_reference_backward(const BackwardArgs& args, bool lse_of_these_keys) {
  const training::BackwardReference ref =
      lse_of_these_keys ? training::reference_backward(args) : training::reference_backward_from_lse(args);
  const ForwardArgs& a = args.forward;
  const AttentionShape& s = a.shape;
  const Problem p = describe(a);
  const int64_t d = s.head_dim, dv = p.v_head_dim;
  const int grad_dtype = int(gradient_dtype(args));
  for (int64_t b = 0; b < s.batch; ++b) {
    const Sequence seq = sequence_of(p, b);
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < seq.nq; ++i) {
        const int64_t row = seq.q_row0 + i;
        const size_t at = size_t(((seq.q_batch * s.heads + h) * s.seqlen_q + row) * d);
        const int64_t out = seq.q_batch * args.dq.stride[0] + h * args.dq.stride[1] + row * args.dq.stride[2];
        for (int64_t c = 0; c < d; ++c)
          store_element(args.dq.data, grad_dtype, out + c * args.dq.stride[3], float(ref.dq[at + size_t(c)]));
      }
    for (int64_t h = 0; h < s.kv_heads; ++h)
      for (int64_t j = 0; j < seq.nk; ++j) {
        const int64_t row = seq.k_row0 + j;
        const size_t key = size_t((seq.k_batch * s.kv_heads + h) * s.seqlen_k + row);
        const int64_t k_out = seq.k_batch * args.dk.stride[0] + h * args.dk.stride[1] + row * args.dk.stride[2];
        const int64_t v_out = seq.k_batch * args.dv.stride[0] + h * args.dv.stride[1] + row * args.dv.stride[2];
        for (int64_t c = 0; c < d; ++c)
          store_element(args.dk.data, grad_dtype, k_out + c * args.dk.stride[3],
                        float(ref.dk[key * size_t(d) + size_t(c)]));
        for (int64_t c = 0; c < dv; ++c)
          store_element(args.dv.data, grad_dtype, v_out + c * args.dv.stride[3],
                        float(ref.dv[key * size_t(dv) + size_t(c)]));
      }
  }
  if (args.d_sinks)
    for (int64_t h = 0; h < s.heads; ++h) args.d_sinks[h] = float(ref.d_sinks[size_t(h)]);
}

}  // namespace

}  // namespace detail

void attention_backward(const BackwardArgs& args) { detail::run_backward(args, true); }

TileShape backward_tiles(const BackwardArgs& args) {
  detail::validate(args);
  const detail::BackwardProblem p = detail::plan_backward(args);
  TileShape tiles;
  tiles.block_q = int(p.fwd.block_q);
  tiles.block_kv = int(p.fwd.block_kv);
  const bool given = args.forward.block_q > 0 || args.forward.block_kv > 0;
  tiles.reason = given ? "backward: the call's block_q / block_kv"
                       : "backward cache model: working set within 3/4 of L2 (" +
                             std::to_string(cache_sizes().l2 / 1024) + " KiB)";
  return tiles;
}

void detail::run_backward(const BackwardArgs& args, bool lse_of_these_keys) {
  detail::validate(args);
  const Isa isa = resolve_isa(args.forward.isa);
  // No query and no key row (sizes whose product is 0, however large the
  // others): dQ, dK and dV have no element; d_sinks, a sum over no rows, is 0.
  const AttentionShape& s = args.forward.shape;
  if (s.batch == 0 || s.heads == 0 || (s.seqlen_q == 0 && s.seqlen_k == 0)) {
    if (args.d_sinks) std::fill(args.d_sinks, args.d_sinks + s.heads, 0.0f);
    return;
  }
  if (isa == Isa::reference) {
    detail::write_reference_backward(args, lse_of_these_keys);
    return;
  }
  detail::run_backward_passes(args, lse_of_these_keys, isa, detail::backward_item_fn(isa, args.forward.dtype),
                              detail::backward_normalizers_fn(isa, args.forward.dtype));
}

void detail::run_backward_passes(const BackwardArgs& args, bool lse_of_these_keys, Isa isa,
                                 BackwardItemFn run_item, BackwardNormalizersFn recompute_rows) {
  const int hw = detail::hardware_threads();
  const int threads = args.forward.threads <= 0 || args.forward.threads > hw ? hw : args.forward.threads;
  detail::BackwardProblem p = detail::plan_backward(args);
  p.fwd.product = detail::tile_product(isa, args.forward.dtype);  // before any scratch is sized
  const AttentionShape& s = args.forward.shape;
  if (s.batch == 0) return;

  // Scratch, all sized up front: row statistics, dQ partial sums, per-thread tiles.
  const int64_t rows = s.batch * s.heads * p.max_rows_q;
  std::vector<float> lse2(static_cast<size_t>(rows)), inv_sum(static_cast<size_t>(rows)),
      delta(static_cast<size_t>(rows));
  p.row_lse2 = lse2.data();
  p.row_inv_sum = inv_sum.data();
  p.lse_of_these_keys = lse_of_these_keys;
  p.row_delta = delta.data();
  detail::Workspace dq_partial(p.kv_chunks * rows * p.fwd.head_dim_padded, 1);
  p.dq_partial = dq_partial.for_worker(0);

  const int64_t heads_total = s.batch * s.heads;
  const int row_workers = int(detail::min64(threads, heads_total));
  std::vector<std::vector<int64_t>> recompute(static_cast<size_t>(heads_total));
  detail::parallel_for(heads_total, row_workers, [&](int64_t item, int) {
    recompute[size_t(item)] = detail::row_statistics(p, item / s.heads, item % s.heads);
  });
  std::vector<int64_t> heads_to_recompute;  // (sequence, head) items with such rows
  for (int64_t item = 0; item < heads_total; ++item)
    if (!recompute[size_t(item)].empty()) heads_to_recompute.push_back(item);
  if (!heads_to_recompute.empty()) {
    const int workers = int(detail::min64(threads, int64_t(heads_to_recompute.size())));
    detail::Workspace scratch(detail::backward_scratch_layout(p).total, workers);
    detail::parallel_for(int64_t(heads_to_recompute.size()), workers, [&](int64_t i, int worker) {
      const int64_t item = heads_to_recompute[size_t(i)];
      const std::vector<int64_t>& rows = recompute[size_t(item)];
      recompute_rows(p, item / s.heads, item % s.heads, rows.data(), int64_t(rows.size()),
                     scratch.for_worker(worker));
    });
  }

  const std::vector<detail::BackwardItem> items = detail::make_backward_schedule(p, threads);
  if (!items.empty()) {
    const int workers = int(detail::min64(threads, int64_t(items.size())));
    detail::Workspace scratch(detail::backward_scratch_layout(p).total, workers);
    detail::parallel_for(int64_t(items.size()), workers, [&](int64_t item, int worker) {
      run_item(p, items[size_t(item)], scratch.for_worker(worker));
    });
  }

  detail::parallel_for(heads_total, row_workers, [&](int64_t item, int) {
    detail::finish_dq(p, item / s.heads, item % s.heads);
  });
  if (args.d_sinks) detail::write_sink_gradients(p);
}

}  // namespace tileattn
