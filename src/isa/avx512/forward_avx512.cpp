#include <cmath>
#include <cstring>
#include <limits>

#include "core/isa_entry.hpp"
#include "core/problem.hpp"
#include "isa/avx512/kernels.hpp"

namespace tileattn::detail::avx512 {
#include "core/mainloop.hpp"
}  // namespace tileattn::detail::avx512

namespace tileattn::detail {
void forward_item_avx512(const Problem& p, const WorkItem& w, float* scratch) {
  avx512::run_forward_item(p, w, scratch);
}
}  // namespace tileattn::detail
