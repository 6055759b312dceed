#include <cmath>
#include <cstring>
#include <limits>

#include "core/isa_entry.hpp"
#include "core/problem.hpp"
#include "isa/generic/kernels.hpp"

namespace tileattn::detail::generic {
#include "core/mainloop.hpp"
}  // namespace tileattn::detail::generic

namespace tileattn::detail {
void forward_item_generic(const Problem& p, const WorkItem& w, float* scratch) {
  generic::run_forward_item(p, w, scratch);
}
}  // namespace tileattn::detail
