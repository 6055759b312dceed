#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/isa_entry.hpp"
#include "isa/avx512/kernels.hpp"
#include "training/backward_problem.hpp"

namespace tileattn::detail::avx512 {
#include "core/backward_mainloop.hpp"
}  // namespace tileattn::detail::avx512

namespace tileattn::detail {
void backward_item_avx512(const BackwardProblem& p, const BackwardItem& w, float* scratch) {
  avx512::run_backward_item(p, w, scratch);
}
void backward_normalizers_avx512(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                               int64_t count, float* scratch) {
  avx512::run_backward_normalizers(p, b, h, rows, count, scratch);
}
}  // namespace tileattn::detail
