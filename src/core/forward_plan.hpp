// The planning steps of attention_forward (forward.cpp), declared for callers
// that run the same plan with another per-item function, such as the tests
// that drive the AVX-512 main loop on an emulation.
#pragma once

#include "core/isa_entry.hpp"
#include "core/problem.hpp"
#include "tileattn/attention.hpp"

namespace tileattn::detail {

// The main-loop entry of an ISA path (generic, avx2 or avx512).
ForwardItemFn forward_item_fn(Isa isa, DType dtype);
// `requested` threads, or the hardware's when <= 0 or more than it has.
int effective_threads(int requested);
// Tiles, GQA grouping and key splits of a validated call on `isa`'s tiles.
Problem plan_forward(const ForwardArgs& args, Isa isa, int threads);
// Merges the key splits' partial O and LSE into args.o / args.lse (kv_splits > 1),
// on up to `threads` threads.
void merge_splits(const Problem& p, int threads);
// Runs a planned call: the schedule, per-worker scratch, every work item through
// `run_item` on `threads` threads, then the merge of key splits.
void run_forward_plan(Problem& p, int threads, ForwardItemFn run_item);
// The threads the last run_forward_plan (of any caller) ran its items on, for
// the tests of its choice (tests/core/forward_threads_test.cpp).
int last_forward_plan_workers();

}  // namespace tileattn::detail
