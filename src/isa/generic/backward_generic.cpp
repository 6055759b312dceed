#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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
void backward_normalizers_generic(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                               int64_t count, float* scratch) {
  generic::run_backward_normalizers(p, b, h, rows, count, scratch);
}
}  // namespace tileattn::detail
