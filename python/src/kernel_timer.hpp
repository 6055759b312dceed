// A benchmark aid (python/benchmarks/call_overhead.py): the bindings run the
// library's entry points (attention_forward, attention_with_kvcache) through
// run_timed, which, when timing is on, adds the time spent in the library
// call to a counter. The cost of everything around the kernel can then be
// told apart from the kernel's in the very same calls. The clock is
// CLOCK_MONOTONIC, read in user space (vDSO, ~25 ns), not the thread's CPU
// clock: that one is a system call, and right after a decode-sized kernel the
// two system calls cost 2-8 us of their own here, which the benchmark counted
// as call overhead. Off by default.
#pragma once

#include <nanobind/nanobind.h>

#include "tileattn/attention.hpp"

namespace tileattn::python {

// Timing state, see kernel_timer.cpp.
bool kernel_timing_enabled();
double clock_seconds();
void add_kernel_seconds(double seconds);

// call(), timed when timing is on. Call without the GIL.
template <typename Call>
void run_timed(Call&& call) {
  if (!kernel_timing_enabled()) {
    call();
    return;
  }
  const double start = clock_seconds();
  call();
  add_kernel_seconds(clock_seconds() - start);
}

// attention_forward(args), timed when timing is on. Call without the GIL.
void run_forward(const ForwardArgs& args);

// _tileattn.time_kernel(enabled) -> seconds since the last call.
void bind_kernel_timer(nanobind::module_& m);

}  // namespace tileattn::python
