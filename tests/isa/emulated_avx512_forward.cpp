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
  detail::run_forward_plan(p, threads, detail::avx512_emulated::run_forward_item);
  return true;
}

}  // namespace tileattn::testing
