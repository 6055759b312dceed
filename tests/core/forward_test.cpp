// The forward operator against the float64 reference, on every ISA path this
// CPU can run (forced), with 1 and 2 threads, over a table of awkward cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "testing/case_table.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

std::vector<Isa> paths() { return {Isa::generic, Isa::avx2, Isa::avx512}; }

// Runs `c` on `isa` with 1 and 2 threads; checks accuracy and that the two
// thread counts agree bit for bit.
void check_case(const Case& c, Isa isa) {
  if (!isa_available(isa)) GTEST_SKIP() << isa_name(isa) << " not available on this CPU";
  CaseData one(c), two(c);
  one.args.isa = two.args.isa = isa;
  one.args.threads = 1;
  two.args.threads = 2;
  attention_forward(one.args);
  attention_forward(two.args);
  const Comparison cmp = compare_with_reference(one);
  EXPECT_TRUE(cmp.ok()) << c.name() << " on " << isa_name(isa) << ": " << cmp.describe();
  const size_t bytes = c.dtype == DType::f32 ? one.o32.size() * 4 : one.o16.size() * 2;
  const void* o1 = c.dtype == DType::f32 ? static_cast<const void*>(one.o32.data()) : one.o16.data();
  const void* o2 = c.dtype == DType::f32 ? static_cast<const void*>(two.o32.data()) : two.o16.data();
  EXPECT_EQ(std::memcmp(o1, o2, bytes), 0) << c.name() << ": 1 and 2 threads differ";
  EXPECT_EQ(std::memcmp(one.lse.data(), two.lse.data(), one.lse.size() * 4), 0)
      << c.name() << ": LSE differs between 1 and 2 threads";
}

class ForwardCases : public ::testing::TestWithParam<std::tuple<Case, Isa>> {};

TEST_P(ForwardCases, MatchesFloat64Reference) {
  check_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

std::string case_test_name(const ::testing::TestParamInfo<std::tuple<Case, Isa>>& info) {
  std::string name = std::get<0>(info.param).name() + "_" + isa_name(std::get<1>(info.param));
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Table, ForwardCases,
                         ::testing::Combine(::testing::ValuesIn(correctness_cases()),
                                            ::testing::ValuesIn(paths())),
                         case_test_name);

class ForwardEdges : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_available(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << " not available";
  }
  void run(CaseData& data) {
    data.args.isa = GetParam();
    attention_forward(data.args);
  }
};

TEST_P(ForwardEdges, WindowHidingEverythingGivesZerosAndMinusInfLse) {
  Case c;
  c.seqlen_q = 40;
  c.seqlen_k = 8;  // bottom-right alignment: rows 0..31 see no key with window (0, 0)
  c.mask = MaskCase::window;
  c.window_left = 0;
  c.window_right = 0;
  CaseData data(c);
  run(data);
  EXPECT_TRUE(compare_with_reference(data).ok());
  for (int64_t row = 0; row < 32; ++row) {
    EXPECT_EQ(data.lse_at(0, 0, row), -std::numeric_limits<float>::infinity());
    for (int64_t d = 0; d < c.head_dim; ++d) ASSERT_EQ(data.o_at(0, 1, row, d), 0.0f);
  }
}

TEST_P(ForwardEdges, AllFalseBooleanMaskGivesZeros) {
  Case c;
  c.mask = MaskCase::boolean;
  CaseData data(c);
  std::fill(data.bool_mask.begin(), data.bool_mask.end(), 0);
  run(data);
  for (float x : data.o32) ASSERT_EQ(x, 0.0f);
  for (float x : data.lse) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST_P(ForwardEdges, LargeScoresDoNotOverflow) {
  Case c;
  c.head_dim = 8;
  c.input_scale = 60.0f;  // |q.k| up to ~3e4
  c.scale = 1.0f;
  c.seqlen_q = c.seqlen_k = 97;
  CaseData data(c);
  run(data);
  const Comparison cmp = compare_with_reference(data);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  for (float x : data.o32) ASSERT_TRUE(std::isfinite(x));
}

TEST_P(ForwardEdges, NaNInOneQueryRowStaysInThatRow) {
  Case c;
  c.seqlen_q = c.seqlen_k = 97;
  CaseData data(c);
  data.set_q(0, 1, 5, 3, std::numeric_limits<float>::quiet_NaN());
  run(data);
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t row = 0; row < c.seqlen_q; ++row) {
      const bool poisoned = h == 1 && row == 5;
      EXPECT_EQ(std::isnan(data.o_at(0, h, row, 0)), poisoned) << "head " << h << " row " << row;
    }
  EXPECT_TRUE(compare_with_reference(data).ok());
}

TEST_P(ForwardEdges, NaNInOneKeyRowReachesOnlyRowsThatSeeIt) {
  Case c;
  c.seqlen_q = c.seqlen_k = 97;
  c.mask = MaskCase::causal;
  CaseData data(c);
  data.set_k(0, 0, 50, 0, std::numeric_limits<float>::quiet_NaN());
  run(data);
  for (int64_t row = 0; row < c.seqlen_q; ++row)
    EXPECT_EQ(std::isnan(data.o_at(0, 0, row, 0)), row >= 50) << "row " << row;
  EXPECT_TRUE(compare_with_reference(data).ok());
}

TEST_P(ForwardEdges, EveryTileShapeIsCorrect) {
  // Every block_q `tileattn tune` may pick (and odd ones); 300 query rows so
  // that the tall tiles are not shrunk to the sequence.
  for (int bq : {1, 7, 16, 64, 128, 192, 256})
    for (int bkv : {1, 13, 16, 64, 256}) {
      Case c;
      c.seqlen_q = 300;
      c.seqlen_k = 131;
      c.head_dim = 59;
      c.mask = MaskCase::causal;
      CaseData data(c);
      data.args.block_q = bq;
      data.args.block_kv = bkv;
      run(data);
      const Comparison cmp = compare_with_reference(data);
      EXPECT_TRUE(cmp.ok()) << bq << "x" << bkv << ": " << cmp.describe();
    }
}

INSTANTIATE_TEST_SUITE_P(Paths, ForwardEdges, ::testing::ValuesIn(paths()),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(isa_name(info.param));
                         });

}  // namespace
}  // namespace tileattn::testing
