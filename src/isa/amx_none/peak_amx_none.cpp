// Built instead of isa/amx/peak_amx.cpp when the compiler has no AMX
// intrinsics (CMakeLists.txt): no AMX peak to measure.
#include "core/peak_kernels.hpp"

namespace tileattn::detail {

bool request_amx_permission() { return false; }

bool amx_peak_built() { return false; }

double amx_bf16_loop(int64_t, float*) { return 0; }

}  // namespace tileattn::detail
