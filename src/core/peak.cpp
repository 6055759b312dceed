// FP32 FMA peak: every thread runs its ISA's register-only loop (no memory
// traffic) for a fixed number of iterations, started together; the rate is
// total flops over the wall time until the last thread is done.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/peak_kernels.hpp"
#include "core/thread_pool.hpp"
#include "tileattn/machine.hpp"

namespace tileattn {

namespace {

using Clock = std::chrono::steady_clock;
using LoopFn = double (*)(int64_t, float*);

LoopFn loop_for(Isa isa) {
  switch (isa) {
    case Isa::amx:
    case Isa::avx512bf16:  // their fp32 and fp16 inputs run the AVX-512 FMAs
    case Isa::avx512: return detail::fma_loop_avx512;
    case Isa::avx2: return detail::fma_loop_avx2;
    default: return detail::fma_loop_generic;
  }
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Iterations that take about `seconds` on one thread.
int64_t calibrate(LoopFn loop, double seconds) {
  float sink = 0;
  int64_t iterations = 1 << 12;
  for (;;) {
    const Clock::time_point start = Clock::now();
    loop(iterations, &sink);
    const double elapsed = seconds_since(start);
    if (elapsed >= 0.02 || iterations > (int64_t{1} << 40))
      return std::max<int64_t>(1, int64_t(double(iterations) * seconds / std::max(elapsed, 1e-9)));
    iterations *= 4;
  }
}

// GFLOP/s of `threads` threads running `loop`, started together; best of `reps`.
double measure_loop_gflops(LoopFn loop, int threads, double seconds, int reps) {
  const int hw = hardware_threads();
  if (threads <= 0 || threads > hw) threads = hw;
  const int64_t iterations = calibrate(loop, seconds);
  double best = 0;
  for (int rep = 0; rep < std::max(1, reps); ++rep) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<double> flops(size_t(threads), 0.0);
    std::vector<float> sinks(size_t(threads) * 16, 0.0f);  // one cache line each
    auto work = [&](int t) {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      flops[size_t(t)] = loop(iterations, &sinks[size_t(t) * 16]);
    };
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) workers.emplace_back(work, t);
    while (ready.load() < threads - 1) std::this_thread::yield();
    const Clock::time_point start = Clock::now();
    go.store(true, std::memory_order_release);
    work(0);
    for (std::thread& w : workers) w.join();
    const double elapsed = seconds_since(start);
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / elapsed * 1e-9);
  }
  return best;
}

}  // namespace

double measure_fma_peak_gflops(int threads, Isa isa, double seconds, int reps) {
  Isa path = isa == Isa::automatic ? best_isa() : isa;
  if (path == Isa::reference || !isa_available(path)) path = Isa::generic;
  return measure_loop_gflops(loop_for(path), threads, seconds, reps);
}

double measure_bf16_dot_peak_gflops(int threads, double seconds, int reps) {
  if (!isa_available(Isa::avx512bf16)) return 0;
  return measure_loop_gflops(detail::bf16_dot_loop_avx512bf16, threads, seconds, reps);
}

bool amx_bf16_usable() { return cpu_features().amx_bf16 && detail::request_amx_permission(); }

double measure_amx_bf16_peak_gflops(int threads, double seconds, int reps) {
  if (!amx_bf16_usable()) return 0;
  return measure_loop_gflops(detail::amx_bf16_loop, threads, seconds, reps);
}

}  // namespace tileattn
