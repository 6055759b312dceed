// The forward operator against the float64 reference, on every ISA path this
// CPU can run (forced), with 1 and 2 threads, over a table of awkward cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "support/forward_edge_checks.hpp"
#include "support/thread_census.hpp"
#include "testing/case_table.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

std::vector<Isa> paths() { return {Isa::generic, Isa::avx2, Isa::avx512}; }

// Runs `c` on `isa` with 1 and 2 threads; checks accuracy, that the check
// bites (every output x 1.001 for fp32, x 1.01 for fp16/bf16, must fail), and
// that the two thread counts agree bit for bit. The 2-thread run goes through
// the test hook that makes both threads run items (a small call would
// otherwise run on the calling thread alone, and a helper that wakes late
// finds every item taken), and the test checks that they did.
void check_case(const Case& c, Isa isa) {
  if (!isa_available(isa)) GTEST_SKIP() << isa_name(isa) << " not available on this CPU";
  CaseData one(c), two(c);
  one.args.isa = two.args.isa = isa;
  one.args.threads = 1;
  two.args.threads = 2;
  attention_forward(one.args);
  const detail::ThreadCensus census = run_on_every_thread([&] { attention_forward(two.args); });
  expect_threads_took_part(census, 2, c.name());
  const ReferenceOutput ref = reference_forward(one.args), naive = naive_forward(one.args);
  const std::vector<double> o = dense_o(one), lse = dense_lse(one);
  const Comparison cmp = compare_outputs(one.args, ref, naive, o, lse);
  EXPECT_TRUE(cmp.ok()) << c.name() << " on " << isa_name(isa) << ": " << cmp.describe();
  const Comparison off = compare_outputs(one.args, ref, naive, o, lse, c.dtype == DType::f32 ? 1e-3 : 1e-2);
  EXPECT_FALSE(off.ok()) << c.name() << " on " << isa_name(isa) << ": perturbed outputs passed: " << off.describe();
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

// The bf16 rungs differ from avx512 only for bf16 inputs (their fp32 and
// fp16 inputs run the avx512 code, checked above): the whole table with its
// inputs in bf16, on each rung's bf16 products. tests/isa/ checks the same
// products through portable models of vdpbf16ps and the AMX tiles.
std::vector<Case> bf16_table() {
  std::vector<Case> cases;
  for (Case c : correctness_cases()) {
    c.dtype = DType::bf16;
    bool seen = false;
    for (const Case& other : cases) seen |= other.name() == c.name();
    if (!seen) cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Bf16Rungs, ForwardCases,
                         ::testing::Combine(::testing::ValuesIn(bf16_table()),
                                            ::testing::Values(Isa::avx512bf16, Isa::amx)),
                         case_test_name);

// The edge checks of tests/support/forward_edge_checks.hpp on each path.
class ForwardEdges : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_available(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << " not available";
  }
  edges::ForwardPath path() const {
    const Isa isa = GetParam();
    return {[isa](CaseData& data) {
              data.args.isa = isa;
              attention_forward(data.args);
              return true;
            },
            "", isa};
  }
};

TEST_P(ForwardEdges, WindowHidingEverythingGivesZerosAndMinusInfLse) {
  edges::window_hiding_everything(path());
}
TEST_P(ForwardEdges, AllFalseBooleanMaskGivesZeros) { edges::all_false_boolean_mask(path()); }
TEST_P(ForwardEdges, LargeScoresDoNotOverflow) { edges::large_scores(path()); }
TEST_P(ForwardEdges, NaNInOneQueryRowStaysInThatRow) { edges::nan_in_one_query_row(path()); }
TEST_P(ForwardEdges, NaNInOneKeyRowReachesOnlyRowsThatSeeIt) { edges::nan_in_one_key_row(path()); }
TEST_P(ForwardEdges, NaNInAKeyRowOfADecodeSplitReachesTheMergedRow) {
  edges::nan_in_a_decode_split(path());
}
TEST_P(ForwardEdges, EveryTileShapeIsCorrect) { edges::every_tile_shape(path()); }

INSTANTIATE_TEST_SUITE_P(Paths, ForwardEdges, ::testing::ValuesIn(paths()),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(isa_name(info.param));
                         });

}  // namespace
}  // namespace tileattn::testing
