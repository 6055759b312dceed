// What one lane of each emulated AVX-512 instruction computes, as scalar C++
// following the Intel SDM's operation sections (not the nicer IEEE functions:
// x86 MAXPS is not fmax, VSCALEFPS is not ldexp at the special values).
// avx512_emulation.hpp builds the 16-lane intrinsics on these; the cross-check
// test compares them with the real 256-bit instructions this CPU has.
// Free of reserved intrinsic names, so it can share a translation unit with
// <immintrin.h>.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/half.hpp"

namespace tileattn::avx512_emulation {

// What the hardware would do is not emulated, or it would fault: stop loudly.
[[noreturn]] inline void fault(const char* what) {
  std::fprintf(stderr, "avx512 emulation: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

namespace lane {

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
inline bool is_nan(float x) { return (bits(x) & 0x7fffffffu) > 0x7f800000u; }
// An operation on a signalling NaN returns it quieted (payload kept).
inline float quiet(float x) { return from_bits(bits(x) | 0x00400000u); }
// The "QNaN floating-point indefinite" invalid operations return.
inline float indefinite() { return from_bits(0xffc00000u); }

// MAXPS / MINPS: `a > b ? a : b`. The second operand comes back when either
// is NaN and when both are zeros of any sign: not commutative.
inline float max(float a, float b) { return a > b ? a : b; }
inline float min(float a, float b) { return a < b ? a : b; }

// ROUNDPS / VRNDSCALEPS imm8[1:0] modes, and bit 2 (use MXCSR's mode, which
// the tests leave at nearest-even). Scales (imm8[7:4] != 0) are not emulated.
inline float round_to_integer(float x, int imm) {
  if (imm & 0xf0) fault("roundscale with a scale (imm8[7:4] != 0) is not emulated");
  if (is_nan(x)) return quiet(x);
  if (std::fabs(x) >= 8388608.0f) return x;  // 2^23 and above (and inf): already integral
  const int mode = (imm & 0x4) ? 0 : (imm & 0x3);
  const float down = std::floor(x);
  float r = down;
  switch (mode) {
    case 0: {  // nearest, ties to even
      const float frac = x - down;  // exact: |x| < 2^23
      if (frac > 0.5f || (frac == 0.5f && std::fmod(down, 2.0f) != 0.0f)) r = down + 1.0f;
      break;
    }
    case 1: r = down; break;
    case 2: r = std::ceil(x); break;
    default: r = std::trunc(x); break;
  }
  return std::copysign(r, x);  // -0.3 rounds to -0, as the hardware does
}

// VREDUCEPS: x - round_to_integer(x * 2^M) / 2^M with M = imm8[7:4] (the
// fraction bits kept), the subtraction rounded in the same mode (measured on
// the AMX Xeon, model 167: with rounding down, -1e-40 gives the float just
// below 1, and an exact zero is -0). Infinities give +0 in either mode, NaNs
// come back quieted. From |x| = 2^(23 - M) on, x is a multiple of 2^-M
// (and x * 2^M could overflow): x is its own rounding.
inline float reduce(float x, int imm) {
  if (is_nan(x)) return quiet(x);
  if (std::isinf(x)) return 0.0f;
  const int mode = (imm & 0x4) ? 0 : (imm & 0x3);
  const int m = (imm >> 4) & 0xf;
  const double big = std::fabs(x) >= std::ldexp(1.0f, 23 - m)
                         ? double(x)
                         : std::ldexp(double(round_to_integer(std::ldexp(x, m), imm & 0x0f)), -m);
  // The exact v = x - big against r, its nearest float (x - big is exact in
  // float except for a tiny x rounded away from 0, where r is 0 or +-1):
  // v - r = x + u with u = -big - r exact in double, so comparing x with -u
  // is exact.
  const float r = float(double(x) - big);
  const double u = -big - double(r);
  const int side = x > -u ? 1 : x < -u ? -1 : 0;  // sign of v - r
  if (r == 0.0f && side == 0) return mode == 1 ? -0.0f : 0.0f;
  if (mode == 1 && side < 0) return std::nextafter(r, -INFINITY);
  if (mode == 2 && side > 0) return std::nextafter(r, INFINITY);
  if (mode == 3 && (r > 0.0f ? side < 0 : side > 0)) return std::nextafter(r, 0.0f);
  return r;
}

// VSCALEFPS: a * 2^floor(b), with the SDM's special-case table (as the Bochs
// simulator also implements it): NaNs propagate (a's first), except that a
// quiet NaN scaled by 2^+-inf gives +inf / +0; 0 * 2^+inf and inf * 2^-inf
// are invalid; otherwise zeros and infinities of a come back unchanged.
inline float scalef(float a, float b) {
  if (is_nan(b)) return is_nan(a) ? quiet(a) : quiet(b);
  if (is_nan(a)) {
    const bool signalling = (bits(a) & 0x00400000u) == 0;
    if (signalling || !std::isinf(b)) return quiet(a);
    return b > 0 ? INFINITY : 0.0f;
  }
  if (std::isinf(a)) return (std::isinf(b) && b < 0) ? indefinite() : a;
  if (a == 0.0f) return (std::isinf(b) && b > 0) ? indefinite() : a;
  if (std::isinf(b)) return b > 0 ? std::copysign(INFINITY, a) : std::copysign(0.0f, a);
  // floor(b) is an integer; beyond +-400 the result has over/underflowed
  // anyway, and scalbn rounds once, as the instruction does.
  const float e = std::floor(b);
  const int n = e > 400.0f ? 400 : e < -400.0f ? -400 : int(e);
  return std::scalbn(a, n);
}

// VCMPPS predicates 0..31 (imm8[4:0]). Ordered predicates are false and
// unordered ones true when either operand is NaN; the signalling/quiet
// distinction only raises exceptions, which are not emulated.
inline bool compare(float a, float b, int predicate) {
  const bool unordered = is_nan(a) || is_nan(b);
  const bool lt = !unordered && a < b, eq = !unordered && a == b, gt = !unordered && a > b;
  switch (predicate & 0xf) {
    case 0x0: return eq;                          // EQ_O
    case 0x1: return lt;                          // LT_O
    case 0x2: return lt || eq;                    // LE_O
    case 0x3: return unordered;                   // UNORD
    case 0x4: return !eq;                         // NEQ_U
    case 0x5: return !lt;                         // NLT_U
    case 0x6: return !(lt || eq);                 // NLE_U
    case 0x7: return !unordered;                  // ORD
    case 0x8: return eq || unordered;             // EQ_U
    case 0x9: return !(gt || eq) ;                // NGE_U
    case 0xa: return !gt;                         // NGT_U
    case 0xb: return false;                       // FALSE_O
    case 0xc: return !eq && !unordered;           // NEQ_O
    case 0xd: return gt || eq;                    // GE_O
    case 0xe: return gt;                          // GT_O
    default: return true;                         // TRUE_U
  }
}

// VCVTPH2PS: exact; a NaN comes back quieted with its payload.
inline float half_to_float(uint16_t h) {
  const float x = detail::f16_to_float(h);
  return is_nan(x) ? quiet(x) : x;
}

// VCVTPS2PH with imm8 rounding control. Only nearest-even (imm8[2:0] = 0, or
// MXCSR left at nearest) is emulated. A NaN keeps its sign and the top 9
// payload bits and is quieted.
inline uint16_t float_to_half(float x, int imm) {
  if ((imm & 0x4) == 0 && (imm & 0x3) != 0) fault("cvtps_ph with directed rounding is not emulated");
  if (is_nan(x)) {
    const uint32_t b = bits(x);
    return static_cast<uint16_t>(((b >> 16) & 0x8000u) | 0x7e00u | ((b >> 13) & 0x3ffu));
  }
  return detail::float_to_f16(x);
}

}  // namespace lane
}  // namespace tileattn::avx512_emulation
