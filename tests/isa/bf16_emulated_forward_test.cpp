// The forward main loop on the emulated bf16 product rungs
// (emulated_bf16_forward.hpp): every bf16 case of the correctness table, and
// every fp32 case converted to bf16, through Isa::avx512bf16 (vdpbf16ps) and
// Isa::amx (tiles), checked against the float64 reference by the tolerance
// rule: the bf16 rungs checked on CPUs that have neither.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <tuple>
#include <vector>

#include "isa/emulated_bf16_forward.hpp"
#include "testing/case_table.hpp"
#include "testing/problem_case.hpp"

namespace tileattn::testing {
namespace {

std::vector<Case> bf16_cases() {
  std::vector<Case> cases;
  for (Case c : correctness_cases()) {
    if (c.dtype == DType::f16) continue;
    c.dtype = DType::bf16;
    cases.push_back(c);
  }
  return cases;
}

class Bf16EmulatedForward : public ::testing::TestWithParam<std::tuple<Case, Isa>> {};

TEST_P(Bf16EmulatedForward, MatchesFloat64Reference) {
  const auto& [c, isa] = GetParam();
  CaseData data(c);
  data.args.threads = 2;
  if (!emulated_bf16_forward(data.args, isa))
    GTEST_SKIP() << "decode-shaped plan: the few-rows products run natively and need AVX2, FMA and F16C";
  const Comparison cmp = compare_with_reference(data);
  EXPECT_TRUE(cmp.ok()) << c.name() << " on emulated " << (isa == Isa::amx ? "amx" : "avx512bf16") << ": "
                        << cmp.describe();
}

INSTANTIATE_TEST_SUITE_P(Table, Bf16EmulatedForward,
                         ::testing::Combine(::testing::ValuesIn(bf16_cases()),
                                            ::testing::Values(Isa::avx512bf16, Isa::amx)),
                         [](const ::testing::TestParamInfo<std::tuple<Case, Isa>>& info) {
                           std::string name = std::get<0>(info.param).name();
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name + (std::get<1>(info.param) == Isa::amx ? "_amx_" : "_dot_") +
                                  std::to_string(info.index);
                         });

}  // namespace
}  // namespace tileattn::testing
