// The thread-count comparison the harnesses share. The library promises the
// same bits for any thread count (each work item is computed whole by one
// thread). A harness's first call runs as a caller's would, and a call as
// small as a fuzzed one mostly runs inline on the calling thread; the rerun
// asks for every hardware thread with the thread pool's test hook on
// (src/core/thread_pool.hpp: no inline threshold, items dealt round-robin),
// so that other threads compute the items, and its result is compared bit for
// bit with the first.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/thread_pool.hpp"

namespace fuzzviews {

// Threads the rerun asks for: 0, every hardware thread.
constexpr int kRerunThreads = 0;

// Runs `call` with the test hook on. Returns false when the hook ran the
// busiest parallel region on fewer threads than it had items and hardware for
// (the rerun would then compare nothing).
template <class Call>
bool run_on_every_thread(Call call) {
  struct Hook {
    Hook() {
      tileattn::detail::reset_thread_census();
      tileattn::detail::set_every_thread_runs_items(true);
    }
    ~Hook() { tileattn::detail::set_every_thread_runs_items(false); }
  } hook;
  call();
  const tileattn::detail::ThreadCensus census = tileattn::detail::thread_census();
  return census.max_threads >= std::min<int64_t>(tileattn::detail::hardware_threads(), census.max_items);
}

}  // namespace fuzzviews
