// The avx512bf16 rung's backward main loop and normalizer pass: bf16 inputs on
// Bf16DotKernels's bf16 products (backward_mainloop.hpp); other dtypes run
// the avx512 ones.
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
void backward_normalizers_avx512bf16(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                                     int64_t count, float* scratch) {
  avx512bf16::loop::run_backward_normalizers(p, b, h, rows, count, scratch);
}
}  // namespace tileattn::detail
