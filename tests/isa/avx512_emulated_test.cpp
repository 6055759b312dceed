// The forward main loop instantiated with the AVX-512 kernels on the scalar
// emulation (emulated_avx512_forward.hpp), planned exactly as
// attention_forward plans a call on Isa::avx512 (its tile shapes, GQA
// stacking, key splits), and checked against the float64 reference by the
// tolerance rule: the AVX-512 path checked on a CPU that cannot run it.
// Decode-shaped cases also run its few-rows products (natively, AVX2);
// avx512_emulated_decode_test.cpp covers those in depth.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/forward_plan.hpp"
#include "isa/emulated_avx512_forward.hpp"
#include "testing/case_table.hpp"
#include "testing/problem_case.hpp"

namespace tileattn::testing {
namespace {

constexpr const char* kNoNativeFewRows =
    "decode-shaped plan: the few-rows products run natively and need AVX2, FMA and F16C";

class Avx512EmulatedForward : public ::testing::TestWithParam<Case> {};

// As forward_tests' check: accurate by the tolerance rule, and 1 and 2
// threads agree bit for bit. The whole table runs (about 10 s here): the
// emulation costs only a few times the portable path.
TEST_P(Avx512EmulatedForward, MatchesFloat64Reference) {
  const Case& c = GetParam();
  CaseData one(c), two(c);
  one.args.threads = 1;
  two.args.threads = 2;
  if (!emulated_avx512_forward(one.args)) GTEST_SKIP() << kNoNativeFewRows;
  if (!emulated_avx512_forward(two.args)) GTEST_SKIP() << kNoNativeFewRows;
  const Comparison cmp = compare_with_reference(one);
  EXPECT_TRUE(cmp.ok()) << c.name() << " on emulated avx512: " << cmp.describe();
  EXPECT_EQ(one.o32, two.o32) << c.name() << ": 1 and 2 threads differ";
  EXPECT_EQ(one.o16, two.o16) << c.name() << ": 1 and 2 threads differ";
  EXPECT_EQ(std::memcmp(one.lse.data(), two.lse.data(), one.lse.size() * 4), 0)
      << c.name() << ": LSE differs between 1 and 2 threads";
}

INSTANTIATE_TEST_SUITE_P(Table, Avx512EmulatedForward, ::testing::ValuesIn(correctness_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.name();
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name + "_" + std::to_string(info.index);
                         });

// The table reaches the split-KV (decode) path on AVX-512's tile shapes: the
// emulated merge of partial results is exercised, not just planned.
TEST(Avx512EmulatedForwardTable, CoversKeySplits) {
  int split_cases = 0;
  for (const Case& c : correctness_cases()) {
    CaseData data(c);
    split_cases += detail::plan_forward(data.args, Isa::avx512, 1).kv_splits > 1;
  }
  EXPECT_GE(split_cases, 3);
}

TEST(Avx512EmulatedForwardEdges, WindowHidingEverythingGivesZerosAndMinusInfLse) {
  Case c;
  c.seqlen_q = 40;
  c.seqlen_k = 8;  // bottom-right alignment: rows 0..31 see no key with window (0, 0)
  c.mask = MaskCase::window;
  c.window_left = 0;
  c.window_right = 0;
  CaseData data(c);
  if (!emulated_avx512_forward(data.args)) GTEST_SKIP() << kNoNativeFewRows;
  EXPECT_TRUE(compare_with_reference(data).ok());
  for (int64_t row = 0; row < 32; ++row) {
    EXPECT_EQ(data.lse_at(0, 0, row), -std::numeric_limits<float>::infinity());
    for (int64_t d = 0; d < c.head_dim; ++d) ASSERT_EQ(data.o_at(0, 1, row, d), 0.0f);
  }
}

TEST(Avx512EmulatedForwardEdges, AllFalseBooleanMaskGivesZeros) {
  Case c;
  c.mask = MaskCase::boolean;
  CaseData data(c);
  std::fill(data.bool_mask.begin(), data.bool_mask.end(), 0);
  if (!emulated_avx512_forward(data.args)) GTEST_SKIP() << kNoNativeFewRows;
  for (float x : data.o32) ASSERT_EQ(x, 0.0f);
  for (float x : data.lse) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST(Avx512EmulatedForwardEdges, LargeScoresDoNotOverflow) {
  Case c;
  c.head_dim = 8;
  c.input_scale = 60.0f;  // |q.k| up to ~3e4: exp2's clamp and flush are exercised
  c.scale = 1.0f;
  c.seqlen_q = c.seqlen_k = 97;
  CaseData data(c);
  if (!emulated_avx512_forward(data.args)) GTEST_SKIP() << kNoNativeFewRows;
  const Comparison cmp = compare_with_reference(data);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  for (float x : data.o32) ASSERT_TRUE(std::isfinite(x));
}

TEST(Avx512EmulatedForwardEdges, NaNInOneQueryRowStaysInThatRow) {
  Case c;
  c.seqlen_q = c.seqlen_k = 97;
  CaseData data(c);
  data.set_q(0, 1, 5, 3, std::numeric_limits<float>::quiet_NaN());
  if (!emulated_avx512_forward(data.args)) GTEST_SKIP() << kNoNativeFewRows;
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t row = 0; row < c.seqlen_q; ++row) {
      const bool poisoned = h == 1 && row == 5;
      EXPECT_EQ(std::isnan(data.o_at(0, h, row, 0)), poisoned) << "head " << h << " row " << row;
    }
  EXPECT_TRUE(compare_with_reference(data).ok());
}

TEST(Avx512EmulatedForwardEdges, NaNInOneKeyRowReachesOnlyRowsThatSeeIt) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Case c;
    c.seqlen_q = c.seqlen_k = 97;
    c.mask = MaskCase::causal;
    c.dtype = dtype;
    CaseData data(c);
    data.set_k(0, 0, 50, 0, std::numeric_limits<float>::quiet_NaN());
    if (!emulated_avx512_forward(data.args)) GTEST_SKIP() << kNoNativeFewRows;
    for (int64_t row = 0; row < c.seqlen_q; ++row)
      EXPECT_EQ(std::isnan(data.o_at(0, 0, row, 0)), row >= 50) << dtype_name(dtype) << " row " << row;
    EXPECT_TRUE(compare_with_reference(data).ok()) << dtype_name(dtype);
  }
}

TEST(Avx512EmulatedForwardEdges, NaNInAKeyRowOfADecodeSplitReachesTheMergedRow) {
  Case c;
  c.heads = 4;
  c.kv_heads = 1;
  c.seqlen_q = 1;
  c.seqlen_k = 1100;  // split into key ranges, merged afterwards
  CaseData data(c);
  ASSERT_GT(detail::plan_forward(data.args, Isa::avx512, 1).kv_splits, 1);
  data.set_k(0, 0, 900, 7, std::numeric_limits<float>::quiet_NaN());
  if (!emulated_avx512_forward(data.args)) GTEST_SKIP() << kNoNativeFewRows;
  for (int64_t h = 0; h < c.heads; ++h) EXPECT_TRUE(std::isnan(data.o_at(0, h, 0, 0))) << h;
  EXPECT_TRUE(compare_with_reference(data).ok());
}

TEST(Avx512EmulatedForwardEdges, EveryTileShapeIsCorrect) {
  for (int bq : {1, 7, 16, 64, 128})
    for (int bkv : {1, 13, 16, 64, 256}) {
      Case c;
      c.seqlen_q = 97;
      c.seqlen_k = 131;
      c.head_dim = 59;
      c.mask = MaskCase::causal;
      CaseData data(c);
      data.args.block_q = bq;
      data.args.block_kv = bkv;
      if (!emulated_avx512_forward(data.args)) GTEST_SKIP() << kNoNativeFewRows;
      const Comparison cmp = compare_with_reference(data);
      EXPECT_TRUE(cmp.ok()) << bq << "x" << bkv << ": " << cmp.describe();
    }
}

}  // namespace
}  // namespace tileattn::testing
