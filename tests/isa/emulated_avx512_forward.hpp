// attention_forward on the emulated AVX-512 path: the forward main loop
// instantiated with the AVX-512 Kernels on the scalar emulation
// (emulated_avx512_kernels.hpp), planned exactly as attention_forward plans a
// call on Isa::avx512 (its tile shapes, GQA stacking, key splits). Defined in
// emulated_avx512_forward.cpp, so the main loop is compiled once for the tests.
#pragma once

#include "tileattn/attention.hpp"

namespace tileattn::testing {

// Validates and runs `args` (its isa is ignored) as Isa::avx512 would. Returns
// false, having run nothing, when the plan takes the few-rows (decode) path
// and this CPU cannot run those products natively (no AVX2/FMA/F16C): the
// caller then skips.
[[nodiscard]] bool emulated_avx512_forward(const ForwardArgs& args);

// Whether the emulated AVX-512 main loop runs `args` with the few-rows tile
// products (the same rule as ForwardMainloop: stacked rows <= kFewRowsMax).
bool emulated_avx512_takes_few_rows_path(const ForwardArgs& args);

}  // namespace tileattn::testing
