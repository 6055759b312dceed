#include <cmath>
#include <cstring>
#include <limits>

#include "core/isa_entry.hpp"
#include "core/problem.hpp"
#include "isa/avx2/kernels.hpp"

namespace tileattn::detail::avx2 {
#include "core/mainloop.hpp"
}  // namespace tileattn::detail::avx2

namespace tileattn::detail {
void forward_item_avx2(const Problem& p, const WorkItem& w, float* scratch) {
  avx2::run_forward_item(p, w, scratch);
}
}  // namespace tileattn::detail
