// Scalar fp16 / bf16 <-> fp32 conversions (and float64 -> fp16 / bf16),
// portable C++. Round to nearest even, NaN stays NaN, overflow goes to
// infinity. The ISA paths use hardware conversions where present; these
// define the expected bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tileattn::detail {

static inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
static inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

static inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

static inline uint16_t float_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

static inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    float value = static_cast<float>(mantissa) * bits_to_float(0x33800000u);  // 2^-24
    return sign ? -value : value;
  }
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

static inline uint16_t float_to_f16(float f) {
  uint32_t bits = float_to_bits(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in fp16: round abs / 2^-24 to an integer, ties to even.
    float scaled = bits_to_float(abs) * 16777216.0f;  // exact: multiply by 2^24
    uint32_t integer = static_cast<uint32_t>(scaled);
    float fraction = scaled - static_cast<float>(integer);
    if (fraction > 0.5f || (fraction == 0.5f && (integer & 1u))) ++integer;
    return static_cast<uint16_t>(sign | integer);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t rebased = abs - (112u << 23);
  uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

// float64 -> fp16 / bf16 rounded once (to nearest even). Rounding through
// fp32 to nearest rounds twice: a value just past a 16-bit tie can land on
// the tie in fp32 and then go to even, the wrong way. It can go wrong only
// there (fp32 holds every 16-bit tie, and rounding is monotonic), so the
// common case keeps the fp32 value and only a tie is re-rounded "to odd"
// (truncate, then set the last bit when inexact). With fp32's 13 and 16 bits
// more than fp16 and bf16 (two suffice), the second rounding is then the
// correct single one (Boldo & Melquiond, "When double rounding is odd",
// 2005). Re-rounding every value (branch-free) made a rotary append of 16k
// rows of 128 take 12.2 ms instead of 8.1 in fp16 (bf16: 7.5 instead of 4.4);
// with the tie test it takes 8.2 (4.5).
static inline float double_to_float_round_to_odd(double value) {
  const float nearest = static_cast<float>(value);
  // Nearest went away from zero (to inf on overflow): one step back toward
  // zero truncates. NaN compares false both times and stays NaN.
  uint32_t bits = float_to_bits(nearest);
  bits -= static_cast<uint32_t>(std::fabs(static_cast<double>(nearest)) > std::fabs(value));
  bits |= static_cast<uint32_t>(static_cast<double>(bits_to_float(bits)) != value);
  return bits_to_float(bits);
}
static inline uint16_t double_to_f16(double value) {
  const float nearest = static_cast<float>(value);
  const uint32_t abs = float_to_bits(nearest) & 0x7fffffffu;
  // A tie: the 13 bits fp16 drops are exactly one half (fp16 normals and the
  // 65520 overflow tie); below 2^-14 (fp16 subnormals) fewer bits are kept,
  // so every such value is re-rounded.
  const bool tie = (abs & 0x1fffu) == 0x1000u || abs < 0x38800000u;
  return float_to_f16(tie ? double_to_float_round_to_odd(value) : nearest);
}
static inline uint16_t double_to_bf16(double value) {
  const float nearest = static_cast<float>(value);
  const bool tie = (float_to_bits(nearest) & 0xffffu) == 0x8000u;  // the 16 dropped bits are one half
  return float_to_bf16(tie ? double_to_float_round_to_odd(value) : nearest);
}

// fp8 e4m3 ("fn": no infinities; torch.float8_e4m3fn): sign, 4 exponent
// bits (bias 7), 3 mantissa bits; S.1111.111 is NaN, 448 the largest finite
// value, 2^-9 the smallest subnormal. Both directions give torch's bits
// (c10::Float8_e4m3fn): to float, NaN is sign | 0x7ff00000; from float, round
// to nearest even, and |f| >= 480 (which would round past 448), inf and NaN
// all give NaN (sign | 0x7f) -- torch does not saturate. The quantizing
// append clamps to +-448 before converting (kv_append.cpp), so only a NaN
// input stores a NaN.
static inline float f8e4m3_to_float(uint8_t x) {
  const uint32_t sign = static_cast<uint32_t>(x & 0x80u) << 24;
  const uint32_t exponent = (x >> 3) & 0xfu, mantissa = x & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u) return bits_to_float(sign | 0x7ff00000u);
  if (exponent == 0) {  // subnormal: mantissa * 2^-9 (exact in fp32)
    const float value = static_cast<float>(mantissa) * bits_to_float(0x3b000000u);  // 2^-9
    return sign ? -value : value;
  }
  return bits_to_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

static inline uint8_t float_to_f8e4m3(float f) {
  uint32_t bits = float_to_bits(f);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t result;
  if (bits >= 0x43f00000u) {  // >= 480, inf, NaN
    result = 0x7fu;
  } else if (bits < (121u << 23)) {  // below 2^-6: a subnormal (or zero) of e4m3
    // Adding 2^14 leaves the value in units of 2^-9 in the low mantissa bits,
    // rounded to nearest even by the addition itself.
    const float shifted = bits_to_float(bits) + bits_to_float(141u << 23);
    result = static_cast<uint8_t>(float_to_bits(shifted) - (141u << 23));
  } else {
    const uint32_t odd = (bits >> 20) & 1u;
    bits += (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + odd;
    result = static_cast<uint8_t>(bits >> 20);
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

}  // namespace tileattn::detail

namespace tileattn::detail {

// One element of a tensor of storage type `dtype` (0 = f32, 1 = f16, 2 = bf16,
// 3 = int8, 4 = fp8 e4m3: DType's values), `index` elements from `base`, as
// float (int8 and fp8 without their scale).
static inline float load_element(const void* base, int dtype, int64_t index) {
  if (dtype == 0) return static_cast<const float*>(base)[index];
  if (dtype == 3) return static_cast<float>(static_cast<const int8_t*>(base)[index]);
  if (dtype == 4) return f8e4m3_to_float(static_cast<const uint8_t*>(base)[index]);
  const uint16_t bits = static_cast<const uint16_t*>(base)[index];
  return dtype == 1 ? f16_to_float(bits) : bf16_to_float(bits);
}

// Stores `value` as one element of storage type `dtype` (as load_element),
// `index` elements from `base`; 16-bit types round to nearest even.
static inline void store_element(void* base, int dtype, int64_t index, float value) {
  if (dtype == 0) {
    static_cast<float*>(base)[index] = value;
  } else {
    static_cast<uint16_t*>(base)[index] = dtype == 1 ? float_to_f16(value) : float_to_bf16(value);
  }
}

}  // namespace tileattn::detail
