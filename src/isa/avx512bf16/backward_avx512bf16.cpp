// The avx512bf16 rung's backward main loop: bf16 inputs on Bf16DotKernels's bf16
// products (backward_mainloop.hpp); other dtypes run backward_item_avx512.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/isa_entry.hpp"
#include "training/backward_problem.hpp"

#define TILEATTN_AVX512_NAMESPACE avx512bf16
#include "isa/avx512bf16/bf16_kernels.hpp"

namespace tileattn::detail::avx512bf16::loop {
using Kernels = Bf16DotKernels;
#include "core/backward_mainloop.hpp"
}  // namespace tileattn::detail::avx512bf16::loop

namespace tileattn::detail {
void backward_item_avx512bf16(const BackwardProblem& p, const BackwardItem& w, float* scratch) {
  avx512bf16::loop::run_backward_item(p, w, scratch);
}
}  // namespace tileattn::detail
