#include <cmath>
#include <cstring>
#include <limits>

#include "core/isa_entry.hpp"
#include "isa/generic/kernels.hpp"
#include "training/backward_problem.hpp"

namespace tileattn::detail::generic {
#include "core/backward_mainloop.hpp"
}  // namespace tileattn::detail::generic

namespace tileattn::detail {
void backward_item_generic(const BackwardProblem& p, const BackwardItem& w, float* scratch) {
  generic::run_backward_item(p, w, scratch);
}
}  // namespace tileattn::detail
