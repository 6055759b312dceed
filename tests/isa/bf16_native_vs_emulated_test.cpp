// Where the CPU has the bf16 product instructions, attention_forward on
// Isa::avx512bf16 and Isa::amx gives the same output and LSE bits as the
// emulated rungs (emulated_bf16_forward.hpp): the emulation is the hardware
// path, not an approximation of it. A handful of shapes: tails in every
// dimension, masks, GQA, few queries against many keys. Decode shapes of at
// most kFewRowsMax stacked rows only with bf16_probabilities on a CPU with
// VBMI, where both few-rows products are few_rows_dot.hpp's vdpbf16ps code on
// both sides; otherwise the emulated Kernels take their few-rows products from
// the AVX2 file compiled natively, the native ones from
// avx512/few_rows_kernels.hpp, whose sums differ in the last bits.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "isa/bf16_native_gate.hpp"
#include "isa/emulated_bf16_forward.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

std::vector<Case> bitwise_cases() {
  std::vector<Case> cases;
  Case c;
  c.dtype = DType::bf16;
  c.seqlen_q = 97, c.seqlen_k = 130, c.head_dim = 80, c.mask = MaskCase::causal;
  cases.push_back(c);
  c.heads = 8, c.kv_heads = 2, c.seqlen_q = 33, c.seqlen_k = 70, c.head_dim = 111, c.mask = MaskCase::additive;
  cases.push_back(c);
  c.heads = 4, c.kv_heads = 4, c.seqlen_q = 17, c.seqlen_k = 1025, c.head_dim = 64, c.mask = MaskCase::window;
  cases.push_back(c);
  c.heads = 8, c.kv_heads = 2, c.seqlen_q = 3, c.seqlen_k = 700, c.head_dim = 128, c.mask = MaskCase::none;
  cases.push_back(c);
  return cases;
}

void check_bitwise(Isa isa) {
  TILEATTN_REQUIRE_NATIVE(isa);
  for (const Case& c : bitwise_cases()) {
    CaseData native(c), emulated(c);
    native.args.isa = isa;
    native.args.threads = emulated.args.threads = 2;
    attention_forward(native.args);
    ASSERT_TRUE(emulated_bf16_forward(emulated.args, isa)) << c.name();
    EXPECT_EQ(native.o16, emulated.o16) << c.name() << ": output bits differ";
    EXPECT_EQ(std::memcmp(native.lse.data(), emulated.lse.data(), native.lse.size() * 4), 0)
        << c.name() << ": LSE bits differ";
  }
}

TEST(Bf16NativeVsEmulated, Avx512Bf16ForwardIsBitwiseEqual) { check_bitwise(Isa::avx512bf16); }

// Decode shapes with bf16_probabilities on avx512bf16 where the CPU has
// VBMI: both few-rows products run on vdpbf16ps (few_rows_dot.hpp, the
// scores and P V with P rounded), the same code natively and on the
// emulation, so the bits agree too; this checks the emulation's word
// interleaves and float permutes against the hardware. Odd key counts, a
// head dim with a masked 32-column group, 1 to 8 stacked rows.
TEST(Bf16NativeVsEmulated, Avx512Bf16DecodeWithBf16ProbabilitiesIsBitwiseEqual) {
  TILEATTN_REQUIRE_NATIVE(Isa::avx512bf16);
  if (!cpu_features().avx512_vbmi) GTEST_SKIP() << "the decode dot products need AVX512-VBMI";
  Case c;
  c.dtype = DType::bf16;
  c.mask = MaskCase::causal;
  for (const auto& [heads, kv_heads, seqlen_q, seqlen_k, head_dim] :
       std::vector<std::array<int64_t, 5>>{{8, 2, 1, 1100, 128}, {6, 2, 2, 99, 59}, {8, 1, 1, 333, 96},
                                           {1, 1, 1, 64, 256}}) {
    c.heads = heads, c.kv_heads = kv_heads, c.seqlen_q = seqlen_q, c.seqlen_k = seqlen_k, c.head_dim = head_dim;
    CaseData native(c), emulated(c);
    native.args.isa = Isa::avx512bf16;
    native.args.bf16_probabilities = emulated.args.bf16_probabilities = true;
    attention_forward(native.args);
    ASSERT_TRUE(emulated_bf16_forward(emulated.args, Isa::avx512bf16)) << c.name();
    EXPECT_EQ(native.o16, emulated.o16) << c.name() << ": output bits differ";
    EXPECT_EQ(std::memcmp(native.lse.data(), emulated.lse.data(), native.lse.size() * 4), 0)
        << c.name() << ": LSE bits differ";
  }
}
TEST(Bf16NativeVsEmulated, AmxForwardIsBitwiseEqual) { check_bitwise(Isa::amx); }

}  // namespace
}  // namespace tileattn::testing
