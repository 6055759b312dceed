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

}  // namespace tileattn::detail
