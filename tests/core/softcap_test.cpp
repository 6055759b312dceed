// The soft cap's tanh (core/softcap.hpp) against float64 tanh, and the
// soft cap's validation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/softcap.hpp"
#include "testing/problem_case.hpp"

namespace tileattn::testing {
namespace {

// Units in the last place of `want` (as float) between got and want.
double ulps(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(float(want)) - 23);
  return std::fabs(double(got) - want) / ulp;
}

TEST(Softcap, TanhWithinTwoUlpsEverywhere) {
  double worst = 0, at = 0;
  // Every fp32 in [2^-20, 12] at a stride, both signs, and the split point.
  for (float y = std::ldexp(1.0f, -20); y < 12.0f; y = std::nextafter(y, 13.0f) + y * 3e-6f) {
    for (float x : {y, -y}) {
      const double e = ulps(detail::softcap_tanh(x), std::tanh(double(x)));
      if (e > worst) worst = e, at = x;
    }
  }
  EXPECT_LE(worst, 2.0) << "at " << at;
  EXPECT_EQ(detail::softcap_tanh(0.0f), 0.0f);
  EXPECT_EQ(detail::softcap_tanh(1e-30f), 1e-30f);
  EXPECT_EQ(detail::softcap_tanh(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(detail::softcap_tanh(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(detail::softcap_tanh(1e30f), 1.0f);
  EXPECT_TRUE(std::isnan(detail::softcap_tanh(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Softcap, NegativeNaNOrInfiniteCapIsAnErrorNamingSoftcap) {
  for (float bad : {-1.0f, -0.0001f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    Case c;
    c.softcap = bad;
    CaseData data(c);
    try {
      attention_forward(data.args);
      ADD_FAILURE() << "softcap " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("softcap"), std::string::npos) << e.what();
    }
  }
}

TEST(Alibi, NonFiniteSlopeOrNegativeStrideIsAnErrorNamingIt) {
  Case c;
  c.batch = 2;
  c.alibi = Case::Alibi::batch_heads;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CaseData data(c);
    data.alibi_slopes[3] = bad;  // batch 1, head 1
    try {
      attention_forward(data.args);
      ADD_FAILURE() << "slope " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("alibi_slopes[1, 1]"), std::string::npos) << e.what();
    }
  }
  CaseData data(c);
  data.args.alibi_batch_stride = -1;
  EXPECT_THROW(attention_forward(data.args), Error);
}

}  // namespace
}  // namespace tileattn::testing
