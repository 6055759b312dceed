// Public entry of the forward operator: validate, pick the ISA path and the
// tiles once, build the schedule, size scratch up front, run the work items.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "core/half.hpp"
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
  if (max_nq > 0 && max_nq < p.block_q) p.block_q = int(max_nq);
  // Query heads of one KV group share each packed K/V tile. Cap the group's
  // Q and accumulator tiles at half of L2, and keep at least two items per
  // thread so that every thread has work.
  const int64_t per_head_bytes = 2 * int64_t(p.block_q) * p.head_dim_padded * 4;
  int64_t heads = max64(1, cache_sizes().l2 / 2 / per_head_bytes);
  heads = min64(heads, p.group);
  const int64_t q_tiles = (max_nq + p.block_q - 1) / max64(1, p.block_q);
  while (heads > 1 && args.shape.batch * args.shape.kv_heads * q_tiles *
                              ((p.group + heads - 1) / heads) < 2 * int64_t(threads))
    heads = (heads + 1) / 2;
  p.heads_per_item = int(heads);
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

}  // namespace detail

void attention_forward(const ForwardArgs& args) {
  detail::validate(args);
  const Isa isa = resolve_isa(args.isa);
  if (isa == Isa::reference) {
    detail::write_reference(args);
    return;
  }
  const int threads = detail::effective_threads(args.threads);
  const detail::Problem p = detail::plan_forward(args, isa, threads);
  const std::vector<detail::WorkItem> items = detail::make_schedule(p, threads);
  if (items.empty()) return;
  const int64_t per_thread = detail::forward_scratch_floats(p);
  const int workers = int(detail::min64(threads, int64_t(items.size())));
  detail::Workspace scratch(per_thread, workers);
  const detail::ForwardItemFn run_item = detail::forward_item_fn(isa);
  detail::parallel_for(int64_t(items.size()), workers, [&](int64_t item, int worker) {
    run_item(p, items[size_t(item)], scratch.for_worker(worker));
  });
}

}  // namespace tileattn
