// Runs a call with the thread pool's test hook on (every thread given items
// runs some, no inline threshold: src/core/thread_pool.hpp) and checks how
// many threads took part, for the tests that compare thread counts bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/thread_pool.hpp"

namespace tileattn::testing {

template <class Call>
detail::ThreadCensus run_on_every_thread(Call call) {
  struct Hook {
    Hook() {
      detail::reset_thread_census();
      detail::set_every_thread_runs_items(true);
    }
    ~Hook() { detail::set_every_thread_runs_items(false); }
  } hook;
  call();
  return detail::thread_census();
}

// `threads` threads took part in the busiest region, or every thread there was
// work and hardware for: a call whose regions have one item runs on one thread.
inline void expect_threads_took_part(const detail::ThreadCensus& census, int threads, const std::string& label) {
  const int64_t expected = std::min<int64_t>({threads, detail::hardware_threads(), census.max_items});
  ::testing::Test::RecordProperty("threads_that_ran_items", census.max_threads);
  EXPECT_EQ(census.max_threads, expected)
      << label << ": " << census.max_threads << " of " << threads << " threads ran items (largest region: "
      << census.max_items << " items, " << detail::hardware_threads() << " hardware threads)";
}

}  // namespace tileattn::testing
