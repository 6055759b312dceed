// What one fp32 lane of the bf16 dot-product instructions computes, as scalar
// C++: VDPBF16PS (AVX512-BF16) and TDPBF16PS (AMX-BF16) are both a sequence
// of the step below, one bf16 product at a time, in an order of their own
// (avx512_emulation.hpp and amx_emulation.hpp). Free of reserved intrinsic
// names, so it can share a translation unit with <immintrin.h>
// (bf16_dot_model_test.cpp checks it against the hardware there).
//
// The step, acc' = acc + x * y (x, y bf16, acc fp32), as the hardware does it:
//  - DAZ: a denormal x, y AND acc reads as a zero of its sign;
//  - the product is exact and is NOT rounded to fp32 before the add: a
//    product below 2^-126 or above 2^128 takes part in the sum as it is
//    (Intel's pseudo-code writes `acc += x * y` in fp32, which would flush or
//    overflow it first: measured, the hardware does not);
//  - one rounding, to nearest even, of the exact sum acc + x * y;
//  - FTZ, tininess after rounding: a result whose rounding (to 24 bits,
//    unbounded exponent) is below 2^-126 becomes a zero of its sign; one that
//    rounds up to 2^-126 stays 2^-126;
//  - NaNs: x if NaN, else y if NaN, else acc if NaN, returned quieted with
//    their payload (a bf16 NaN widens to fp32 with its payload shifted up by
//    16); otherwise inf * 0 or inf - inf give the default NaN 0xffc00000;
//  - no MXCSR: the caller's rounding mode and DAZ/FTZ bits play no part.
// Measured on an Intel Xeon (Sapphire Rapids class), 2026-12, against
// vdpbf16ps (32 million lanes, and 19 million more under MXCSR set to each
// directed rounding and FTZ) and tdpbf16ps (30 million elements): random
// lanes with denormals, infinities, quiet and signalling NaNs, products out of
// fp32's range and cancellation; zero mismatches, NaN bits included. The
// pseudo-code taken literally (fp32 product, then fp32 add, FTZ on both)
// disagreed on 7% of a 320,000-lane sample of those vdpbf16ps lanes (all with
// a product outside fp32's normal range, the only place the two differ); the
// even pair first on 10%; one rounding of acc + both products on 10%. bf16_dot_model_test.cpp and amx_tile_model_test.cpp repeat
// a sample on every run where the CPU has the instructions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tileattn::bf16_dot_semantics {

inline uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
inline float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
inline float widen(uint16_t bf16) { return from_bits(uint32_t(bf16) << 16); }
inline bool is_nan(float x) { return (bits(x) & 0x7fffffffu) > 0x7f800000u; }
inline float quiet(float x) { return from_bits(bits(x) | 0x00400000u); }
inline float default_nan() { return from_bits(0xffc00000u); }
inline float denormals_as_zero(float x) {
  return (bits(x) & 0x7f800000u) == 0 ? std::copysign(0.0f, x) : x;
}

// The one rounding of the exact sum a + b (a, b doubles that hold fp32
// values or exact bf16 products, so non-NaN): nearest even, FTZ with
// tininess after rounding, inf - inf the default NaN.
inline float round_sum(double a, double b) {
  double s = a + b;
  if (std::isnan(s)) return default_nan();
  if (std::isinf(s)) return float(s);  // from an infinite operand only
  // s = RN(a + b); make it round-to-odd (TwoSum gives the exact error), so that
  // the one rounding to fp32 below is the rounding of the exact sum. (For a
  // 24-bit and a 16- or 24-bit operand s is never an fp32 midpoint unless
  // exact, so this only guards the argument: the tests cannot see it go.)
  const double bv = s - a, err = (a - (s - bv)) + (b - bv);
  if (err != 0.0) {
    uint64_t sb;
    std::memcpy(&sb, &s, sizeof sb);
    if ((sb & 1u) == 0) s = std::nextafter(s, err > 0 ? INFINITY : -INFINITY);
  }
  constexpr double kMinNormal = 0x1p-126;
  if (s != 0.0 && std::fabs(s) < kMinNormal) {
    // Tininess after rounding: round to 24 bits where fp32 is normal.
    constexpr double kLift = 0x1p200;
    const float lifted = float(s * kLift);
    return std::fabs(double(lifted)) < kMinNormal * kLift ? std::copysign(0.0f, float(s))
                                                          : std::copysign(float(kMinNormal), float(s));
  }
  return float(s);  // nearest even; overflows to inf
}

// acc + x * y with the semantics above.
inline float dot_step(float acc, uint16_t x_bits, uint16_t y_bits) {
  const float x = widen(x_bits), y = widen(y_bits);
  if (is_nan(x)) return quiet(x);
  if (is_nan(y)) return quiet(y);
  if (is_nan(acc)) return quiet(acc);
  // In double the product of two 8-bit significands is exact (exponents stay
  // within +-300); inf * 0 is NaN and round_sum makes it the default NaN.
  return round_sum(denormals_as_zero(acc), double(denormals_as_zero(x)) * double(denormals_as_zero(y)));
}

// a + b in fp32 with DAZ, FTZ and NaNs as above (a's NaN first).
inline float add_step(float a, float b) {
  if (is_nan(a)) return quiet(a);
  if (is_nan(b)) return quiet(b);
  return round_sum(denormals_as_zero(a), denormals_as_zero(b));
}

// VCVTNE2PS2BF16, one element (Intel's convert_fp32_to_bfloat16): a NaN
// keeps its sign and upper payload bits, quieted; a denormal reads as a
// zero of its sign (DAZ); anything else rounds to nearest even (overflowing
// to infinity). No MXCSR. Checked against the instruction by
// bf16_dot_model_test.cpp (Bf16ConvertModel).
inline uint16_t round_to_bf16(float x) {
  const uint32_t u = bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  if ((u & 0x7f800000u) == 0) return uint16_t((u >> 16) & 0x8000u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace tileattn::bf16_dot_semantics
