// A benchmark aid (python/benchmarks/call_overhead.py): the forward bindings
// run attention_forward through run_forward, which, when timing is on, adds
// the calling thread's CPU time spent in the kernel to a counter. The cost of
// everything around the kernel can then be told apart from the kernel's in the
// very same calls. Off by default: reading a thread's CPU clock is a system call.
#pragma once

#include <nanobind/nanobind.h>

#include "tileattn/attention.hpp"

namespace tileattn::python {

// attention_forward(args), timed when timing is on. Call without the GIL.
void run_forward(const ForwardArgs& args);

// _tileattn.time_kernel(enabled) -> seconds since the last call.
void bind_kernel_timer(nanobind::module_& m);

}  // namespace tileattn::python
