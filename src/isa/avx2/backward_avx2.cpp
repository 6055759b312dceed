#include <cmath>
#include <cstring>
#include <limits>

#include "core/isa_entry.hpp"
#include "isa/avx2/kernels.hpp"
#include "training/backward_problem.hpp"

namespace tileattn::detail::avx2 {
#include "core/backward_mainloop.hpp"
}  // namespace tileattn::detail::avx2

namespace tileattn::detail {
void backward_item_avx2(const BackwardProblem& p, const BackwardItem& w, float* scratch) {
  avx2::run_backward_item(p, w, scratch);
}
}  // namespace tileattn::detail
