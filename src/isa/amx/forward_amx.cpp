// The amx rung's forward main loop: bf16 inputs on AMX-BF16 tiles
// (AmxKernels); the AVX-512 kernels for everything else in the loop.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/isa_entry.hpp"
#include "core/peak_kernels.hpp"
#include "core/problem.hpp"

#define TILEATTN_AVX512_NAMESPACE amx
#include "isa/amx/amx_kernels.hpp"

namespace tileattn::detail::amx::loop {
using Kernels = AmxKernels;
#include "core/mainloop.hpp"
}  // namespace tileattn::detail::amx::loop

namespace tileattn::detail {
void forward_item_amx(const Problem& p, const WorkItem& w, float* scratch) {
  amx::loop::run_forward_item(p, w, scratch);
}

bool bf16_products_built() { return true; }
}  // namespace tileattn::detail
