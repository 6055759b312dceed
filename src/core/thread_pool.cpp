#include "core/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tileattn/machine.hpp"
#include "tileattn/types.hpp"

namespace tileattn::detail {

int hardware_threads() {
  // Read once: hardware_concurrency() opens a /sys file on every call, which
  // was a quarter of the time of a tiny decode call.
  static const int threads = [] {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }();
  return threads;
}

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Waits up to `spin` for pred() to hold, checking it between pause
// instructions; returns whether it did.
template <class Pred>
bool spin_until(std::chrono::nanoseconds spin, Pred pred) {
  if (spin.count() <= 0) return pred();
  const auto deadline = std::chrono::steady_clock::now() + spin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

// How long a worker keeps polling for the next parallel region after one
// ends before it sleeps on a condition variable. A sleeping thread on this VM
// (2-core Zen 3 guest) takes about 100 us to wake. Decode steps back to back
// (bf16, 32/8 heads, 2 threads): 256 cached tokens 93 -> 55 us with polling
// (121 us on one thread), 16 tokens 30 -> 12.5 us. Kept short (50 us) because
// in a model the next attention call comes after other layers' work, which
// a polling worker would take a core from: whole Llama layer per token
// (projections on torch's threads), 200 us of polling gave sdpa/tileattn
// 1.05 / 1.03 against 1.06 / 1.04 without, within the noise. OpenMP runtimes
// poll likewise (libgomp's GOMP_SPINCOUNT, Intel's KMP_BLOCKTIME).
// TILEATTN_SPIN_US sets it (0: no polling anywhere). Throws Error for a value
// that is not an integer in 0..10^7; the first call is parallel_for's, on
// the calling thread.
std::chrono::nanoseconds spin_window() {
  static const std::chrono::nanoseconds window = [] {
    constexpr long long kDefaultMicroseconds = 50, kMaxMicroseconds = 10'000'000;
    const char* e = std::getenv("TILEATTN_SPIN_US");
    long long us = kDefaultMicroseconds;
    if (e && *e) {
      char* end = nullptr;
      errno = 0;
      us = std::strtoll(e, &end, 10);
      if (*end != '\0' || errno != 0 || us < 0 || us > kMaxMicroseconds)
        throw Error(std::string("TILEATTN_SPIN_US: expected microseconds 0..10000000, got '") + e + "'");
    }
    return std::chrono::nanoseconds(us * 1000);
  }();
  return window;
}

// How long the calling thread polls for its helpers to finish before it
// sleeps: it has nothing else to do, and a sleeping caller woken by the last
// helper added ~100 us to every call (16 cached tokens: 34 us on 2 threads
// against 23 us on one).
std::chrono::nanoseconds caller_spin_window() { return 10 * spin_window(); }

// The items of one parallel region and how threads take them: in index
// order through an atomic counter, or, for the test hook, thread w of n
// takes items w, w + n, ... The first exception a body throws is kept (the
// caller rethrows it) and ends the handing out.
struct Region {
  const std::function<void(int64_t, int)>* body = nullptr;
  int64_t count = 0;
  bool round_robin = false;
  std::atomic<int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  void drain(int worker, int threads) {
    for (int64_t taken = 0;; ++taken) {
      const int64_t item = round_robin ? worker + taken * threads : next.fetch_add(1, std::memory_order_relaxed);
      if (round_robin && next.load(std::memory_order_relaxed) >= count) return;  // an item threw
      if (item >= count) return;
      try {
        (*body)(item, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(count, std::memory_order_relaxed);
      }
    }
  }
};

class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    for (int w = 1; w <= workers; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_.store(true, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int workers() const { return static_cast<int>(threads_.size()); }
  // Workers asleep on the condition variable now (not polling, not in a region).
  int sleeping() const { return sleeping_.load(std::memory_order_relaxed); }

  // Caller must hold busy_. `round_robin`: wait for all `helpers` to join,
  // then thread w runs items w, w + helpers + 1, ... (the test hook).
  void run(int64_t count, int helpers, const std::function<void(int64_t, int)>& body, bool round_robin) {
    Region region;
    region.body = &body;
    region.count = count;
    region.round_robin = round_robin;
    region_ = &region;
    joined_.store(0, std::memory_order_relaxed);
    {
      // Under the mutex: a worker about to sleep checks the generation under
      // it, and a worker joins only while the region is open (worker_loop).
      std::lock_guard<std::mutex> lock(mutex_);
      helpers_ = helpers;
      open_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    if (round_robin) {
      while (joined_.load(std::memory_order_acquire) < helpers) std::this_thread::yield();
    }
    region.drain(0, helpers + 1);
    {
      // Every item is claimed: close the region, so that a worker that wakes
      // only now stays out of it, and wait only for those that joined. A
      // sleeping worker takes ~100 us to wake; waiting for it made a small
      // call slower on two threads than on one (256 cached tokens, the
      // worker asleep: 138 us against 84 us on one thread).
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = false;
    }
    if (!spin_until(caller_spin_window(), [this] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    region_ = nullptr;
    if (region.error) std::rethrow_exception(region.error);
  }

  std::mutex busy_;  // one parallel region at a time

 private:
  void worker_loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
      auto news = [&] {
        return stopping_.load(std::memory_order_acquire) ||
               generation_.load(std::memory_order_acquire) != seen;
      };
      if (!spin_until(spin_window(), news)) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1, std::memory_order_relaxed);
        wake_.wait(lock, news);
        sleeping_.fetch_sub(1, std::memory_order_relaxed);
      }
      if (stopping_.load(std::memory_order_acquire)) return;
      seen = generation_.load(std::memory_order_acquire);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        // Not needed this round, or the region closed (or a newer one opened)
        // while this worker was waking.
        if (worker > helpers_ || !open_ || generation_.load(std::memory_order_relaxed) != seen) continue;
        pending_.fetch_add(1, std::memory_order_relaxed);
        joined_.fetch_add(1, std::memory_order_release);
      }
      region_->drain(worker, helpers_ + 1);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_all();
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> generation_{0};
  Region* region_ = nullptr;  // set before the region opens
  int helpers_ = 0;       // guarded by mutex_
  std::atomic<int> joined_{0};    // workers that joined this region
  bool open_ = false;     // guarded by mutex_: workers may still join the region
  std::atomic<int> pending_{0};  // workers that joined and have not finished
  std::atomic<int> sleeping_{0};  // workers waiting on wake_
};

// TILEATTN_SPIN_US is checked before the workers exist: each reads it on its
// own thread, where a bad value's Error would terminate the process.
ThreadPool& pool() {
  static ThreadPool instance((spin_window(), hardware_threads() - 1));
  return instance;
}

std::atomic<bool>& every_thread_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}
std::mutex& census_mutex() {
  static std::mutex m;
  return m;
}
ThreadCensus& census() {
  static ThreadCensus c;
  return c;
}
void record_census(int threads, int64_t items) {
  std::lock_guard<std::mutex> lock(census_mutex());
  ThreadCensus& c = census();
  c.max_threads = std::max(c.max_threads, threads);
  c.max_items = std::max(c.max_items, items);
}

std::atomic<const ThreadRuntime*>& runtime_slot() {
  static std::atomic<const ThreadRuntime*> runtime{nullptr};
  return runtime;
}

// The region on the installed runtime's threads: each takes items as the
// pool's threads do; a thread numbered past `threads` (a runtime that gave
// more than asked) takes none, since the callers' scratch has `threads` slots.
void run_on(const ThreadRuntime& runtime, int64_t count, int threads, const std::function<void(int64_t, int)>& body,
            bool round_robin) {
  struct Call {
    Region region;
    int threads;
    std::atomic<bool> started{false};
  } call;
  call.region.body = &body;
  call.region.count = count;
  call.region.round_robin = round_robin;
  call.threads = threads;
  runtime.run(
      [](void* ctx, int thread, int team) {
        Call& c = *static_cast<Call*>(ctx);
        c.started.store(true, std::memory_order_relaxed);
        if (thread < 0 || thread >= c.threads) return;
        c.region.drain(thread, team < c.threads ? team : c.threads);
      },
      &call, threads);
  // Items no thread took (the runtime ran none): here.
  if (!call.started.load(std::memory_order_relaxed)) call.region.round_robin = false;
  if (!call.region.round_robin) call.region.drain(0, 1);
  if (call.region.error) std::rethrow_exception(call.region.error);
}

}  // namespace

namespace {

// One region of `count` items on the installed runtime's threads, else on the
// pool's (the caller alone where the pool is busy or no helper is wanted).
// `round_robin`: the test hook's dealing.
void run_region(int64_t count, int helpers, const std::function<void(int64_t, int)>& body, bool round_robin) {
  if (const ThreadRuntime* runtime = runtime_slot().load(std::memory_order_acquire); runtime && helpers > 0)
    return run_on(*runtime, count, helpers + 1, body, round_robin);
  ThreadPool& p = pool();
  if (helpers > p.workers()) helpers = p.workers();
  std::unique_lock<std::mutex> busy(p.busy_, std::try_to_lock);
  if (helpers <= 0 || !busy.owns_lock()) {
    // Single-threaded, or another caller holds the pool: run here. Results are
    // the same, since each item is computed whole by one thread.
    for (int64_t i = 0; i < count; ++i) body(i, 0);
    return;
  }
  p.run(count, helpers, body, round_robin);
}

}  // namespace

void parallel_for(int64_t count, int threads, const std::function<void(int64_t, int)>& body) {
  if (count <= 0) return;
  spin_window();  // a bad TILEATTN_SPIN_US fails here, on the caller's thread
  int helpers = threads - 1;
  if (helpers > count - 1) helpers = static_cast<int>(count - 1);
  if (!every_thread_runs_items()) return run_region(count, helpers, body, false);
  // The test hook: count the distinct threads that run items.
  std::atomic<uint64_t> seen{0};
  const std::function<void(int64_t, int)> counted = [&](int64_t item, int worker) {
    seen.fetch_or(uint64_t{1} << (worker & 63), std::memory_order_relaxed);
    body(item, worker);
  };
  run_region(count, helpers, counted, true);
  record_census(__builtin_popcountll(seen.load()), count);
}

bool pool_workers_asleep() {
  return runtime_slot().load(std::memory_order_acquire) == nullptr && pool().sleeping() > 0;
}

int64_t spin_window_ns() { return spin_window().count(); }

void set_every_thread_runs_items(bool on) { every_thread_flag().store(on, std::memory_order_relaxed); }
bool every_thread_runs_items() { return every_thread_flag().load(std::memory_order_relaxed); }

void reset_thread_census() {
  std::lock_guard<std::mutex> lock(census_mutex());
  census() = ThreadCensus{};
}

ThreadCensus thread_census() {
  std::lock_guard<std::mutex> lock(census_mutex());
  return census();
}

}  // namespace tileattn::detail

namespace tileattn {

void set_thread_runtime(const ThreadRuntime* runtime) {
  if (runtime && !runtime->name) throw Error("set_thread_runtime: runtime->name is null");
  if (runtime && !runtime->run) throw Error("set_thread_runtime: runtime->run is null");
  detail::runtime_slot().store(runtime, std::memory_order_release);
}

const char* thread_runtime() {
  const ThreadRuntime* runtime = detail::runtime_slot().load(std::memory_order_acquire);
  return runtime ? runtime->name : "pool";
}

}  // namespace tileattn
