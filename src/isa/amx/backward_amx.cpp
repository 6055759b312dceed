// The amx rung's backward main loop and normalizer pass: bf16 inputs on
// AmxKernels's bf16 products (backward_mainloop.hpp); other dtypes run the
// avx512 ones.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/isa_entry.hpp"
#include "training/backward_problem.hpp"

#define TILEATTN_AVX512_NAMESPACE amx
#include "isa/amx/amx_kernels.hpp"

namespace tileattn::detail::amx::loop {
using Kernels = AmxKernels;
#include "core/backward_mainloop.hpp"
}  // namespace tileattn::detail::amx::loop

namespace tileattn::detail {
void backward_item_amx(const BackwardProblem& p, const BackwardItem& w, float* scratch) {
  amx::loop::run_backward_item(p, w, scratch);
}
void backward_normalizers_amx(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                              int64_t count, float* scratch) {
  amx::loop::run_backward_normalizers(p, b, h, rows, count, scratch);
}
}  // namespace tileattn::detail
