// The emulated bf16_gemm of each kernel gives the native kernel's bits, on
// operands with denormals, infinities and NaNs as well as ordinary values:
// where the CPU has the instructions, the emulation's kernels are the
// hardware's, not just close to them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "isa/bf16_kernel_params.hpp"

namespace tileattn::testing {
namespace {

uint16_t operand(std::mt19937& rng, bool specials) {
  const uint16_t sign = rng() & 0x8000;
  if (specials)
    switch (rng() % 16) {
      case 0: return sign | 0x7f80;                      // inf
      case 1: return sign | 0x7f80 | (1 + rng() % 127);  // NaN
      case 2: return sign | (rng() & 0x7f);              // denormal or zero
      case 3: return sign | uint16_t((200 + rng() % 50) << 7) | (rng() & 0x7f);  // huge
      case 4: return sign | uint16_t((1 + rng() % 40) << 7) | (rng() & 0x7f);    // tiny
      default: break;
    }
  return sign | uint16_t((120 + rng() % 10) << 7) | (rng() & 0x7f);
}

void check_bitwise(Isa isa) {
  TILEATTN_REQUIRE_NATIVE(isa);
  const Bf16KernelSet native = isa == Isa::amx ? native_amx_kernels() : native_dot_kernels();
  const Bf16KernelSet emulated = isa == Isa::amx ? emulated_amx_kernels() : emulated_dot_kernels();
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t m = 1 + rng() % 40, n = 16 * (1 + rng() % 5), k = 32 * (1 + rng() % 3);
    const int64_t lda = k, ldc = n, b_panel = 16 * k;
    const bool specials = trial % 2 == 1, with_lo = rng() % 2, accumulate = rng() % 2;
    AlignedBuffer<uint16_t> a(size_t((m + 16) * lda), 0), a_lo(size_t((m + 16) * lda), 0), b(size_t(n * k), 0);
    for (size_t i = 0; i < a.count; ++i) a[i] = operand(rng, specials), a_lo[i] = operand(rng, specials);
    for (size_t i = 0; i < b.count; ++i) b[i] = operand(rng, specials);
    AlignedBuffer<float> c_native(size_t((m + 16) * ldc), 0.0f), c_emulated(size_t((m + 16) * ldc), 0.0f);
    for (size_t i = 0; i < c_native.count; ++i) {
      const uint32_t bits = uint32_t(operand(rng, specials)) << 16 | (rng() & 0xffff);
      std::memcpy(&c_native[i], &bits, 4);
      c_emulated[i] = c_native[i];
    }
    native.gemm(m, n, k, a.get(), with_lo ? a_lo.get() : nullptr, lda, b.get(), b_panel, c_native.get(), ldc,
                accumulate);
    emulated.gemm(m, n, k, a.get(), with_lo ? a_lo.get() : nullptr, lda, b.get(), b_panel, c_emulated.get(), ldc,
                  accumulate);
    ASSERT_EQ(std::memcmp(c_native.get(), c_emulated.get(), c_native.count * 4), 0)
        << native.name << " against " << emulated.name << ": m " << m << " n " << n << " k " << k
        << " specials " << specials << " a_lo " << with_lo << " accumulate " << accumulate;
  }
}

TEST(Bf16GemmBitwise, EmulatedDotKernelsAreNativeBits) { check_bitwise(Isa::avx512bf16); }
TEST(Bf16GemmBitwise, EmulatedAmxKernelsAreNativeBits) { check_bitwise(Isa::amx); }

}  // namespace
}  // namespace tileattn::testing
