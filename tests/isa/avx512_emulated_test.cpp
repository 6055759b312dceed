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
#include "support/forward_edge_checks.hpp"
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

// The edge checks of tests/support/forward_edge_checks.hpp on the emulation.
edges::ForwardPath emulated_path() {
  return {[](CaseData& data) { return emulated_avx512_forward(data.args); }, kNoNativeFewRows,
          Isa::avx512};
}

TEST(Avx512EmulatedForwardEdges, WindowHidingEverythingGivesZerosAndMinusInfLse) {
  edges::window_hiding_everything(emulated_path());
}
TEST(Avx512EmulatedForwardEdges, AllFalseBooleanMaskGivesZeros) {
  edges::all_false_boolean_mask(emulated_path());
}
TEST(Avx512EmulatedForwardEdges, LargeScoresDoNotOverflow) { edges::large_scores(emulated_path()); }
TEST(Avx512EmulatedForwardEdges, NaNInOneQueryRowStaysInThatRow) {
  edges::nan_in_one_query_row(emulated_path());
}
TEST(Avx512EmulatedForwardEdges, NaNInOneKeyRowReachesOnlyRowsThatSeeIt) {
  edges::nan_in_one_key_row(emulated_path());
}
TEST(Avx512EmulatedForwardEdges, NaNInAKeyRowOfADecodeSplitReachesTheMergedRow) {
  edges::nan_in_a_decode_split(emulated_path());
}
TEST(Avx512EmulatedForwardEdges, EveryTileShapeIsCorrect) { edges::every_tile_shape(emulated_path()); }

}  // namespace
}  // namespace tileattn::testing
