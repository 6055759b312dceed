// The avx512bf16 rung's forward main loop: bf16 inputs on vdpbf16ps
// (Bf16DotKernels); the AVX-512 kernels for everything else in the loop.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/isa_entry.hpp"
#include "core/problem.hpp"

#define TILEATTN_AVX512_NAMESPACE avx512bf16
#include "isa/avx512bf16/bf16_kernels.hpp"

namespace tileattn::detail::avx512bf16::loop {
using Kernels = Bf16DotKernels;
#include "core/mainloop.hpp"
}  // namespace tileattn::detail::avx512bf16::loop

namespace tileattn::detail {
void forward_item_avx512bf16(const Problem& p, const WorkItem& w, float* scratch) {
  avx512bf16::loop::run_forward_item(p, w, scratch);
}
}  // namespace tileattn::detail
