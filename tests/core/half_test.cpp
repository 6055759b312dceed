#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/half.hpp"

namespace tileattn::detail {

TEST(Half, F16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = uint16_t(bits);
    const float f = f16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    EXPECT_EQ(float_to_f16(f), h) << "bits " << bits;
  }
}

TEST(Half, F16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even (1).
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and the smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(Half, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie to even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
}


// float64 -> fp16 / bf16 rounds once: at every midpoint between two
// neighbouring finite values (ties to even), and just either side of it by
// far less than an fp32 ulp -- where rounding through fp32 to nearest would
// land on the tie and go to even, the wrong way half the time.
TEST(Half, DoubleRoundsOnceToF16AndBf16) {
  struct Format {
    const char* name;
    uint16_t largest;  // bits of the largest finite value
    float (*to_float)(uint16_t);
    uint16_t (*from_double)(double);
  };
  for (const Format& f : {Format{"f16", 0x7bff, f16_to_float, double_to_f16},
                          Format{"bf16", 0x7f7f, bf16_to_float, double_to_bf16}}) {
    int64_t wrong = 0;
    for (uint16_t h = 0; h < f.largest; ++h) {
      const double lo = f.to_float(h), hi = f.to_float(uint16_t(h + 1));
      const double mid = (lo + hi) / 2, nudge = (hi - lo) * 0x1p-30;  // both exact
      const uint16_t even = (h & 1u) ? uint16_t(h + 1) : h;
      for (double sign : {1.0, -1.0}) {
        const uint16_t s = sign > 0 ? 0 : 0x8000;
        wrong += f.from_double(sign * mid) != (even | s);
        wrong += f.from_double(sign * (mid + nudge)) != (uint16_t(h + 1) | s);
        wrong += f.from_double(sign * (mid - nudge)) != (h | s);
        wrong += f.from_double(sign * lo) != (h | s);
      }
    }
    EXPECT_EQ(wrong, 0) << f.name;
    EXPECT_TRUE(std::isnan(f.to_float(f.from_double(std::numeric_limits<double>::quiet_NaN())))) << f.name;
    EXPECT_EQ(f.from_double(1e300), f.largest + 1) << f.name;  // infinity
    EXPECT_EQ(f.from_double(-std::numeric_limits<double>::infinity()), (f.largest + 1) | 0x8000) << f.name;
    EXPECT_EQ(f.from_double(1e-300), 0) << f.name;
    EXPECT_EQ(f.from_double(-1e-300), 0x8000) << f.name;
  }
  EXPECT_EQ(double_to_f16(65520.0), 0x7c00);  // the tie above the largest fp16 goes to infinity
  EXPECT_EQ(double_to_f16(65520.0 - 0x1p-20), 0x7bff);
}

}  // namespace tileattn::detail
