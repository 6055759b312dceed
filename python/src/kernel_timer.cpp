#include "kernel_timer.hpp"

#include <time.h>

#include <atomic>

namespace tileattn::python {

namespace {

std::atomic<bool> g_enabled{false};
// Written by whichever thread runs a kernel; the benchmark runs one thread.
std::atomic<double> g_seconds{0.0};

}  // namespace

bool kernel_timing_enabled() { return g_enabled.load(std::memory_order_relaxed); }

double clock_seconds() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

void add_kernel_seconds(double seconds) {
  double seen = g_seconds.load();
  while (!g_seconds.compare_exchange_weak(seen, seen + seconds)) {
  }
}

void run_forward(const ForwardArgs& args) {
  run_timed([&] { attention_forward(args); });
}

void bind_kernel_timer(nanobind::module_& m) {
  m.def(
      "time_kernel",
      [](bool enabled) {
        g_enabled = enabled;
        return g_seconds.exchange(0.0);
      },
      nanobind::arg("enabled"),
      "benchmark aid: turns on/off timing (CLOCK_MONOTONIC) of the library calls "
      "(attention_forward, attention_with_kvcache) in the bindings; returns the seconds "
      "counted since the last call and resets the count");
}

}  // namespace tileattn::python
