// The backward main loop and normalizer pass on the emulated bf16 product
// rungs (emulated_bf16_backward.hpp): bf16 cases through Isa::avx512bf16
// (vdpbf16ps) and Isa::amx (tiles, their configuration, the A operands' 16
// slack rows), checked against the float64 reference by the tolerance rule;
// on a CPU with AVX512-BF16 the emulated avx512bf16 gradients must equal the
// native ones bit for bit.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "isa/emulated_bf16_backward.hpp"
#include "training/backward_support.hpp"

namespace tileattn::testing {
namespace {

std::vector<BackwardCase> emulated_backward_cases() {
  std::vector<BackwardCase> cases;
  auto add = [&](Case c) {
    c.dtype = DType::bf16;
    BackwardCase bc;
    bc.c = c;
    cases.push_back(bc);
  };
  for (int64_t d : {1, 59, 128})
    for (MaskCase m : {MaskCase::none, MaskCase::causal}) {
      Case c;
      c.head_dim = d;
      c.mask = m;
      add(c);
    }
  {
    Case c;  // unequal lengths, rows in tails of 16
    c.seqlen_q = 17;
    c.seqlen_k = 130;
    add(c);
    c.seqlen_q = 130;
    c.seqlen_k = 17;
    add(c);
  }
  {
    Case c;  // large logits: the normalizers recomputed (|LSE| ~ 250)
    c.seqlen_q = c.seqlen_k = 128;
    c.head_dim = 32;
    c.scale = 10.0f;
    add(c);
    c.mask = MaskCase::causal;
    add(c);
  }
  {
    Case c;  // GQA, V's head dim apart from Q/K's
    c.heads = 8;
    c.kv_heads = 2;
    c.seqlen_q = 33;
    c.seqlen_k = 70;
    c.head_dim = 192;
    c.v_head_dim = 128;
    c.mask = MaskCase::causal;
    add(c);
  }
  {
    Case c;  // an additive mask: the scores scaled before it
    c.seqlen_q = 33;
    c.seqlen_k = 70;
    c.head_dim = 40;
    c.mask = MaskCase::additive;
    add(c);
  }
  for (size_t i = 0; i < cases.size(); ++i) cases[i].c.seed = 9000 + i;
  return cases;
}

class Bf16EmulatedBackward : public ::testing::TestWithParam<std::tuple<BackwardCase, Isa>> {};

TEST_P(Bf16EmulatedBackward, MatchesFloat64Reference) {
  const auto& [bc, isa] = GetParam();
  const std::string label = bc.name() + " on emulated " + isa_name(isa);
  BackwardData data(bc, Isa::automatic);  // the forward (O, LSE) natively
  data.args.forward.threads = 2;
  emulated_bf16_backward(data.args, isa);
  expect_gradients_match_reference(data, label);
  if (isa == Isa::avx512bf16 && isa_available(Isa::avx512bf16)) {
    BackwardData native(bc, Isa::automatic);
    native.args.forward.isa = Isa::avx512bf16;
    attention_backward(native.args);
    EXPECT_EQ(data.dq.f16, native.dq.f16) << label << ": dQ differs from the native avx512bf16 one";
    EXPECT_EQ(data.dk.f16, native.dk.f16) << label << ": dK differs from the native avx512bf16 one";
    EXPECT_EQ(data.dv.f16, native.dv.f16) << label << ": dV differs from the native avx512bf16 one";
  }
}

INSTANTIATE_TEST_SUITE_P(Table, Bf16EmulatedBackward,
                         ::testing::Combine(::testing::ValuesIn(emulated_backward_cases()),
                                            ::testing::Values(Isa::avx512bf16, Isa::amx)),
                         [](const ::testing::TestParamInfo<std::tuple<BackwardCase, Isa>>& info) {
                           std::string name = std::get<0>(info.param).name();
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name + (std::get<1>(info.param) == Isa::amx ? "_amx_" : "_dot_") +
                                  std::to_string(info.index);
                         });

// tests/training's BackwardRecomputedNormalizers on the emulated rungs: rows
// that see one key at |LSE| ~ 5e4 pass dO to dV bit for bit only when the
// normalizer pass forms the scores bitwise as the main loop does.
TEST(Bf16EmulatedBackwardNormalizers, OneKeyRowsPassDOThroughToDVExactly) {
  for (Isa isa : {Isa::avx512bf16, Isa::amx}) {
    BackwardData data(one_key_rows_case(DType::bf16), Isa::automatic);
    data.fwd.k16 = data.fwd.q16;  // K = Q: S_ii = scale |q_i|^2 > 0
    attention_forward(data.fwd.args);
    emulated_bf16_backward(data.args, isa);
    EXPECT_EQ(data.dv.f16, data.d_o.f16) << "emulated " << isa_name(isa) << ": dV differs from dO";
  }
}

}  // namespace
}  // namespace tileattn::testing
