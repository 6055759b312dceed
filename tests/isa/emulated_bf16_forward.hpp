// attention_forward on the emulated bf16 product rungs: the forward main loop
// instantiated with Bf16DotKernels (Isa::avx512bf16) and AmxKernels
// (Isa::amx) compiled against the AVX-512 emulation and the AMX tile model
// (emulated_bf16_kernels.hpp), planned exactly as attention_forward plans a
// call on that Isa (for bf16 inputs: Problem::product = bf16_dot). Defined in
// emulated_bf16_forward.cpp, so the main loop is compiled once for the tests.
#pragma once

#include "tileattn/attention.hpp"

namespace tileattn::testing {

// Validates and runs `args` (its isa is ignored) as `isa` (Isa::avx512bf16 or
// Isa::amx) would. Returns false, having run nothing, when the plan takes the
// few-rows (decode) path and this CPU cannot run those products natively (no
// AVX2/FMA/F16C): the caller then skips.
[[nodiscard]] bool emulated_bf16_forward(const ForwardArgs& args, Isa isa);

// The emulated rungs' packers read fp8 e4m3 K/V rows through the fp32 loads
// (a CPU without VBMI) while `on`, else on the byte permutes (default).
void emulated_fp8_rows_on_fp32(bool on);

// vpermt2b instructions the AVX-512 emulation has run so far, all threads
// (the fp8 -> bf16 conversion of the avx512bf16 rung's decode scores,
// few_rows_dot.hpp).
int64_t emulated_byte_permute_count();

// vdpbf16ps instructions the AVX-512 emulation has run so far, all threads
// (the avx512bf16 rung's packed products and its bf16 decode scores).
int64_t emulated_bf16_dot_count();

}  // namespace tileattn::testing
