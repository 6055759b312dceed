#include "isa/emulated_avx512_forward.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "isa/emulated_avx512_kernels.hpp"

#include "core/forward_plan.hpp"
#include "core/isa_entry.hpp"
#include "core/problem.hpp"
#include "core/thread_pool.hpp"
#include "core/validate.hpp"
#include "core/workspace.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::detail::avx512_emulated {
#include "core/mainloop.hpp"
}  // namespace tileattn::detail::avx512_emulated

namespace tileattn::testing {

namespace {
bool few_rows_path(const detail::Problem& p) {
  return int64_t(p.heads_per_item) * p.block_q <= detail::avx512_emulated::Kernels::kFewRowsMax;
}
}  // namespace

bool emulated_avx512_takes_few_rows_path(const ForwardArgs& args) {
  detail::validate(args);
  return few_rows_path(detail::plan_forward(args, Isa::avx512, detail::effective_threads(args.threads)));
}

// attention_forward's steps (forward.cpp) with the emulated item function.
bool emulated_avx512_forward(const ForwardArgs& args) {
  detail::validate(args);
  const int threads = detail::effective_threads(args.threads);
  detail::Problem p = detail::plan_forward(args, Isa::avx512, threads);
  if (few_rows_path(p) && !isa_available(Isa::avx2)) return false;
  const std::vector<detail::WorkItem> items = detail::make_schedule(p, threads);
  if (items.empty()) return true;
  const int workers = int(detail::min64(threads, int64_t(items.size())));
  detail::Workspace scratch(detail::forward_scratch_floats(p), workers);
  std::vector<float> partial_o, partial_lse;
  if (p.kv_splits > 1) {
    const int64_t slots = p.kv_splits * args.shape.batch * args.shape.heads * p.max_rows_q;
    partial_o.resize(size_t(slots * p.head_dim_padded));
    partial_lse.resize(size_t(slots));
    p.partial_o = partial_o.data();
    p.partial_lse = partial_lse.data();
  }
  detail::parallel_for(int64_t(items.size()), workers, [&](int64_t item, int worker) {
    detail::avx512_emulated::run_forward_item(p, items[size_t(item)], scratch.for_worker(worker));
  });
  if (p.kv_splits > 1) detail::merge_splits(p);
  return true;
}

}  // namespace tileattn::testing
