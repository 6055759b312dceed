// The backward operator against the float64 reference on every ISA path this
// CPU can run (forced), over awkward shapes, every mask, GQA/MQA, layouts,
// strides, varlen, 16-bit inputs and dropout; 1 and 2 threads agree bit for bit.
#include <set>
#include <string>
#include <tuple>

#include "support/thread_census.hpp"
#include "backward_support.hpp"
#include "testing/case_table.hpp"

namespace tileattn::testing {
namespace {

std::vector<BackwardCase> backward_cases() {
  std::vector<BackwardCase> cases;
  auto add = [&](Case c, float dropout = 0.0f) {
    BackwardCase bc;
    bc.c = c;
    bc.dropout_p = dropout;
    cases.push_back(bc);
  };
  const auto add_case = [&](Case c) { add(c); };  // the shared groups (testing/case_table.hpp)
  // Head dims with partial SIMD vectors and panels.
  for (int64_t d : {1, 59, 64, 111, 128})
    for (MaskCase m : {MaskCase::none, MaskCase::causal}) add(head_dim_case(d, m));
  // Lengths equal and unequal both ways, single rows.
  for (auto [nq, nk] : {std::pair<int64_t, int64_t>{1, 1}, {1, 70}, {70, 1}, {17, 130}, {130, 17}, {200, 257}})
    add(length_case(nq, nk));
  add_mask_cases(add_case);
  {
    Case c;  // rows that see no key (LSE -inf): zero gradients, never NaN
    c.seqlen_q = 40;
    c.seqlen_k = 8;
    c.mask = MaskCase::window;
    c.window_left = c.window_right = 0;
    add(c);
  }
  {
    // Large logits (scale 10: |LSE| ~ 250): the fp32 LSE's rounding alone put
    // dV at 3.6x the naive error; these rows get their max and sum recomputed.
    Case c;
    c.seqlen_q = c.seqlen_k = 128;
    c.head_dim = 32;
    c.scale = 10.0f;
    add(c);
    c.mask = MaskCase::causal;
    add(c);
  }
  // GQA and MQA: dK, dV summed over the group.
  for (auto [h, kvh] : {std::pair<int64_t, int64_t>{8, 2}, {8, 1}, {12, 3}}) add(gqa_case(h, kvh));
  // Long keys with few (sequence, KV head) pairs: keys cut into chunks whose
  // dQ partial sums are added afterwards.
  for (MaskCase m : {MaskCase::none, MaskCase::causal, MaskCase::window}) {
    Case c;
    c.heads = 2;
    c.kv_heads = 1;
    c.seqlen_q = 100;
    c.seqlen_k = 1100;
    c.head_dim = 16;
    c.mask = m;
    c.window_left = 300;
    add(c);
  }
  add_layout_cases(add_case);
  add_varlen_cases(add_case);
  add_half_precision_cases(add_case);  // fp32 accumulation, rounded once
  // Dropout: the reference applies the very same mask.
  {
    Case c;
    c.seqlen_q = 97;
    c.seqlen_k = 130;
    c.mask = MaskCase::causal;
    add(c, 0.1f);
    add(c, 0.5f);
    c.heads = 8;
    c.kv_heads = 2;
    c.mask = MaskCase::boolean;
    add(c, 0.3f);
    c.dtype = DType::bf16;
    c.mask = MaskCase::none;
    add(c, 0.2f);
  }
  {
    Case c;
    c.varlen = true;
    c.heads = 4;
    c.kv_heads = 1;
    c.varlen_q_lengths = {5, 0, 64, 100};
    c.varlen_k_lengths = {7, 3, 64, 130};
    c.mask = MaskCase::causal;
    add(c, 0.25f);
    Case d;
    d.heads = 2;
    d.kv_heads = 1;
    d.seqlen_q = 60;
    d.seqlen_k = 1100;
    d.head_dim = 16;
    d.dtype = DType::f16;
    add(d, 0.4f);
  }
  // Soft cap: dS through 1 - tanh^2 (last: the cases above keep their seeds).
  add_softcap_cases(add_case);
  {
    Case c;
    c.seqlen_q = 97;
    c.seqlen_k = 130;
    c.mask = MaskCase::causal;
    c.softcap = 5.0f;
    c.input_scale = 4.0f;
    add(c, 0.2f);
  }
  add_alibi_cases(add_case);  // the bias has no gradient: the mask step's scores only
  add_sink_cases(add_case);  // d_sinks too (backward_support.hpp)
  {
    // Sinks on rows whose |LSE| reaches the recomputed normalizers (scale 8:
    // |LSE| > 32), where the recomputed max and sum must hold the sink too;
    // sinks 38..48 against row maxima of some 20..60.
    Case c;
    c.seqlen_q = 64;
    c.seqlen_k = 90;
    c.mask = MaskCase::causal;
    c.scale = 8.0f;
    c.sinks = true;
    c.sink_shift = 40.0f;
    add(c, 0.0f);
  }
  // V's head dim apart from Q/K's (MLA 192/128, 576/512; dV Dv wide, dQ/dK D wide).
  add_head_dim_pair_cases(add_case);
  {
    Case c;  // with dropout
    c.head_dim = 192;
    c.v_head_dim = 128;
    c.heads = 4;
    c.kv_heads = 2;
    c.seqlen_q = 33;
    c.seqlen_k = 70;
    c.mask = MaskCase::causal;
    add(c, 0.2f);
  }
  // 16-bit dropout at p = 0.6 on rows that each see one key: exact dQ = dK =
  // 0, and D = rowsum(dO o O) carries the 16-bit rounding of O = Z V (Z =
  // 1 / (1 - p) = 2.5000002 in fp32, its products a hair above 16-bit
  // midpoints), so dS = P (Z dP - D) is that rounding alone. The naive rounds
  // the same fp32 products as the kernel, so its error is the kernel's row for
  // row (docs/accuracy.md, "16-bit dropout").
  for (DType dt : {DType::f16, DType::bf16}) {
    Case c;
    c.seqlen_q = c.seqlen_k = 97;
    c.head_dim = 64;
    c.mask = MaskCase::window;
    c.window_left = c.window_right = 0;
    c.dtype = dt;
    add(c, 0.6f);
  }
  for (size_t i = 0; i < cases.size(); ++i) cases[i].c.seed = 5000 + i;
  return cases;
}

class BackwardCases : public ::testing::TestWithParam<std::tuple<BackwardCase, Isa>> {};

TEST_P(BackwardCases, MatchesFloat64ReferenceAndIsThreadCountIndependent) {
  const BackwardCase& bc = std::get<0>(GetParam());
  const Isa isa = std::get<1>(GetParam());
  if (!isa_available(isa)) GTEST_SKIP() << isa_name(isa) << " not available on this CPU";
  BackwardData one(bc, isa), two(bc, isa);
  one.args.forward.threads = 1;
  two.args.forward.threads = 2;
  attention_backward(one.args);
  // Both threads run work items (the thread pool's test hook): without it a
  // helper that wakes late may find every item taken.
  const detail::ThreadCensus census = run_on_every_thread([&] { attention_backward(two.args); });
  expect_threads_took_part(census, 2, bc.name());
  expect_gradients_match_reference(one, bc.name() + " on " + isa_name(isa));
  const DType dt = bc.c.dtype;
  EXPECT_EQ(std::memcmp(one.dq.data(dt), two.dq.data(dt), one.dq.bytes(dt)), 0) << "dQ: 1 vs 2 threads";
  EXPECT_EQ(std::memcmp(one.dk.data(dt), two.dk.data(dt), one.dk.bytes(dt)), 0) << "dK: 1 vs 2 threads";
  EXPECT_EQ(std::memcmp(one.dv.data(dt), two.dv.data(dt), one.dv.bytes(dt)), 0) << "dV: 1 vs 2 threads";
}

std::string case_test_name(const ::testing::TestParamInfo<std::tuple<BackwardCase, Isa>>& info) {
  std::string name = std::get<0>(info.param).name() + "_" + isa_name(std::get<1>(info.param));
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Table, BackwardCases,
                         ::testing::Combine(::testing::ValuesIn(backward_cases()),
                                            ::testing::Values(Isa::generic, Isa::avx2, Isa::avx512)),
                         case_test_name);

// The bf16 rungs' own code runs for bf16 inputs only: the table in bf16.
// Each name computed once (comparing every pair's names took much of this
// executable's start-up, which every CTest process pays).
std::vector<BackwardCase> bf16_backward_cases() {
  std::vector<BackwardCase> cases;
  std::set<std::string> names;
  for (BackwardCase bc : backward_cases()) {
    bc.c.dtype = DType::bf16;
    if (names.insert(bc.name()).second) cases.push_back(bc);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Bf16Rungs, BackwardCases,
                         ::testing::Combine(::testing::ValuesIn(bf16_backward_cases()),
                                            ::testing::Values(Isa::avx512bf16, Isa::amx)),
                         case_test_name);

// ForwardArgs::bf16_probabilities in forward and backward (P rounded to bf16
// for the forward's P V, P and dS for the backward's products), the backward
// getting the rounded forward's O as autograd hands it over: the rule plus
// the rounding bound of bf16_rounding_allowances (d_sinks too), over the bf16
// table without packed sequences or dropout; and the rounding shows (some
// gradient differs from the default's).
std::vector<BackwardCase> bf16_probability_cases() {
  std::vector<BackwardCase> cases;
  for (const BackwardCase& bc : bf16_backward_cases())
    if (!bc.c.varlen && bc.dropout_p == 0.0f) cases.push_back(bc);
  return cases;
}

class BackwardBf16Probabilities : public ::testing::TestWithParam<std::tuple<BackwardCase, Isa>> {};

TEST_P(BackwardBf16Probabilities, WithinTheRuleAndTheRoundingBound) {
  const BackwardCase& bc = std::get<0>(GetParam());
  const Isa isa = std::get<1>(GetParam());
  if (!isa_available(isa)) GTEST_SKIP() << isa_name(isa) << " not available on this CPU";
  BackwardData rounded(bc, isa, true);
  attention_backward(rounded.args);
  const GradientAllowances allowances = bf16_rounding_allowances(rounded);
  expect_gradients_match_reference(rounded, bc.name() + " on " + isa_name(isa) + " with bf16_probabilities",
                                   &allowances);
}

INSTANTIATE_TEST_SUITE_P(Bf16Rungs, BackwardBf16Probabilities,
                         ::testing::Combine(::testing::ValuesIn(bf16_probability_cases()),
                                            ::testing::Values(Isa::avx512bf16, Isa::amx)),
                         case_test_name);

TEST(BackwardBf16ProbabilitiesShow, RoundingChangesGradients) {
  for (Isa isa : {Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    int differ = 0, cases = 0;
    for (const BackwardCase& bc : bf16_probability_cases()) {
      BackwardData rounded(bc, isa, true), exact(bc, isa);
      attention_backward(rounded.args);
      attention_backward(exact.args);
      ++cases;
      differ += rounded.dq.f16 != exact.dq.f16 || rounded.dk.f16 != exact.dk.f16 || rounded.dv.f16 != exact.dv.f16;
    }
    EXPECT_GT(differ, cases / 2) << isa_name(isa) << ": P and dS rounded to bf16 changed " << differ << " of " << cases;
  }
}

// The normalizer pass forms each recomputed row's max from scores formed
// bitwise as the main loop forms them (BackwardMainloop::scores), so a row
// whose single visible key carries its whole mass gets P = exp2(S - max) = 1
// exactly. With K = Q, window (0, 0) and a huge scale every row sees only its
// own key, at |LSE| ~ 5e4 (recomputed normalizers, and one fp32 unit of S
// there is 2^-7 in log2 units, which moves P by 0.5%, more than bf16's
// half unit): dV = P dO must then be dO bit for bit, on every path and
// dtype, the bf16 rungs' dot-product scores included.
TEST(BackwardRecomputedNormalizers, OneKeyRowsPassDOThroughToDVExactly) {
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    for (DType dtype : {DType::f32, DType::bf16}) {
      if (!isa_available(isa)) continue;
      BackwardData data(one_key_rows_case(dtype), isa);
      data.fwd.k32 = data.fwd.q32;  // K = Q: S_ii = scale |q_i|^2 > 0 (same shape and layout)
      data.fwd.k16 = data.fwd.q16;
      attention_forward(data.fwd.args);  // O and the LSE of these inputs
      attention_backward(data.args);
      const std::string label = std::string(isa_name(isa)) + (dtype == DType::f32 ? " f32" : " bf16");
      ASSERT_EQ(data.dv.bytes(dtype), data.d_o.bytes(dtype)) << label;
      EXPECT_EQ(std::memcmp(data.dv.data(dtype), data.d_o.data(dtype), data.dv.bytes(dtype)), 0)
          << label << ": dV differs from dO";
    }
}

// backward_tiles reports what the backward runs with: the call's block_q /
// block_kv where set, else the cache model's first fit (64 x 128 where L2
// has 2 MiB or more, else 64 x 64, for D = 64).
TEST(BackwardTiles, CallOverridesOrTheCacheModel) {
  BackwardCase bc;
  bc.c.head_dim = 64;
  BackwardData data(bc, Isa::automatic);
  const TileShape model = backward_tiles(data.args);
  const bool wide = cache_sizes().l2 >= (int64_t{1} << 20);
  EXPECT_EQ(model.block_q, 64);
  EXPECT_EQ(model.block_kv, wide ? 128 : 64) << "L2 " << cache_sizes().l2;
  EXPECT_EQ(model.reason.rfind("backward cache model", 0), 0u) << model.reason;
  data.args.forward.block_q = 32;
  data.args.forward.block_kv = 48;
  const TileShape given = backward_tiles(data.args);
  EXPECT_EQ(given.block_q, 32);
  EXPECT_EQ(given.block_kv, 48);
  EXPECT_EQ(given.reason.rfind("backward: the call's", 0), 0u) << given.reason;
}

}  // namespace
}  // namespace tileattn::testing
