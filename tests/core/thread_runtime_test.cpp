// set_thread_runtime (include/tileattn/machine.hpp, src/core/thread_pool.cpp):
// parallel regions on another runtime's threads. Every item runs once on a
// worker index below the thread count whatever team the runtime gives (fewer
// threads, more, or none), exceptions reach the caller, the test hook deals
// items to every thread of the team, and a forward call gives the pool's
// bits. Run under ThreadSanitizer by scripts/sanitize.sh (suite *Thread*).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::detail {
namespace {

// Threads of the test runtime's last regions (std::thread ids), and how many
// it gives for `threads` asked: as asked, one, two more, or none.
enum class Team { as_asked, one, more, none };
std::atomic<Team> team_policy{Team::as_asked};
std::mutex ids_mutex;
std::set<std::thread::id> runtime_ids;

void record_id() {
  std::lock_guard<std::mutex> lock(ids_mutex);
  runtime_ids.insert(std::this_thread::get_id());
}

// A runtime that starts its threads per region (what an OpenMP team does
// with threads it keeps; enough for the contract).
void run_team(void (*fn)(void*, int, int), void* ctx, int threads) {
  const Team policy = team_policy.load();
  const int n = policy == Team::none ? 0 : policy == Team::one ? 1 : policy == Team::more ? threads + 2 : threads;
  std::vector<std::thread> helpers;
  for (int t = 1; t < n; ++t)
    helpers.emplace_back([=] {
      record_id();
      fn(ctx, t, n);
    });
  if (n > 0) {
    record_id();
    fn(ctx, 0, n);
  }
  for (std::thread& h : helpers) h.join();
}

const ThreadRuntime kTestRuntime{"test runtime", run_team};

// Installs the test runtime for a test's scope.
struct WithTestRuntime {
  explicit WithTestRuntime(Team policy) {
    team_policy.store(policy);
    std::lock_guard<std::mutex> lock(ids_mutex);
    runtime_ids.clear();
    set_thread_runtime(&kTestRuntime);
  }
  ~WithTestRuntime() { set_thread_runtime(nullptr); }
};

void expect_each_item_once_on_the_runtime(int64_t count, int threads) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
  std::atomic<int> bad_worker{0}, outside{0};
  parallel_for(count, threads, [&](int64_t item, int worker) {
    hits[static_cast<size_t>(item)].fetch_add(1, std::memory_order_relaxed);
    if (worker < 0 || worker >= std::max(1, threads)) bad_worker.fetch_add(1);
    std::lock_guard<std::mutex> lock(ids_mutex);
    // Items run on the runtime's threads, or on the caller (the runtime ran none).
    if (!runtime_ids.count(std::this_thread::get_id()) && team_policy.load() != Team::none &&
        !(threads <= 1 || count <= 1))
      outside.fetch_add(1);
  });
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "item " << i;
  EXPECT_EQ(bad_worker.load(), 0);
  EXPECT_EQ(outside.load(), 0) << "items ran on threads the runtime did not give";
}

TEST(ThreadRuntime, ItemsRunOnceOnTheRuntimesThreadsWhateverTeamItGives) {
  for (Team policy : {Team::as_asked, Team::one, Team::more, Team::none}) {
    WithTestRuntime runtime(policy);
    EXPECT_STREQ(thread_runtime(), "test runtime");
    EXPECT_FALSE(pool_workers_asleep());
    for (int threads : {1, 2, 3, 8})
      for (int64_t count : {0, 1, 2, 7, 1000}) {
        SCOPED_TRACE(::testing::Message() << "policy " << int(policy) << " threads " << threads << " count " << count);
        expect_each_item_once_on_the_runtime(count, threads);
        if (HasFatalFailure()) return;
      }
  }
  EXPECT_STREQ(thread_runtime(), "pool");
}

TEST(ThreadRuntime, ARuntimeWithoutNameOrRunIsRefused) {
  const ThreadRuntime no_run{"no run", nullptr}, no_name{nullptr, run_team};
  EXPECT_THROW(set_thread_runtime(&no_run), Error);
  EXPECT_THROW(set_thread_runtime(&no_name), Error);
  EXPECT_STREQ(thread_runtime(), "pool");
}

// Whatever team the runtime gives, and with the test hook's dealing too.
TEST(ThreadRuntime, ExceptionReachesTheCaller) {
  for (Team policy : {Team::as_asked, Team::one, Team::more, Team::none})
    for (bool round_robin : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "policy " << int(policy) << " round robin " << round_robin);
      WithTestRuntime runtime(policy);
      set_every_thread_runs_items(round_robin);
      for (int r = 0; r < 5; ++r) {
        EXPECT_THROW(parallel_for(64, 2,
                                  [](int64_t item, int) {
                                    if (item == 13) throw std::runtime_error("item 13");
                                  }),
                     std::runtime_error);
        expect_each_item_once_on_the_runtime(64, 2);
      }
      set_every_thread_runs_items(false);
    }
}

// The determinism tests' hook deals the items round-robin to the team the
// runtime gave, so that each of its threads runs some (of a team larger than
// asked, only the threads numbered below the count asked for).
TEST(ThreadRuntime, EveryThreadHookDealsToTheWholeTeam) {
  for (Team policy : {Team::as_asked, Team::one, Team::more}) {
    WithTestRuntime runtime(policy);
    set_every_thread_runs_items(true);
    for (int64_t count : {1, 3, 7, 40}) {
      reset_thread_census();
      std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
      std::atomic<int> bad_worker{0};
      parallel_for(count, 4, [&](int64_t item, int worker) {
        hits[static_cast<size_t>(item)].fetch_add(1);
        if (worker < 0 || worker >= 4) bad_worker.fetch_add(1);
      });
      for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
      EXPECT_EQ(bad_worker.load(), 0) << "count " << count;
      const int64_t team = policy == Team::one ? 1 : std::min<int64_t>(4, count);
      EXPECT_EQ(thread_census().max_threads, team) << "count " << count;
    }
    set_every_thread_runs_items(false);
  }
}

// A forward call with many work items: the same bits on the runtime's
// threads as on the pool's.
TEST(ThreadRuntime, ForwardGivesThePoolsBits) {
  const int64_t heads = 6, seq = 300, dim = 64;
  std::vector<float> q(size_t(heads * seq * dim)), k(q.size()), v(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = float((i * 7919) % 1000) / 500.0f - 1.0f;
    k[i] = float((i * 104729) % 1000) / 500.0f - 1.0f;
    v[i] = float((i * 1299709) % 1000) / 500.0f - 1.0f;
  }
  auto run = [&] {
    std::vector<float> o(q.size()), lse(size_t(heads * seq));
    ForwardArgs a;
    a.shape = {1, heads, heads, seq, seq, dim, 0};
    a.q = {q.data(), dense_strides(Layout::bhsd, 1, heads, seq, dim)};
    a.k = {k.data(), a.q.stride};
    a.v = {v.data(), a.q.stride};
    a.o = {o.data(), a.q.stride};
    a.lse = lse.data();
    a.lse_stride = {heads * seq, seq, 1};
    a.mask.causal = true;
    a.threads = 3;
    attention_forward(a);
    o.insert(o.end(), lse.begin(), lse.end());
    return o;
  };
  const std::vector<float> on_pool = run();
  WithTestRuntime runtime(Team::as_asked);
  const std::vector<float> on_runtime = run();
  ASSERT_EQ(on_pool.size(), on_runtime.size());
  EXPECT_EQ(std::memcmp(on_pool.data(), on_runtime.data(), on_pool.size() * sizeof(float)), 0);
  std::lock_guard<std::mutex> lock(ids_mutex);
  EXPECT_GE(runtime_ids.size(), 2u) << "the call did not run on the runtime's threads";
}

}  // namespace
}  // namespace tileattn::detail
