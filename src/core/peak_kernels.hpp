// Register-only FMA loops, one per ISA translation unit (compiled with that
// ISA's flags), used to measure the machine's FP32 peak for `tileattn info`
// and the benchmarks' fraction-of-peak.
#pragma once

#include <cstdint>

namespace tileattn::detail {

// Runs `iterations` rounds of independent multiply-adds held in registers and
// returns the floating-point operations done (2 per lane per multiply-add).
// Results are summed into *sink so the compiler cannot drop the work.
double fma_loop_generic(int64_t iterations, float* sink);
double fma_loop_avx2(int64_t iterations, float* sink);
double fma_loop_avx512(int64_t iterations, float* sink);

// AMX-BF16 tile multiply-adds (isa/amx/peak_amx.cpp; 2 flops per
// multiply-add); 0 where the build or the OS gives no AMX.
double amx_bf16_loop(int64_t iterations, float* sink);
// Asks Linux once per process for the AMX tile data state; true if granted.
bool request_amx_permission();
// Whether this build has the AMX loop (false: isa/amx_none, a compiler
// without -mamx-tile -mamx-bf16), so that tests can tell a CPU without AMX
// from a build without it.
bool amx_peak_built();

// vdpbf16ps multiply-adds (isa/avx512bf16/peak_avx512bf16.cpp; 2 flops per
// multiply-add, two per lane per instruction); 0 in a build without it.
double bf16_dot_loop_avx512bf16(int64_t iterations, float* sink);
// Whether this build has the avx512bf16 and amx rungs (the compiler took
// -mavx512bf16 -mamx-tile -mamx-bf16): isa/amx/forward_amx.cpp says yes,
// isa/amx_none/ no.
bool bf16_products_built();

}  // namespace tileattn::detail
