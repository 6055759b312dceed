// The measured peaks of `tileattn info`: the FP32 FMA peak on every CPU, the
// AMX-BF16 peak only where the CPU and the OS give AMX (else 0).
#include <gtest/gtest.h>

#include "core/peak_kernels.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

TEST(Peak, FmaPeakIsPositiveForEveryAvailableIsa) {
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
    if (!isa_available(isa)) continue;
    EXPECT_GT(measure_fma_peak_gflops(1, isa, 0.02, 1), 0.1) << isa_name(isa);
  }
}

TEST(Peak, AmxPeakIsMeasuredExactlyWhereAmxIsUsable) {
  const double amx = measure_amx_bf16_peak_gflops(1, 0.02, 1);
  if (!cpu_features().amx_bf16) {
    EXPECT_FALSE(amx_bf16_usable());
  }
  if (!amx_bf16_usable()) {
    EXPECT_EQ(amx, 0.0);
    return;
  }
  // A tile multiply-add instruction does 16*16*32 of them: far beyond the
  // 16 lanes of an FMA (the hardware gives ~14x here; 2x leaves room for a
  // loaded machine).
  const double fma = measure_fma_peak_gflops(1, Isa::automatic, 0.02, 1);
  EXPECT_GT(amx, 2 * fma) << "AMX " << amx << " GFLOP/s, FMA " << fma;
}

// A CPU without AMX skips; a CPU with AMX and a build without the AMX loop
// (isa/amx_none: the compiler lacked the flags) fails, rather than passing
// the test above with a peak of 0.
TEST(Peak, AmxPathIsBuiltWhereTheCpuHasAmx) {
  if (!cpu_features().amx_bf16) GTEST_SKIP() << "this CPU has no AMX-BF16 (or the OS did not enable its tile state)";
  EXPECT_TRUE(detail::amx_peak_built())
      << "this CPU has AMX-BF16 but the build has no AMX path (the compiler took no -mamx-tile -mamx-bf16; "
         "CMakeLists.txt built isa/amx_none instead)";
}

// A value outside the Isa enum is a bad argument (Error), not a path this CPU
// lacks (NotSupported, which is not an Error).
TEST(ResolveIsa, ValueOutsideTheEnumIsAnError) {
  EXPECT_THROW(resolve_isa(static_cast<Isa>(99)), Error);
  EXPECT_THROW(resolve_isa(static_cast<Isa>(-1)), Error);
  EXPECT_EQ(resolve_isa(Isa::generic), Isa::generic);
}

}  // namespace
}  // namespace tileattn::testing
