// The forward operator against the float64 reference, on every ISA path this
// CPU can run (forced), with 1 and 2 threads, over a table of awkward cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string>

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
// Each name computed once (comparing every pair's names took most of this
// executable's start-up, which every CTest process pays).
std::vector<Case> bf16_table() {
  std::vector<Case> cases;
  std::set<std::string> names;
  for (Case c : correctness_cases()) {
    c.dtype = DType::bf16;
    if (names.insert(c.name()).second) cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Bf16Rungs, ForwardCases,
                         ::testing::Combine(::testing::ValuesIn(bf16_table()),
                                            ::testing::Values(Isa::avx512bf16, Isa::amx)),
                         case_test_name);

// ForwardArgs::bf16_probabilities on the bf16 rungs: P is rounded to bf16 for
// P V. Each P entry then carries a relative error of at most 2^-8 (bf16's
// unit roundoff, round to nearest even; the row sum stays the fp32 sum of the
// unrounded P), so an output element moves by at most 2^-8 (P |V|)(i, d),
// P the float64 reference's probabilities: each row is allowed 2^-8 x its
// largest (P |V|) on top of the rule (|V| through the reference with V's sign
// bits cleared). The output must differ from the default's somewhere, and
// break the rule alone somewhere (Bf16Probabilities.RoundingShows), or the
// option would not be rounding.
struct Bf16ProbabilitiesRun {
  Comparison with_allowance, strict;
  bool differs_from_default = false;
};

Bf16ProbabilitiesRun run_bf16_probabilities(const Case& c, Isa isa) {
  CaseData rounded(c), exact(c);
  rounded.args.isa = exact.args.isa = isa;
  rounded.args.bf16_probabilities = true;
  attention_forward(rounded.args);
  attention_forward(exact.args);
  const ReferenceOutput ref = reference_forward(rounded.args), naive = naive_forward(rounded.args);
  const std::vector<double> o = dense_o(rounded), lse = dense_lse(rounded);
  Bf16ProbabilitiesRun run;
  run.with_allowance = compare_outputs(rounded.args, ref, naive, o, lse, 0, p_abs_v_allowance(c));
  run.strict = compare_outputs(rounded.args, ref, naive, o, lse);
  run.differs_from_default = rounded.o16 != exact.o16;
  return run;
}

class Bf16Probabilities : public ::testing::TestWithParam<std::tuple<Case, Isa>> {};

TEST_P(Bf16Probabilities, WithinTheRuleAndTheRoundingBound) {
  const auto& [c, isa] = GetParam();
  if (!isa_available(isa)) GTEST_SKIP() << isa_name(isa) << " not available on this CPU";
  const Bf16ProbabilitiesRun run = run_bf16_probabilities(c, isa);
  EXPECT_TRUE(run.with_allowance.ok()) << c.name() << " on " << isa_name(isa) << ": "
                                       << run.with_allowance.describe();
}

INSTANTIATE_TEST_SUITE_P(Bf16Rungs, Bf16Probabilities,
                         ::testing::Combine(::testing::ValuesIn(bf16_table()),
                                            ::testing::Values(Isa::avx512bf16, Isa::amx)),
                         case_test_name);

TEST(Bf16ProbabilitiesShow, RoundingChangesOutputsAndBreaksTheRuleAlone) {
  for (Isa isa : {Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    int differ = 0, strict_failures = 0, cases = 0;
    for (const Case& c : bf16_table()) {
      const Bf16ProbabilitiesRun run = run_bf16_probabilities(c, isa);
      ++cases;
      differ += run.differs_from_default;
      strict_failures += !run.strict.ok();
    }
    EXPECT_GT(differ, cases / 2) << isa_name(isa) << ": P rounded to bf16 changed " << differ << " of " << cases;
    EXPECT_GT(strict_failures, 0) << isa_name(isa) << ": no case broke the rule without the rounding allowance";
    std::printf("%s: bf16_probabilities changed %d of %d cases, %d of them beyond the rule alone\n",
                isa_name(isa), differ, cases, strict_failures);
  }
}

// Scores of magnitude ~1e37 (a bf16 query element of 2^125 in each row; a
// scale of 1e38 over one key) are finite, and the float64 reference gives each row
// its max key's V. On the bf16 rungs the softmax folded the scale into
// exp2(fma(s, scale, -max)), whose rounding residual there is ~2^100: every
// P underflowed and the row came out O = 0, LSE = -inf. Every path must
// give the reference's row.
TEST(HugeScores, RowsKeepTheirMaxKeyOnEveryPath) {
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    for (int variant = 0; variant < 2; ++variant) {
      Case c;
      c.dtype = DType::bf16;
      c.heads = c.kv_heads = 1;
      c.seqlen_q = 16;
      c.seqlen_k = variant == 0 ? 9 : 1;
      c.head_dim = variant == 0 ? 18 : 4;
      if (variant == 1) c.scale = 1e38f;
      CaseData data(c);
      if (variant == 0)
        for (int64_t row = 0; row < c.seqlen_q; ++row) data.set_q(0, 0, row, row % c.head_dim, std::ldexp(1.0f, 125));
      data.args.isa = isa;
      attention_forward(data.args);
      // O by the rule; the LSE (~1e37 here) within 2^-20 of the largest: at
      // such scores the fp32 paths' own LSE breaks the rule's per-row floor
      // where a row's products cancel (docs/accuracy.md, large scores),
      // which is not this check.
      const Comparison cmp = compare_with_reference(data);
      const char* what = variant == 0 ? " q element 2^125: " : " scale 1e38: ";
      EXPECT_TRUE(cmp.ratio <= 1 && !cmp.nan_mismatch) << isa_name(isa) << what << cmp.describe();
      const ReferenceOutput ref = reference_forward(data.args);
      const std::vector<double> lse = dense_lse(data);
      double largest = 0;
      for (double x : ref.lse) largest = std::max(largest, std::fabs(x));
      for (size_t row = 0; row < lse.size(); ++row)
        EXPECT_LE(std::fabs(lse[row] - ref.lse[row]), std::ldexp(largest, -20))
            << isa_name(isa) << what << "LSE row " << row << ": " << lse[row] << " against " << ref.lse[row];
    }
  }
}

// 16-bit inputs multiply exactly in fp32, as naive 16-bit attention multiplies
// them; the FMA paths once pre-multiplied Q by scale * log2(e), a rounding per
// query element that made rows whose products cancel (one or three keys, D =
// 256, scale 1: |S| small next to sum |q k|) break the rule on the LSE in
// 17-29 of 40 seeds (worst 3.7x its tolerance). The scale now waits for the
// exponentials (deferred_score_scale), on every path: the packed products
// (64 query rows) and decode's few-rows products (one query row of 8 heads
// sharing a KV head, 8 sequences).
TEST(LargeScores, SixteenBitProductsAreExactOnEveryPath) {
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    for (DType dtype : {DType::bf16, DType::f16})
      for (int64_t keys : {1, 3})
        for (bool decode : {false, true})
        for (uint64_t seed = 1; seed <= 12; ++seed) {
          Case c;
          c.dtype = dtype;
          c.batch = decode ? 8 : 1;  // 64 query rows either way
          c.heads = decode ? 8 : 1;
          c.kv_heads = 1;
          c.seqlen_q = decode ? 1 : 64;
          c.seqlen_k = keys;
          c.head_dim = 256;
          c.scale = 1.0f;
          c.seed = seed;
          CaseData data(c);
          data.args.isa = isa;
          attention_forward(data.args);
          const Comparison cmp = compare_with_reference(data);
          EXPECT_TRUE(cmp.ok()) << isa_name(isa) << " " << dtype_name(dtype) << (decode ? " decode" : "")
                                << " keys " << keys << " seed " << seed << ": " << cmp.describe();
        }
  }
}

// A scale whose scale * log2(e) overflows fp32 (above ~2.36e38) has the
// documented NaN rows (docs/accuracy.md, known limits), never a silent empty
// row: folded into the exponentials as inf, every negative tile max became
// -inf and the row came out O = 0, LSE = -inf (the answer for a row that sees
// no key) where the float64 reference is finite.
TEST(LargeScores, ScaleBeyondTheFp32RangeNeverEmptiesARow) {
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    for (int64_t rows : {64, 1}) {
      const int64_t d = 16, keys = 8;
      std::vector<float> q(size_t(rows * d), 0.0f), k(size_t(keys * d), 0.0f), v(size_t(keys * d), 0.0f);
      std::vector<float> o(size_t(rows * d), -1.0f), lse(size_t(rows), 7.0f);
      for (int64_t i = 0; i < rows; ++i) q[size_t(i * d)] = 1.0f;
      for (int64_t j = 0; j < keys; ++j) {
        k[size_t(j * d)] = -1.0f - float(j);  // every dot product negative: -1 .. -8
        v[size_t(j * d)] = float(j + 1);
      }
      ForwardArgs a;
      a.shape = {1, 1, 1, rows, keys, d, d};
      a.q = {q.data(), dense_strides(Layout::bhsd, 1, 1, rows, d)};
      a.k = {k.data(), dense_strides(Layout::bhsd, 1, 1, keys, d)};
      a.v = {v.data(), dense_strides(Layout::bhsd, 1, 1, keys, d)};
      a.o = {o.data(), dense_strides(Layout::bhsd, 1, 1, rows, d)};
      a.lse = lse.data();
      a.lse_stride = {rows, rows, 1};
      a.scale = 3e38f;
      a.isa = isa;
      attention_forward(a);
      for (int64_t i = 0; i < rows; ++i) {
        const float got = o[size_t(i * d)];
        // The float64 reference: key 0 alone (O = 1), a finite LSE.
        EXPECT_TRUE(std::isnan(got) || got == 1.0f) << isa_name(isa) << " rows " << rows << " row " << i << ": O " << got;
        EXPECT_NE(lse[size_t(i)], -std::numeric_limits<float>::infinity()) << isa_name(isa) << " rows " << rows;
      }
    }
  }
}

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
