// The per-ISA entry points of the forward main loop. Each is defined in its own
// translation unit, compiled with that ISA's flags; forward.cpp picks one per call.
#pragma once

#include "core/problem.hpp"

namespace tileattn::detail {

using ForwardItemFn = void (*)(const Problem& p, const WorkItem& w, float* scratch);

void forward_item_generic(const Problem& p, const WorkItem& w, float* scratch);
void forward_item_avx2(const Problem& p, const WorkItem& w, float* scratch);
void forward_item_avx512(const Problem& p, const WorkItem& w, float* scratch);

}  // namespace tileattn::detail
