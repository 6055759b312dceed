// The int8 decode products on AVX512-VNNI (src/isa/avx512/few_rows_vnni.hpp):
// scores with query rows rounded to 16-bit integers (one step per row), and
// P V with P rounded likewise (one step per row and 32 keys), exact integer
// sums on vpdpwssd. Checked where CPUID has AVX-512 and VNNI, bit for bit
// against scalar models of the same arithmetic (the rounding, the int32 sum,
// one conversion, one multiply, one add), and against float64 within the
// rounding (half a step per element). Rows come in any order, as a paged
// cache's would; head dims with and without a 32-element tail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "isa/avx512/few_rows_vnni.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

bool vnni_usable() { return isa_available(Isa::avx512) && cpu_features().avx512_vnni; }

struct ScoresData {
  int64_t m, n, d, ldq, ldq16;
  std::vector<float> q;
  std::vector<int8_t> cache;
  std::vector<const void*> rows;
  std::vector<int16_t> q16;
  std::vector<float> steps;
  ScoresData(int64_t mm, int64_t nn, int64_t dd, uint32_t seed)
      : m(mm), n(nn), d(dd), ldq(dd + 3), ldq16((dd + 31) / 32 * 32 + 32) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> decade(-6, 0), byte(-128, 127);
    // Magnitudes over six decades: the small elements are where a fixed
    // point relative to the row's largest loses digits.
    q.assign(size_t(m * ldq), 0.0f);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t t = 0; t < d; ++t) q[size_t(r * ldq + t)] = normal(rng) * std::pow(10.0f, float(decade(rng)));
    cache.resize(size_t(2 * n * d));
    for (auto& b : cache) b = int8_t(byte(rng));
    for (int64_t c = 0; c < n; ++c) rows.push_back(cache.data() + ((c * 7) % (2 * n)) * d);
    q16.assign(size_t(m * ldq16), int16_t(0x5555));  // not zero: the split writes the padding
    steps.assign(size_t(2 * m), -1.0f);
  }
};

// The scalar model: the split's rounding and the score's arithmetic.
std::vector<float> model_scores(const ScoresData& x) {
  std::vector<float> s(size_t(x.m * x.n));
  const float q_max = float(detail::kQ16Max(x.d));
  for (int64_t r = 0; r < x.m; ++r) {
    const float* row = x.q.data() + r * x.ldq;
    float max_abs = 0.0f;
    for (int64_t t = 0; t < x.d; ++t) max_abs = std::fmax(max_abs, std::fabs(row[t]));
    const float inverse = max_abs == 0.0f ? 0.0f : q_max / max_abs, step = max_abs / q_max;
    std::vector<int32_t> q16(size_t(x.d));
    for (int64_t t = 0; t < x.d; ++t)
      q16[size_t(t)] = int32_t(std::fmin(std::fmax(std::nearbyint(row[t] * inverse), -q_max), q_max));
    for (int64_t c = 0; c < x.n; ++c) {
      const int8_t* k = static_cast<const int8_t*>(x.rows[size_t(c)]);
      int64_t sum = 0;
      for (int64_t t = 0; t < x.d; ++t) sum += int64_t(q16[size_t(t)]) * k[t];
      EXPECT_LT(std::abs(sum), int64_t(1) << 31);
      s[size_t(r * x.n + c)] = float(int32_t(sum)) * step;
    }
  }
  return s;
}

TEST(FewRowsVnni, ScoresEqualTheModelBitForBitAndFloat64WithinQsRounding) {
  if (!vnni_usable()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  uint32_t seed = 1;
  for (int64_t d : {128, 13, 40, 64, 100, 512, 576})
    for (int64_t m = 1; m <= 8; ++m)
      for (int64_t n : {1, 5, 17, 64}) {
        SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " d " + std::to_string(d));
        ScoresData x(m, n, d, seed++);
        ASSERT_TRUE(detail::few_rows_split_q16(m, d, x.q.data(), x.ldq, x.q16.data(), x.ldq16, x.steps.data(), 2));
        for (int64_t r = 0; r < m; ++r)
          for (int64_t t = d; t < (d + 31) / 32 * 32; ++t) ASSERT_EQ(x.q16[size_t(r * x.ldq16 + t)], 0) << t;
        const int64_t lds = n + 5;
        std::vector<float> s(size_t(m * lds), -7.0f);
        detail::few_rows_int8_scores_vnni(m, n, d, x.q16.data(), x.ldq16, x.steps.data(), 2, x.rows.data(), s.data(),
                                          lds, {});
        const std::vector<float> want = model_scores(x);
        for (int64_t r = 0; r < m; ++r) {
          const float* row = x.q.data() + r * x.ldq;
          const double step = x.steps[size_t(2 * r)];
          for (int64_t c = 0; c < n; ++c) {
            const float got = s[size_t(r * lds + c)];
            ASSERT_EQ(got, want[size_t(r * n + c)]) << "row " << r << " key " << c;
            const int8_t* k = static_cast<const int8_t*>(x.rows[size_t(c)]);
            double exact = 0, bound = 0;
            for (int64_t t = 0; t < d; ++t) {
              exact += double(row[t]) * k[t];
              bound += std::abs(double(k[t]));
            }
            // Half a step per element, the inverse's rounding (a unit of
            // q_max at most), and the final conversion and multiply.
            ASSERT_NEAR(got, exact, step * bound * 0.5000001 + 4e-7 * std::abs(exact) + 1e-30);
          }
          for (int64_t c = n; c < lds; ++c) ASSERT_EQ(s[size_t(r * lds + c)], -7.0f) << "wrote past n";
        }
      }
}

TEST(FewRowsVnni, SplitRefusesRowsThatAreNotFiniteAndKeepsZeroRows) {
  if (!vnni_usable()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    ScoresData x(3, 4, 40, 9);
    x.q[size_t(2 * x.ldq + 39)] = bad;
    EXPECT_FALSE(detail::few_rows_split_q16(3, 40, x.q.data(), x.ldq, x.q16.data(), x.ldq16, x.steps.data(), 1));
  }
  ScoresData zero(2, 16, 64, 10);
  for (int64_t t = 0; t < 64; ++t) zero.q[size_t(zero.ldq + t)] = 0.0f;
  ASSERT_TRUE(detail::few_rows_split_q16(2, 64, zero.q.data(), zero.ldq, zero.q16.data(), zero.ldq16,
                                         zero.steps.data(), 1));
  std::vector<float> s(2 * 16, -7.0f);
  detail::few_rows_int8_scores_vnni(2, 16, 64, zero.q16.data(), zero.ldq16, zero.steps.data(), 1, zero.rows.data(),
                                    s.data(), 16, {});
  for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(s[size_t(16 + c)], 0.0f);
}

// P V: m rows of P over n keys (non-negative, with zeros and an all-zero
// chunk), int8 V rows out of order, acc rows with columns past d that must
// keep their values.
TEST(FewRowsVnni, AccumulateEqualsTheModelBitForBitAndFloat64WithinPsRounding) {
  if (!vnni_usable()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(-128, 127), decade(-6, 0);
  for (int64_t d : {128, 13, 40, 64, 96, 100, 512})
    for (int64_t m = 1; m <= 8; ++m)
      for (int64_t n : {1, 7, 32, 33, 70}) {
        SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " d " + std::to_string(d));
        const int64_t ldp = n + 3, ldacc = d + 21;
        std::vector<float> p(size_t(m * ldp));
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < n; ++c) {
            float x = unit(rng) < 0.2f ? 0.0f : unit(rng) * std::pow(10.0f, float(decade(rng)));
            if (c >= 32 && c < 64 && r == 0) x = 0.0f;  // row 0's second chunk: all zero
            p[size_t(r * ldp + c)] = x;
          }
        std::vector<int8_t> cache(size_t(2 * n * d));
        for (auto& b : cache) b = int8_t(byte(rng));
        std::vector<const void*> rows;
        for (int64_t c = 0; c < n; ++c) rows.push_back(cache.data() + ((c * 5 + 1) % (2 * n)) * d);
        std::vector<float> acc(size_t(m * ldacc));
        for (auto& x : acc) x = unit(rng) - 0.5f;
        std::vector<float> want = acc;
        std::vector<double> exact(acc.begin(), acc.end()), bound(acc.size(), 0.0);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c0 = 0; c0 < n; c0 += 32) {
            const int64_t cn = std::min<int64_t>(32, n - c0);
            float max_abs = 0.0f;
            for (int64_t c = c0; c < c0 + cn; ++c) max_abs = std::fmax(max_abs, std::fabs(p[size_t(r * ldp + c)]));
            const float inverse = max_abs == 0.0f ? 0.0f : 32767.0f / max_abs, step = max_abs / 32767.0f;
            for (int64_t t = 0; t < d; ++t) {
              int64_t sum = 0;
              for (int64_t c = c0; c < c0 + cn; ++c) {
                const float pc = p[size_t(r * ldp + c)];
                const int8_t v = static_cast<const int8_t*>(rows[size_t(c)])[t];
                sum += int64_t(std::fmin(std::fmax(std::nearbyint(pc * inverse), -32767.0f), 32767.0f)) * v;
                exact[size_t(r * ldacc + t)] += double(pc) * v;
                bound[size_t(r * ldacc + t)] += (0.5000001 * double(step) + 1e-7 * pc) * std::abs(double(v));
              }
              float& w = want[size_t(r * ldacc + t)];
              w = w + float(int32_t(sum)) * step;
            }
          }
        std::vector<float> got = acc;
        detail::few_rows_int8_accumulate_vnni(m, n, d, p.data(), ldp, rows.data(), got.data(), ldacc);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t t = 0; t < ldacc; ++t) {
            const size_t i = size_t(r * ldacc + t);
            ASSERT_EQ(got[i], want[i]) << "row " << r << " column " << t;
            if (t < d) {
              ASSERT_NEAR(got[i], exact[i], bound[i] + 1e-6 * (1.0 + std::abs(exact[i])));
            }
          }
      }
}

// A NaN or infinite P (what a NaN V scale makes of it) reaches acc as the FMA
// product carries it: NaN for NaN, and inf x 0 = NaN where V holds a 0.
TEST(FewRowsVnni, AccumulateCarriesNanAndInfinityInP) {
  if (!vnni_usable()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  for (float bad : {NAN, INFINITY}) {
    const int64_t m = 2, n = 40, d = 48;
    std::vector<float> p(size_t(m * n), 0.25f);
    p[size_t(n + 35)] = bad;  // row 1, second chunk
    std::vector<int8_t> cache(size_t(n * d), 3);
    cache[size_t(35 * d + 7)] = 0;
    std::vector<const void*> rows;
    for (int64_t c = 0; c < n; ++c) rows.push_back(cache.data() + c * d);
    std::vector<float> acc(size_t(m * d), 1.0f);
    detail::few_rows_int8_accumulate_vnni(m, n, d, p.data(), n, rows.data(), acc.data(), d);
    for (int64_t t = 0; t < d; ++t) {
      EXPECT_NEAR(acc[size_t(t)], 1.0 + 0.75 * (t == 7 ? n - 1 : n), 1e-4) << t;  // row 0: finite
      if (std::isnan(bad) || t == 7) EXPECT_TRUE(std::isnan(acc[size_t(d + t)])) << t;
      else EXPECT_EQ(acc[size_t(d + t)], INFINITY) << t;
    }
  }
}

// P below 2^-100 (V scales of ~1e-36): 32767 / max |P| would overflow, so
// such a chunk takes fp32 products, exact here.
TEST(FewRowsVnni, AccumulateTakesTinyPInFp32) {
  if (!vnni_usable()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  const int64_t n = 40, d = 20;
  std::vector<float> p(size_t(n), std::ldexp(1.0f, -120));
  p[3] = 0.0f;
  std::vector<int8_t> cache(size_t(n * d), -2);
  std::vector<const void*> rows;
  for (int64_t c = 0; c < n; ++c) rows.push_back(cache.data() + c * d);
  std::vector<float> acc(size_t(d), 0.0f);
  detail::few_rows_int8_accumulate_vnni(1, n, d, p.data(), n, rows.data(), acc.data(), d);
  for (int64_t t = 0; t < d; ++t) EXPECT_EQ(acc[size_t(t)], -2.0f * (n - 1) * std::ldexp(1.0f, -120)) << t;
}

}  // namespace
}  // namespace tileattn::testing
