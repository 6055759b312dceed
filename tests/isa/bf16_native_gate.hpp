// When a test may run the bf16 product instructions natively: where the CPU
// (and OS) has them. Where it has them but the build lacks the path
// (isa_available false, or the tests' native kernels compiled without the
// flags), the test fails: that is a build that silently lost a rung.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "isa/bf16_kernel_sets.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {

struct NativeGate {
  bool run = false;
  bool fail = false;
  std::string why;
};

// isa: Isa::avx512bf16 or Isa::amx.
inline NativeGate native_gate(Isa isa) {
  const bool amx = isa == Isa::amx;
  const bool cpu = amx ? amx_bf16_usable() : cpu_features().avx512_bf16;
  const char* what = amx ? "AMX-BF16 (with the OS's tile permission)" : "AVX512-BF16";
  if (!cpu) return {false, false, std::string("this CPU lacks ") + what};
  if (!isa_available(isa))
    return {false, true, std::string("the CPU has ") + what + " but isa_available(" +
                             (amx ? "Isa::amx" : "Isa::avx512bf16") + ") is false: the build lacks the path"};
  if (!native_bf16_compiled())
    return {false, true, std::string("the CPU has ") + what +
                             " but native_bf16_kernels.cpp was compiled without the instructions"};
  return {true, false, ""};
}

}  // namespace tileattn::testing

// In a test body: run on, skip with the reason, or fail (see above).
#define TILEATTN_REQUIRE_NATIVE(isa)                                     \
  do {                                                                   \
    const ::tileattn::testing::NativeGate gate_ = ::tileattn::testing::native_gate(isa); \
    if (gate_.fail) {                                                    \
      FAIL() << gate_.why;                                               \
    }                                                                    \
    if (!gate_.run) {                                                    \
      GTEST_SKIP() << gate_.why;                                         \
    }                                                                    \
  } while (0)
