// The amx rung's decode scores of an int8 cache on AMX-INT8 tiles
// (amx_kernels.hpp, int8_tiles): the query rows split into four int8 pieces,
// tdpbssd against the keys, the pieces' sums combined in fp32. On the tile
// model everywhere (emulated_amx_kernels) against float64 dot products, and
// natively, bit for bit equal to the model, where the CPU has AMX-INT8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "isa/bf16_kernel_sets.hpp"
#include "isa/bf16_native_gate.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

struct Int8ScoresCase {
  int64_t m, n, d;
};

// Query rows with magnitudes over six decades (small elements are where the
// pieces' fixed point, relative to the row's largest, could lose digits) and
// a cache of random int8 keys whose rows the table visits out of order, as a
// paged cache's would be.
struct Int8ScoresData {
  Int8ScoresCase c;
  int64_t ldq;
  std::vector<float> q;
  std::vector<int8_t> cache;
  std::vector<const void*> rows;
  explicit Int8ScoresData(Int8ScoresCase cc, uint32_t seed) : c(cc), ldq(cc.d + 3) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> decade(-6, 0), byte(-128, 127);
    q.assign(size_t(c.m * ldq), 0.0f);
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t t = 0; t < c.d; ++t) q[size_t(r * ldq + t)] = normal(rng) * std::pow(10.0f, float(decade(rng)));
    cache.resize(size_t((c.n + 5) * c.d));
    for (int8_t& x : cache) x = int8_t(byte(rng));
    std::vector<int64_t> order(size_t(c.n + 5));
    for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t j = 0; j < c.n; ++j) rows.push_back(cache.data() + order[size_t(j)] * c.d);
  }
  // The float64 dot product; *magnitude = sum |q_t k_t|, *pieces_bound =
  // 2^-32 max|q| sum |k_t|.
  double exact(int64_t r, int64_t j, double* magnitude, double* pieces_bound) const {
    const int8_t* k = static_cast<const int8_t*>(rows[size_t(j)]);
    double sum = 0.0, mag = 0.0, max_q = 0.0, sum_k = 0.0;
    for (int64_t t = 0; t < c.d; ++t) {
      const double x = q[size_t(r * ldq + t)];
      sum += x * double(k[t]);
      mag += std::fabs(x * double(k[t]));
      max_q = std::max(max_q, std::fabs(x));
      sum_k += std::fabs(double(k[t]));
    }
    *magnitude = mag;
    *pieces_bound = std::ldexp(max_q * sum_k, -32);
    return sum;
  }
  // The naive fp32 dot product (one rounding per product and per sum).
  float naive(int64_t r, int64_t j) const {
    const int8_t* k = static_cast<const int8_t*>(rows[size_t(j)]);
    float sum = 0.0f;
    for (int64_t t = 0; t < c.d; ++t) sum += q[size_t(r * ldq + t)] * float(k[t]);
    return sum;
  }
};

std::vector<Int8ScoresCase> cases() {
  std::vector<Int8ScoresCase> out;
  for (int64_t m : {1, 3, 4, 5, 8})
    for (int64_t d : {4, 60, 64, 128, 200, 576})
      for (int64_t n : {1, 15, 16, 17, 32, 40}) out.push_back({m, n, d});
  return out;
}

// The tolerance rule at the scale of one score: twice the naive fp32 dot
// product's error, plus a floor of 2^-22 of sum |q_t k_t| (a few roundings of
// the combined pieces, which round the sum rather than each product), plus
// the pieces' own bound: each element's residual is at most 2^-32.9 of the
// row's max |q| (amx_kernels.hpp), so 2^-32 max|q| sum |k_t| in all. That
// term exceeds fp32's rounding only where the row's largest element meets a
// small key byte while elements 2^-8 of it meet large ones (these rows span
// six decades on purpose); the decode tests' rule on O holds either way.
void expect_scores_correct(const Bf16KernelSet& set) {
  uint32_t seed = 1;
  for (const Int8ScoresCase& c : cases()) {
    SCOPED_TRACE(set.name + " m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " d " + std::to_string(c.d));
    const Int8ScoresData data(c, seed++);
    const int64_t lds = c.n + 7;
    std::vector<float> s(size_t(c.m * lds), -1.0f);
    ASSERT_TRUE(set.int8_scores(c.m, c.n, c.d, data.q.data(), data.ldq, data.rows.data(), s.data(), lds));
    int bad = 0;
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t j = 0; j < c.n; ++j) {
        double magnitude = 0.0, pieces_bound = 0.0;
        const double want = data.exact(r, j, &magnitude, &pieces_bound);
        const double tolerance =
            2.0 * std::fabs(double(data.naive(r, j)) - want) + std::ldexp(magnitude, -22) + pieces_bound;
        const double got = s[size_t(r * lds + j)];
        if (!(std::fabs(got - want) <= tolerance) && bad++ < 5)
          ADD_FAILURE() << "s[" << r << ", " << j << "] = " << got << ", float64 " << want << ", tolerance "
                        << tolerance;
      }
      // Columns past n are left as they were.
      for (int64_t j = c.n; j < lds; ++j) ASSERT_EQ(s[size_t(r * lds + j)], -1.0f) << "column " << j;
    }
  }
}

TEST(AmxInt8Scores, ModelMatchesFloat64) { expect_scores_correct(emulated_amx_kernels()); }

TEST(AmxInt8Scores, RowsThatAreNotFiniteAreRefused) {
  const Bf16KernelSet set = emulated_amx_kernels();
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    Int8ScoresData data({4, 16, 128}, 7);
    data.q[size_t(2 * data.ldq + 100)] = bad;
    std::vector<float> s(4 * 16, -1.0f);
    EXPECT_FALSE(set.int8_scores(4, 16, 128, data.q.data(), data.ldq, data.rows.data(), s.data(), 16));
  }
  // All zeros is finite: scores of 0.
  Int8ScoresData zero({2, 16, 64}, 8);
  std::fill(zero.q.begin(), zero.q.end(), 0.0f);
  std::vector<float> s(2 * 16, -1.0f);
  ASSERT_TRUE(set.int8_scores(2, 16, 64, zero.q.data(), zero.ldq, zero.rows.data(), s.data(), 16));
  for (float x : s) EXPECT_EQ(x, 0.0f);
}

TEST(AmxInt8Scores, NativeEqualsTheModelBitForBit) {
  const NativeGate gate = native_gate(Isa::amx);
  if (gate.fail) FAIL() << gate.why;
  if (!gate.run) GTEST_SKIP() << gate.why;
  if (!cpu_features().amx_int8) GTEST_SKIP() << "this CPU has AMX-BF16 but not AMX-INT8";
  const Bf16KernelSet native = native_amx_kernels(), model = emulated_amx_kernels();
  expect_scores_correct(native);
  uint32_t seed = 100;
  for (const Int8ScoresCase& c : cases()) {
    SCOPED_TRACE("m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " d " + std::to_string(c.d));
    const Int8ScoresData data(c, seed++);
    std::vector<float> a(size_t(c.m * c.n)), b(size_t(c.m * c.n));
    ASSERT_TRUE(native.int8_scores(c.m, c.n, c.d, data.q.data(), data.ldq, data.rows.data(), a.data(), c.n));
    ASSERT_TRUE(model.int8_scores(c.m, c.n, c.d, data.q.data(), data.ldq, data.rows.data(), b.data(), c.n));
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace tileattn::testing
