// attention_backward on the emulated bf16 product rungs: the backward main
// loop and normalizer pass instantiated with Bf16DotKernels (Isa::avx512bf16)
// and AmxKernels (Isa::amx) compiled against the AVX-512 emulation and the
// AMX tile model (emulated_bf16_kernels.hpp), run through the backward's own
// passes (detail::run_backward_passes) as attention_backward runs a call on
// that Isa. Defined in emulated_bf16_backward.cpp.
#pragma once

#include "tileattn/backward.hpp"

namespace tileattn::testing {

// Validates and runs `args` (bf16 inputs; its forward.isa is ignored) as
// `isa` (Isa::avx512bf16 or Isa::amx) would.
void emulated_bf16_backward(const BackwardArgs& args, Isa isa);

}  // namespace tileattn::testing
