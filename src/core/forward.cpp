// Public entry of the forward operator: validate, pick the ISA path and the
// tiles once, build the schedule, size scratch up front, run the work items.
#include <algorithm>
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

ForwardItemFn forward_item_fn(Isa isa) {
  switch (isa) {
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
  TileShape tiles = choose_tiles(isa, args.shape.head_dim, args.dtype);
  p.block_q = args.block_q > 0 ? args.block_q : tiles.block_q;
  p.block_kv = args.block_kv > 0 ? args.block_kv : tiles.block_kv;
  // Short query sequences (decode): shrink the query tile to what is there.
  int64_t max_nq = args.shape.seqlen_q;
  if (args.cu_seqlens_q) {
    max_nq = 0;
    for (int64_t b = 0; b < args.shape.batch; ++b)
      max_nq = max64(max_nq, args.cu_seqlens_q[b + 1] - args.cu_seqlens_q[b]);
  }
  p.stack_rows = p.block_q;
  if (max_nq > 0 && max_nq < p.block_q) p.block_q = int(max_nq);
  // Query heads of one KV group share each packed K/V tile; cap the group's
  // Q and accumulator tiles at half of L2.
  const int64_t per_head_bytes = 2 * int64_t(p.block_q) * p.head_dim_padded * 4;
  p.heads_per_item = int(min64(p.group, max64(1, cache_sizes().l2 / 2 / per_head_bytes)));
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
      max_nk = max64(max_nk, args.kv.seqlens ? args.kv.seqlens[b]
                                             : args.cu_seqlens_k[b + 1] - args.cu_seqlens_k[b]);
  }
  // Rounded up without max_nq + block_q - 1, which overflows for the row
  // counts an empty batch may claim (fuzz_kv_cache, UBSan).
  const int64_t block_q = max64(1, p.block_q);
  const int64_t q_tiles = max_nq / block_q + (max_nq % block_q != 0);
  const int64_t base_items = args.shape.batch * args.shape.kv_heads * q_tiles *
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
        for (int64_t c = 0; c < s.head_dim; ++c) {
          const float value = float(ref.o[size_t(ref_row * s.head_dim + c)]);
          const int64_t off = o_off + c * a.o.stride[3];
          if (a.dtype == DType::f32) static_cast<float*>(a.o.data)[off] = value;
          if (a.dtype == DType::f16) static_cast<uint16_t*>(a.o.data)[off] = float_to_f16(value);
          if (a.dtype == DType::bf16) static_cast<uint16_t*>(a.o.data)[off] = float_to_bf16(value);
        }
        if (a.lse)
          a.lse[seq.q_batch * a.lse_stride[0] + h * a.lse_stride[1] + row * a.lse_stride[2]] =
              float(ref.lse[size_t(ref_row)]);
      }
  }
  (void)q_batches;
}

// Merges the key splits of every query row, in split order (deterministic),
// and writes O in the output dtype and the LSE.
void merge_splits(const Problem& p) {
  const ForwardArgs& a = p.args;
  const int64_t d = a.shape.head_dim, dp = p.head_dim_padded;
  const int64_t esize = int64_t(dtype_size(a.dtype));
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t b = 0; b < a.shape.batch; ++b) {
    const Sequence seq = sequence_of(p, b);
    for (int64_t h = 0; h < a.shape.heads; ++h)
      for (int64_t i = 0; i < seq.nq; ++i) {
        float max_lse = -std::numeric_limits<float>::infinity();
        bool nan = false;
        for (int64_t s = 0; s < p.kv_splits; ++s) {
          const float l = p.partial_lse[partial_slot(p, s, b, h, i)];
          nan |= l != l;
          max_lse = l > max_lse ? l : max_lse;
        }
        std::fill(row.begin(), row.end(), nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
        float lse = nan ? std::numeric_limits<float>::quiet_NaN() : max_lse;
        if (!nan && max_lse != -std::numeric_limits<float>::infinity()) {
          float weight_sum = 0.0f;
          for (int64_t s = 0; s < p.kv_splits; ++s) {
            const int64_t slot = partial_slot(p, s, b, h, i);
            const float l = p.partial_lse[slot];
            if (l == -std::numeric_limits<float>::infinity()) continue;
            const float weight = std::exp(l - max_lse);
            weight_sum += weight;
            const float* o = p.partial_o + slot * dp;
            for (int64_t c = 0; c < d; ++c) row[size_t(c)] += weight * o[c];
          }
          for (float& x : row) x /= weight_sum;
          lse = max_lse + std::log(weight_sum);
        }
        const int64_t out_row = seq.q_row0 + i;
        char* o_row = static_cast<char*>(a.o.data) +
                      (seq.q_batch * a.o.stride[0] + h * a.o.stride[1] + out_row * a.o.stride[2]) * esize;
        for (int64_t c = 0; c < d; ++c) {
          const int64_t off = c * a.o.stride[3];
          if (a.dtype == DType::f32) reinterpret_cast<float*>(o_row)[off] = row[size_t(c)];
          else if (a.dtype == DType::f16) reinterpret_cast<uint16_t*>(o_row)[off] = float_to_f16(row[size_t(c)]);
          else reinterpret_cast<uint16_t*>(o_row)[off] = float_to_bf16(row[size_t(c)]);
        }
        if (a.lse)
          a.lse[seq.q_batch * a.lse_stride[0] + h * a.lse_stride[1] + out_row * a.lse_stride[2]] = lse;
      }
  }
}

void run_forward_plan(Problem& p, int threads, ForwardItemFn run_item) {
  const std::vector<WorkItem> items = make_schedule(p, threads);
  if (items.empty()) return;
  const int workers = int(min64(threads, int64_t(items.size())));
  Workspace scratch(forward_scratch_floats(p), workers);
  std::vector<float> partial_o, partial_lse;
  if (p.kv_splits > 1) {
    const int64_t slots = p.kv_splits * p.args.shape.batch * p.args.shape.heads * p.max_rows_q;
    partial_o.resize(size_t(slots * p.head_dim_padded));
    partial_lse.resize(size_t(slots));
    p.partial_o = partial_o.data();
    p.partial_lse = partial_lse.data();
  }
  parallel_for(int64_t(items.size()), workers, [&](int64_t item, int worker) {
    run_item(p, items[size_t(item)], scratch.for_worker(worker));
  });
  if (p.kv_splits > 1) merge_splits(p);
}

}  // namespace detail

void attention_forward(const ForwardArgs& args) {
  detail::validate(args);
  if (args.dropout_p > 0.0f && resolve_isa(args.isa) == Isa::reference)
    throw NotSupported("dropout: the float64 reference path (isa reference) has no dropout");
  const Isa isa = resolve_isa(args.isa);
  if (isa == Isa::reference) {
    detail::write_reference(args);
    return;
  }
  const int threads = detail::effective_threads(args.threads);
  detail::Problem p = detail::plan_forward(args, isa, threads);
  detail::run_forward_plan(p, threads, detail::forward_item_fn(isa));
}

}  // namespace tileattn
