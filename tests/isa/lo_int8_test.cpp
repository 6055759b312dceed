// P V's lo on int8 products (src/isa/avx512bf16/lo_int8.hpp) against scalar
// definitions written from its comments: the V_q + 128 layout and scales,
// the exponentials' hi (bf16, nearest even) + lo_q with its scale and
// offset, and the int8 product with its per-row correction. Emulated
// everywhere; natively (bit for bit against the emulation) where the CPU has
// AVX512-BF16 and VNNI. The forward on the emulated rung takes the int8
// products (vpdpbusd counted) and keeps the tolerance rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "isa/bf16_kernel_sets.hpp"
#include "isa/bf16_native_gate.hpp"
#include "isa/emulated_bf16_forward.hpp"
#include "testing/case_table.hpp"
#include "testing/problem_case.hpp"

namespace tileattn::testing {
namespace {

constexpr int64_t kKvPad = 64, kDPad = 48;  // a 64-key tile, V head dim 40 padded to 48
constexpr int64_t kD = 40;

float bf16_value(uint16_t bits) { return detail::bf16_to_float(bits); }

// A V tile (n keys of kD bf16 values) in the pair layout (Bf16Packing's
// bf16_pack_v), column c scaled by 2^(c % 7 - 3), column 5 all zero, and
// `special` (if not 0) at key 3 of column 9, or, below 1 in magnitude, as
// every value of column 9.
struct PairTile {
  alignas(64) uint16_t bits[kKvPad * kDPad] = {};
  const uint16_t* data() const { return bits; }
};
PairTile pair_tile(int64_t n, float special, std::vector<float>& values) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  values.assign(size_t(kKvPad * kDPad), 0.0f);
  PairTile tile;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < kD; ++c) {
      float x = c == 5 ? 0.0f : std::ldexp(normal(gen), int(c % 7) - 3);
      if (special != 0.0f && c == 9 && (j == 3 || std::fabs(special) < 1.0f)) x = special;
      const uint16_t bits = detail::float_to_bf16(x);
      values[size_t(j * kDPad + c)] = bf16_value(bits);
      tile.bits[(c / 16) * 16 * kKvPad + (j / 2) * 32 + (c % 16) * 2 + j % 2] = bits;
    }
  return tile;
}

struct PackedV {
  alignas(64) uint8_t v_q[kKvPad * kDPad];
  alignas(64) float v_scale[kDPad];
  bool ok = false;
};

void check_pack(const Bf16KernelSet& set) {
  SCOPED_TRACE(set.name);
  std::vector<float> values;
  const PairTile tile = pair_tile(45, 0.0f, values);
  PackedV packed;
  packed.ok = set.lo_int8_pack_v(tile.data(), kKvPad, kDPad, packed.v_q, packed.v_scale);
  ASSERT_TRUE(packed.ok);
  for (int64_t c = 0; c < kDPad; ++c) {
    float largest = 0.0f;
    for (int64_t j = 0; j < kKvPad; ++j) largest = std::max(largest, std::fabs(values[size_t(j * kDPad + c)]));
    EXPECT_EQ(packed.v_scale[c], largest / 127.0f) << "column " << c;
    for (int64_t j = 0; j < kKvPad; ++j) {
      const int q = int(packed.v_q[(c / 16) * 16 * kKvPad + (j / 4) * 64 + (c % 16) * 4 + j % 4]) - 128;
      const float v = values[size_t(j * kDPad + c)];
      const float expected = largest == 0.0f ? 0.0f : std::nearbyint(v * (127.0f / largest));
      ASSERT_EQ(q, int(expected)) << "key " << j << " column " << c;
    }
  }
  // Columns the int8 products do not take: the tile keeps the bf16 lo.
  for (float special : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                        0x1p101f, 0x1p-101f, -0x1p101f}) {
    const PairTile odd = pair_tile(45, special, values);
    PackedV refused;
    EXPECT_FALSE(set.lo_int8_pack_v(odd.data(), kKvPad, kDPad, refused.v_q, refused.v_scale)) << special;
  }
}

// Rows of scores: random, one row -inf but for key 0, one row whose
// exponentials are all exact in bf16 (lo 0: the row drops its lo). With
// col_scale (a quantized cache's V scales, kK floats), hi and lo split P
// times col_scale[j] while the sums stay P's own.
struct ExpRows {
  static constexpr int64_t kRows = 3, kLd = 80, kK = 64, kN = 45;
  alignas(64) float s[kRows * kLd];
  float sub[kRows], sums[kRows], lo_scale[kRows];
  int32_t lo_offset[kRows];
  alignas(64) uint16_t hi[kRows * kK];
  alignas(64) int8_t lo_q[kRows * kK];
};

void check_exponentials(const Bf16KernelSet& set, ExpRows& e, const float* col_scale = nullptr) {
  SCOPED_TRACE(set.name + (col_scale ? " with column scales" : ""));
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  for (float& x : e.s) x = 3.0f * normal(gen);
  for (int64_t j = 1; j < ExpRows::kN; ++j) e.s[ExpRows::kLd + j] = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < ExpRows::kN; ++j) e.s[2 * ExpRows::kLd + j] = float(-(j % 4));
  std::vector<float> scores(e.s, e.s + ExpRows::kRows * ExpRows::kLd);
  for (int64_t r = 0; r < ExpRows::kRows; ++r) {
    e.sub[r] = -1e30f;
    for (int64_t j = 0; j < ExpRows::kN; ++j) e.sub[r] = std::max(e.sub[r], scores[size_t(r * ExpRows::kLd + j)]);
  }
  std::memset(e.hi, 0x55, sizeof e.hi);
  std::memset(e.lo_q, 0x55, sizeof e.lo_q);
  set.lo_int8_exp_rows(e.s, ExpRows::kLd, ExpRows::kRows, ExpRows::kN, ExpRows::kK, 1.0f, e.sub, e.sums, e.hi,
                       ExpRows::kK, e.lo_q, ExpRows::kK, e.lo_scale, e.lo_offset, col_scale);
  // What hi + lo split: P, times the column's scale.
  const auto split_p = [&](int64_t r, int64_t j) {
    const double p = std::exp2(double(scores[size_t(r * ExpRows::kLd + j)]) - e.sub[r]);
    return col_scale ? p * col_scale[j] : p;
  };
  for (int64_t r = 0; r < ExpRows::kRows; ++r) {
    double sum = 0.0, largest_p = 0.0;
    int32_t q_sum = 0;
    for (int64_t j = 0; j < ExpRows::kN; ++j) {
      sum += std::exp2(double(scores[size_t(r * ExpRows::kLd + j)]) - e.sub[r]);
      largest_p = std::max(largest_p, split_p(r, j));
    }
    for (int64_t j = 0; j < ExpRows::kK; ++j) {
      const double p = j < ExpRows::kN ? split_p(r, j) : 0.0;
      const double hi = bf16_value(e.hi[r * ExpRows::kK + j]);
      const int q = e.lo_q[r * ExpRows::kK + j];
      q_sum += q;
      // hi: P rounded to bf16 (P itself within the exponentials' 2^-22).
      ASSERT_LE(std::fabs(hi - p), std::ldexp(p, -8) * (1 + 1e-5)) << "row " << r << " key " << j;
      // hi + lo: P within half a step of the row's lo (2^-16 of its largest P).
      ASSERT_LE(std::fabs(hi + q * double(e.lo_scale[r]) - p), std::ldexp(largest_p, -16) + 4e-7 * p)
          << "row " << r << " key " << j;
      if (j >= ExpRows::kN) {
        ASSERT_EQ(q, 0) << "past n";
      }
    }
    EXPECT_NEAR(e.sums[r], sum, 1e-6 * sum) << "row " << r;
    EXPECT_EQ(e.lo_offset[r], 128 * q_sum) << "row " << r;
  }
  if (!col_scale) {
    EXPECT_EQ(e.lo_scale[2], 0.0f) << "a row whose P is exact in bf16 drops its lo";
  }
}

// Column scales across 2^-7 .. 2^7, not powers of two (P times them is not
// exact in bf16).
std::vector<float> column_scales() {
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> exponent(-7.0f, 7.0f);
  std::vector<float> scales(ExpRows::kK);
  for (float& x : scales) x = std::exp2(exponent(gen)) * 1.0371f;
  return scales;
}

struct Products {
  static constexpr int64_t kM = 13, kLda = 64, kLdc = 56;
  alignas(64) int8_t a[kM * kLda];
  float a_scale[kM];
  int32_t a_offset[kM];
  alignas(64) float c[kM * kLdc];
};

void check_products(const Bf16KernelSet& set, const PackedV& v, Products& pr, int64_t k) {
  SCOPED_TRACE(set.name + " k " + std::to_string(k));
  std::mt19937 gen(13);
  std::uniform_int_distribution<int> byte(-127, 127);
  std::normal_distribution<float> normal;
  for (int64_t r = 0; r < Products::kM; ++r) {
    int32_t sum = 0;
    for (int64_t j = 0; j < Products::kLda; ++j) {
      pr.a[r * Products::kLda + j] = j < k ? int8_t(byte(gen)) : int8_t(0);
      sum += pr.a[r * Products::kLda + j];
    }
    pr.a_offset[r] = 128 * sum;
    pr.a_scale[r] = std::ldexp(1.0f + float(r) / 16, -20 + int(r % 3));
  }
  for (float& x : pr.c) x = normal(gen);
  const std::vector<float> c0(pr.c, pr.c + Products::kM * Products::kLdc);
  set.lo_int8_products(Products::kM, kDPad, k, pr.a, Products::kLda, pr.a_scale, pr.a_offset, v.v_q, 16 * kKvPad,
                       v.v_scale, pr.c, Products::kLdc);
  for (int64_t r = 0; r < Products::kM; ++r)
    for (int64_t c = 0; c < Products::kLdc; ++c) {
      double expected = c0[size_t(r * Products::kLdc + c)];
      if (c < kDPad) {
        int64_t dot = 0;
        for (int64_t j = 0; j < k; ++j)
          dot += int64_t(pr.a[r * Products::kLda + j]) *
                 (int64_t(v.v_q[(c / 16) * 16 * kKvPad + (j / 4) * 64 + (c % 16) * 4 + j % 4]) - 128);
        expected += double(dot) * pr.a_scale[r] * v.v_scale[c];
      }
      ASSERT_NEAR(pr.c[r * Products::kLdc + c], expected, 1e-6 * (std::fabs(expected) + 1e-3))
          << "row " << r << " column " << c;
    }
}

void check_set(const Bf16KernelSet& set) {
  ASSERT_NE(set.lo_int8_pack_v, nullptr);
  check_pack(set);
  ExpRows e;
  check_exponentials(set, e);
  const std::vector<float> scales = column_scales();
  check_exponentials(set, e, scales.data());
  std::vector<float> values;
  const PairTile tile = pair_tile(64, 0.0f, values);
  PackedV v;
  ASSERT_TRUE(set.lo_int8_pack_v(tile.data(), kKvPad, kDPad, v.v_q, v.v_scale));
  Products pr;
  for (int64_t k : {4, 32, 64}) check_products(set, v, pr, k);
}

TEST(LoInt8, EmulatedKernelsMatchTheirDefinitions) { check_set(emulated_dot_kernels()); }

TEST(LoInt8, AmxKeepsTheBf16Lo) { EXPECT_EQ(emulated_amx_kernels().lo_int8_pack_v, nullptr); }

TEST(LoInt8, NativeKernelsMatchTheEmulationBitForBit) {
  TILEATTN_REQUIRE_NATIVE(Isa::avx512bf16);
  if (!cpu_features().avx512_vnni) GTEST_SKIP() << "this CPU lacks AVX512-VNNI";
  const Bf16KernelSet native = native_dot_kernels(), emulated = emulated_dot_kernels();
  check_set(native);
  std::vector<float> values;
  const PairTile tile = pair_tile(45, 0.0f, values);
  PackedV vn, ve;
  ASSERT_TRUE(native.lo_int8_pack_v(tile.data(), kKvPad, kDPad, vn.v_q, vn.v_scale));
  ASSERT_TRUE(emulated.lo_int8_pack_v(tile.data(), kKvPad, kDPad, ve.v_q, ve.v_scale));
  EXPECT_EQ(std::memcmp(vn.v_q, ve.v_q, sizeof vn.v_q), 0);
  EXPECT_EQ(std::memcmp(vn.v_scale, ve.v_scale, sizeof vn.v_scale), 0);
  const std::vector<float> scales = column_scales();
  for (const float* col_scale : {static_cast<const float*>(nullptr), scales.data()}) {
    ExpRows en, ee;
    check_exponentials(native, en, col_scale);
    check_exponentials(emulated, ee, col_scale);
    EXPECT_EQ(std::memcmp(en.hi, ee.hi, sizeof en.hi), 0);
    EXPECT_EQ(std::memcmp(en.lo_q, ee.lo_q, sizeof en.lo_q), 0);
    EXPECT_EQ(std::memcmp(en.lo_scale, ee.lo_scale, sizeof en.lo_scale), 0);
    EXPECT_EQ(std::memcmp(en.sums, ee.sums, sizeof en.sums), 0);
  }
  Products pn, pe;
  check_products(native, vn, pn, 64);
  check_products(emulated, vn, pe, 64);
  EXPECT_EQ(std::memcmp(pn.c, pe.c, sizeof pn.c), 0);
}

// The emulated avx512bf16 forward takes the int8 products (counted), keeps
// the rule, and does not with P rounded to bf16 (no lo) or under dropout.
TEST(LoInt8, EmulatedForwardTakesThemAndKeepsTheRule) {
  Case c = correctness_cases().front();
  for (const Case& candidate : correctness_cases())
    if (candidate.seqlen_q >= 64 && candidate.seqlen_k >= 64 && candidate.head_dim == 64) {
      c = candidate;
      break;
    }
  c.dtype = DType::bf16;
  CaseData data(c);
  const int64_t before = emulated_int8_dot_count();
  ASSERT_TRUE(emulated_bf16_forward(data.args, Isa::avx512bf16)) << c.name();
  EXPECT_GT(emulated_int8_dot_count(), before) << c.name();
  const Comparison cmp = compare_with_reference(data);
  EXPECT_TRUE(cmp.ok()) << c.name() << ": " << cmp.describe();

  CaseData rounded(c);
  rounded.args.bf16_probabilities = true;
  const int64_t before_rounded = emulated_int8_dot_count();
  ASSERT_TRUE(emulated_bf16_forward(rounded.args, Isa::avx512bf16));
  EXPECT_EQ(emulated_int8_dot_count(), before_rounded) << "bf16_probabilities has no lo";
}

}  // namespace
}  // namespace tileattn::testing
