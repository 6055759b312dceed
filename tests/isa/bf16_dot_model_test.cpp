// The vdpbf16ps model (bf16_dot_semantics.hpp, through the emulated
// _mm512_dpbf16_ps): the hardware's documented-by-measurement behaviours on
// hand-picked lanes, on every machine and natively where the CPU has
// AVX512-BF16, and random lanes bit for bit against the instruction.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>

#include "isa/bf16_dot_semantics.hpp"
#include "isa/bf16_kernel_sets.hpp"
#include "isa/bf16_native_gate.hpp"

namespace tileattn::testing {
namespace {

using bf16_dot_semantics::bits;
using bf16_dot_semantics::from_bits;

uint16_t bf16_of(float x) { return uint16_t(bits(x) >> 16); }  // x exact in bf16

struct Lane {
  const char* what;
  float acc;
  uint16_t x_odd, y_odd, x_even, y_even;
  uint32_t expected;  // result bits
};

// Each lane shows one point where the hardware is not the Intrinsics Guide's
// `acc += fp32(odd product); acc += fp32(even product)` in MXCSR's mode, or
// where a model could plausibly go wrong.
const Lane kLanes[] = {
    {"product below 2^-126 is not flushed before the add", 0x1p-125f, bf16_of(0x1p-64f), bf16_of(0x1p-64f), 0, 0,
     bits(0x1.2p-125f)},
    {"product of 2^128 is not inf before the add", -0x1p127f, bf16_of(0x1p64f), bf16_of(0x1p64f), 0, 0,
     bits(0x1p127f)},
    {"odd pair first: 2^24 + 1 rounds to 2^24, then - 2^24", 0x1p24f, bf16_of(1.0f), bf16_of(1.0f),
     bf16_of(-0x1p24f), bf16_of(1.0f), bits(0.0f)},
    {"each step rounds: odd 2^60 swamps acc, even -2^60 cancels it", 1.0f, bf16_of(0x1p30f), bf16_of(0x1p30f),
     bf16_of(-0x1p30f), bf16_of(0x1p30f), bits(0.0f)},
    {"ties to even", 1.0f, bf16_of(0x1p-24f), bf16_of(1.0f), 0, 0, bits(1.0f)},
    {"denormal acc reads as zero", from_bits(0x00000001u), 0, 0, 0, 0, bits(0.0f)},
    {"denormal bf16 input reads as zero", 1.0f, 0x0001, bf16_of(0x1p120f), 0, 0, bits(1.0f)},
    {"tiny result flushed to zero, keeping its sign", 0x1p-126f, bf16_of(-0x1p-63f), bf16_of(0x1p-64f), 0, 0,
     bits(0.0f)},
    {"tiny result that rounds up to 2^-126 is kept", 0x1p-126f, bf16_of(-0x1p-100f), bf16_of(0x1p-100f), 0, 0, bits(0x1p-126f)},
    {"even pair's NaN wins over odd pair's and acc's", from_bits(0x7fc00001u), 0x7f81, bf16_of(1.0f), 0x7fc2,
     bf16_of(1.0f), 0x7fc20000u},
    {"odd pair's NaN wins over acc's, quieted", from_bits(0x7f800001u), 0x7f81, bf16_of(1.0f), 0, 0, 0x7fc10000u},
    {"x's NaN wins over y's", 1.0f, 0xffc3, 0x7fc4, 0, 0, 0xffc30000u},
    {"acc's NaN is quieted with its payload", from_bits(0x7f800005u), 0, 0, 0, 0, 0x7fc00005u},
    {"inf * 0 is the default NaN", 1.0f, 0x7f80, 0, 0, 0, 0xffc00000u},
    {"inf - inf is the default NaN", from_bits(0xff800000u), 0x7f80, bf16_of(1.0f), 0, 0, 0xffc00000u},
};

void check_lanes(void (*dpbf16_ps)(const float*, const uint16_t*, const uint16_t*, float*), const char* path) {
  for (const Lane& lane : kLanes) {
    float acc[16] = {}, out[16];
    uint16_t a[32] = {}, b[32] = {};
    acc[5] = lane.acc;
    a[11] = lane.x_odd, b[11] = lane.y_odd, a[10] = lane.x_even, b[10] = lane.y_even;
    dpbf16_ps(acc, a, b, out);
    EXPECT_EQ(bits(out[5]), lane.expected) << path << ": " << lane.what << std::hex << " (got 0x" << bits(out[5])
                                           << ")";
  }
}

TEST(Bf16DotModel, HandPickedLanesEmulated) { check_lanes(emulated_dpbf16_ps, "emulated"); }

TEST(Bf16DotModel, HandPickedLanesNative) {
  TILEATTN_REQUIRE_NATIVE(Isa::avx512bf16);
  check_lanes(native_dpbf16_ps, "native vdpbf16ps");
}

// Random vectors drawn to reach every case above: any bits, moderate values,
// denormal/tiny and huge exponents, products near 2^-126 and past 2^128, NaNs,
// pairs that cancel, accumulators near minus the products.
struct LaneSource {
  std::mt19937_64 rng{20261201};
  uint16_t bf16(int kind) {
    const uint16_t sign = rng() & 0x8000, mantissa = rng() & 0x7f;
    int e;
    switch (kind) {
      case 0: return uint16_t(rng());
      case 1: e = 127 + int(rng() % 21) - 10; break;
      case 2: e = int(rng() % 12); break;
      case 3: e = 60 + int(rng() % 10); break;
      case 4: e = 190 + int(rng() % 66); break;
      default:
        if (rng() % 3 == 0) return sign | (rng() % 3 == 0 ? 0x7f80 : 0x7f80 | (1 + rng() % 127));
        e = int(rng() % 256);
    }
    return uint16_t(sign | (e << 7) | mantissa);
  }
  float acc(int kind, float products) {
    const uint32_t sign = rng() & 0x80000000u, mantissa = rng() & 0x7fffff;
    switch (kind) {
      case 0: return from_bits(uint32_t(rng()));
      case 1: return from_bits(sign | ((127 + int(rng() % 21) - 10) << 23) | mantissa);
      case 2: return from_bits(sign | (uint32_t(rng() % 6) << 23) | mantissa);
      case 3: return from_bits(bits(-products) + uint32_t(int(rng() % 64) - 32));
      case 4: return from_bits(sign | (uint32_t(245 + rng() % 11) << 23) | mantissa);
      case 5: return from_bits(sign | (uint32_t(rng() % 256) << 23) | mantissa);
      default: return from_bits(sign | (mantissa & 0xff));
    }
  }
  void vectors(float* acc16, uint16_t* a, uint16_t* b) {
    const int ka = int(rng() % 6), kb = rng() % 4 == 0 ? ka : int(rng() % 6), kc = int(rng() % 7);
    for (int i = 0; i < 32; ++i) a[i] = bf16(ka), b[i] = bf16(kb);
    for (int i = 0; i < 16; ++i) {
      if (rng() % 5 == 0) {  // the even product (nearly) cancels the odd one
        a[2 * i] = a[2 * i + 1] ^ 0x8000 ^ (rng() % 3 == 0 ? (rng() & 3) : 0);
        b[2 * i] = b[2 * i + 1];
        if (rng() & 1) std::swap(a[2 * i], b[2 * i]);
      }
      const float even = bf16_dot_semantics::widen(a[2 * i]) * bf16_dot_semantics::widen(b[2 * i]);
      const float odd = bf16_dot_semantics::widen(a[2 * i + 1]) * bf16_dot_semantics::widen(b[2 * i + 1]);
      acc16[i] = acc(kc, even + (rng() & 1 ? odd : 0.0f));
    }
  }
};

// 4 million lanes (about 1 s); the model was fitted on 70 million.
TEST(Bf16DotModel, MatchesVdpbf16psOnRandomLanes) {
  TILEATTN_REQUIRE_NATIVE(Isa::avx512bf16);
  LaneSource source;
  int64_t mismatches = 0;
  for (int v = 0; v < 250000; ++v) {
    float acc[16], native[16], emulated[16];
    uint16_t a[32], b[32];
    source.vectors(acc, a, b);
    native_dpbf16_ps(acc, a, b, native);
    emulated_dpbf16_ps(acc, a, b, emulated);
    for (int i = 0; i < 16; ++i)
      if (bits(native[i]) != bits(emulated[i]) && ++mismatches <= 10)
        ADD_FAILURE() << std::hex << "acc 0x" << bits(acc[i]) << " odd 0x" << a[2 * i + 1] << " * 0x" << b[2 * i + 1]
                      << " even 0x" << a[2 * i] << " * 0x" << b[2 * i] << ": hardware 0x" << bits(native[i])
                      << ", model 0x" << bits(emulated[i]);
  }
  EXPECT_EQ(mismatches, 0);
}

// vcvtne2ps2bf16 (the split of P into hi + lo): the model against the
// instruction on random floats of every class (normal, halfway and
// near-halfway mantissas, denormals, zeros, infinities, quiet and signalling
// NaNs, values that round up to infinity).
TEST(Bf16ConvertModel, MatchesVcvtne2ps2bf16OnRandomFloats) {
  TILEATTN_REQUIRE_NATIVE(Isa::avx512bf16);
  std::mt19937 rng(7);
  auto random_float = [&]() {
    const uint32_t sign = (rng() & 1) << 31, mantissa = rng() & 0x7fffff;
    switch (rng() % 6) {
      case 0: return from_bits(sign | (uint32_t(1 + rng() % 254) << 23) | mantissa);
      case 1: return from_bits(sign | (uint32_t(1 + rng() % 254) << 23) | (mantissa & ~0xffffu) | 0x8000u);
      case 2: return from_bits(sign | (uint32_t(1 + rng() % 254) << 23) | (mantissa & ~0xffffu) | 0x7fffu | (rng() & 0x10000u));
      case 3: return from_bits(sign | mantissa);                  // denormals and zeros
      case 4: return from_bits(sign | 0x7f800000u | (rng() % 3 == 0 ? 0 : mantissa));  // inf, NaNs
      default: return from_bits(sign | 0x7f7f0000u | (rng() & 0xffffu));  // near FLT_MAX
    }
  };
  int64_t mismatches = 0;
  for (int v = 0; v < 100000; ++v) {
    float a[16], b[16];
    uint16_t native[32], emulated[32];
    for (int i = 0; i < 16; ++i) a[i] = random_float(), b[i] = random_float();
    native_cvtne2ps_pbh(a, b, native);
    emulated_cvtne2ps_pbh(a, b, emulated);
    for (int i = 0; i < 32; ++i)
      if (native[i] != emulated[i] && ++mismatches <= 10)
        ADD_FAILURE() << std::hex << "0x" << bits(i < 16 ? b[i] : a[i - 16]) << ": hardware 0x" << native[i]
                      << ", model 0x" << emulated[i];
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace tileattn::testing
