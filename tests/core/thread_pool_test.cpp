// detail::parallel_for (src/core/thread_pool.cpp): every item runs exactly
// once on a worker index below the thread count, exceptions reach the
// caller, concurrent callers and regions separated by pauses (workers asleep,
// or waking while the caller finishes alone) all complete. Run under
// ThreadSanitizer by scripts/sanitize.sh (suite name *Thread*).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.hpp"

namespace tileattn::detail {
namespace {

// Runs one region and checks that each of `count` items ran once.
void expect_each_item_once(int64_t count, int threads) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
  std::atomic<int> bad_worker{0};
  parallel_for(count, threads, [&](int64_t item, int worker) {
    hits[static_cast<size_t>(item)].fetch_add(1, std::memory_order_relaxed);
    if (worker < 0 || worker >= (threads < 1 ? 1 : threads)) bad_worker.fetch_add(1);
  });
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "item " << i;
  EXPECT_EQ(bad_worker.load(), 0);
}

TEST(ThreadPool, EveryItemOnceForAnyCountAndThreads) {
  for (int threads : {1, 2, 3, 8})
    for (int64_t count : {0, 1, 2, 7, 1000}) {
      SCOPED_TRACE(::testing::Message() << "threads " << threads << " count " << count);
      expect_each_item_once(count, threads);
    }
}

// Pauses of 0..400 us between regions: polling workers, workers that fell
// asleep, and workers that wake only after the caller has run every item
// itself (they must not join a closed region or touch the next one early).
TEST(ThreadPool, RegionsSeparatedByPauses) {
  for (int r = 0; r < 300; ++r) {
    std::this_thread::sleep_for(std::chrono::microseconds((r * 37) % 400));
    expect_each_item_once(1 + r % 9, 2);
    if (HasFatalFailure()) return;
  }
}

TEST(ThreadPool, ExceptionReachesTheCallerAndThePoolStaysUsable) {
  for (int r = 0; r < 20; ++r) {
    EXPECT_THROW(parallel_for(64, 2,
                              [](int64_t item, int) {
                                if (item == 13) throw std::runtime_error("item 13");
                              }),
                 std::runtime_error);
    expect_each_item_once(64, 2);
  }
}

// Callers on several application threads at once: one holds the pool, the
// others run their items inline; all finish with every item once.
TEST(ThreadPool, ConcurrentCallers) {
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&failures, c] {
      for (int r = 0; r < 50; ++r) {
        const int64_t count = 10 + (c * 7 + r) % 40;
        std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
        parallel_for(count, 2, [&](int64_t item, int) { hits[static_cast<size_t>(item)].fetch_add(1); });
        for (const auto& h : hits)
          if (h.load() != 1) failures.fetch_add(1);
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// The test hook of the determinism tests: with it on, every thread asked for
// runs items even when the items are few and tiny (without it the caller
// usually takes them all before a helper wakes), and the census counts them.
TEST(ThreadPool, EveryThreadHookMakesEachThreadRunItems) {
  const int threads = std::min(4, hardware_threads());
  set_every_thread_runs_items(true);
  for (int64_t count : {1, 2, 3, 7}) {
    reset_thread_census();
    std::vector<std::atomic<int>> ran_on(static_cast<size_t>(threads));
    parallel_for(count, threads, [&](int64_t, int worker) { ran_on[static_cast<size_t>(worker)].fetch_add(1); });
    const ThreadCensus c = thread_census();
    const int64_t expected = std::min<int64_t>(threads, count);
    EXPECT_EQ(c.max_threads, expected) << "count " << count;
    EXPECT_EQ(c.max_items, count);
    for (int64_t w = 0; w < expected; ++w) EXPECT_GE(ran_on[static_cast<size_t>(w)].load(), 1) << "worker " << w;
  }
  set_every_thread_runs_items(false);
  expect_each_item_once(1000, threads);
}

}  // namespace
}  // namespace tileattn::detail
