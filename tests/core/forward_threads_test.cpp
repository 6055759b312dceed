// run_forward_plan's choice of threads (src/core/forward.cpp): a call below
// the bar for sleeping workers runs on the calling thread when the pool's
// workers sleep and no call ended within their polling window, and on every
// thread when it comes right after another call (a loop of calls) or is
// large enough to pay for waking them. The checks read the thread count the
// plan chose (last_forward_plan_workers), not which threads ran items.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/forward_plan.hpp"
#include "core/thread_pool.hpp"
#include "tileattn/attention.hpp"

namespace tileattn::detail {
namespace {

// One decode-like call, Llama-3-8B heads (32 query heads on 8 KV heads,
// D = 128, one query row), fp32, on two threads: work = keys x 32 x 128,
// between the two bars for 128 keys (0.5 M) and above both for 512 (2 M).
struct DecodeLikeCall {
  explicit DecodeLikeCall(int64_t keys)
      : q(32 * 128, 0.01f), k(8 * keys * 128, 0.02f), v(k.size(), 0.03f), o(q.size()) {
    args.shape = {1, 32, 8, 1, keys, 128, 0};
    args.q = {q.data(), {32 * 128, 128, 128, 1}};
    args.k = {k.data(), {8 * keys * 128, keys * 128, 128, 1}};
    args.v = {v.data(), args.k.stride};
    args.o = {o.data(), {32 * 128, 128, 128, 1}};
    args.threads = 2;
  }
  int run() {
    attention_forward(args);
    return last_forward_plan_workers();
  }
  std::vector<float> q, k, v, o;
  ForwardArgs args;
};

// Sleeps until the pool's workers do (they poll for TILEATTN_SPIN_US first),
// seen asleep at two checks 5 ms apart: a worker that a region woke but the
// loaded machine has not run yet still counts as asleep, then wakes, finds
// the region closed and polls again before it sleeps (a CI run with three
// lanes on two cores saw it awake 2 ms after it had looked asleep).
bool workers_fall_asleep() {
  for (int i = 0; i < 200; ++i) {
    if (pool_workers_asleep()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (pool_workers_asleep()) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

TEST(ForwardThreads, SmallCallRunsOnTheCallerWhileTheWorkersSleep) {
  if (hardware_threads() < 2) GTEST_SKIP() << "one hardware thread: the pool has no workers";
  // A short TILEATTN_SPIN_US (0: workers sleep at once) leaves no window for
  // calls back to back to fall in.
  if (spin_window_ns() < 20'000) GTEST_SKIP() << "TILEATTN_SPIN_US below 20 us";
  DecodeLikeCall small(128), large(512);
  small.run();  // the pool exists from here on
  if (!workers_fall_asleep()) GTEST_SKIP() << "the workers did not sleep (TILEATTN_SPIN_US set long?)";
  EXPECT_EQ(small.run(), 1) << "a small call planned both threads while the workers slept";
  // Right after that call: a loop of calls, which goes to every thread (some
  // try may miss the polling window on a loaded machine; one must hit it).
  int most = 0;
  for (int i = 0; i < 20; ++i) most = std::max(most, small.run());
  EXPECT_EQ(most, 2) << "calls back to back were planned on one thread";
  ASSERT_TRUE(workers_fall_asleep());
  EXPECT_EQ(large.run(), 2) << "a call above the sleeping workers' bar was planned on one thread";
}

// A bad TILEATTN_SPIN_US reaches the caller as an Error even when the first
// parallel step of a process asks whether the workers sleep (the pool is made
// there): the pool checks it before its workers, which read it on their own
// threads, exist. In a fresh process (threadsafe death test), where the
// setting has not been read yet.
TEST(ForwardThreads, BadSpinSettingThrowsFromTheFirstCall) {
  if (hardware_threads() < 2) GTEST_SKIP() << "one hardware thread: no pool";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TILEATTN_SPIN_US", "abc", 1);
        DecodeLikeCall first(128);
        try {
          first.run();
        } catch (const Error& e) {
          // Time for a worker that read the setting itself to fail (abort).
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          std::_Exit(std::string(e.what()).find("TILEATTN_SPIN_US") != std::string::npos ? 0 : 3);
        }
        std::_Exit(4);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tileattn::detail
