#include "core/thread_pool.hpp"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

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

class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    for (int w = 1; w <= workers; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int workers() const { return static_cast<int>(threads_.size()); }

  // Caller must hold busy_.
  void run(int64_t count, int helpers, const std::function<void(int64_t, int)>& body) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body_ = &body;
      count_ = count;
      next_.store(0, std::memory_order_relaxed);
      helpers_ = helpers;
      pending_ = helpers;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    drain(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

  std::mutex busy_;  // one parallel region at a time

 private:
  void drain(int worker) {
    for (;;) {
      int64_t item = next_.fetch_add(1, std::memory_order_relaxed);
      if (item >= count_) return;
      try {
        (*body_)(item, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(count_, std::memory_order_relaxed);
      }
    }
  }

  void worker_loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        if (worker > helpers_) continue;  // not needed this round
      }
      drain(worker);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  bool stopping_ = false;
  uint64_t generation_ = 0;
  const std::function<void(int64_t, int)>* body_ = nullptr;
  int64_t count_ = 0;
  std::atomic<int64_t> next_{0};
  int helpers_ = 0;
  int pending_ = 0;
  std::exception_ptr error_;
};

ThreadPool& pool() {
  static ThreadPool instance(hardware_threads() - 1);
  return instance;
}

}  // namespace

void parallel_for(int64_t count, int threads, const std::function<void(int64_t, int)>& body) {
  if (count <= 0) return;
  int helpers = threads - 1;
  if (helpers > count - 1) helpers = static_cast<int>(count - 1);
  ThreadPool& p = pool();
  if (helpers > p.workers()) helpers = p.workers();
  std::unique_lock<std::mutex> busy(p.busy_, std::try_to_lock);
  if (helpers <= 0 || !busy.owns_lock()) {
    // Single-threaded, or another caller holds the pool: run here. Results are
    // the same, since each item is computed whole by one thread.
    for (int64_t i = 0; i < count; ++i) body(i, 0);
    return;
  }
  p.run(count, helpers, body);
}

}  // namespace tileattn::detail
