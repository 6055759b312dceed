// Small deterministic inputs shared by tests that build problems by hand:
// values in [-1, 1] in steps of 1/1000 from a linear congruential sequence,
// and the kernel paths this CPU runs.
#pragma once

#include <cstdint>
#include <vector>

#include "tileattn/machine.hpp"

namespace tileattn::testing_support {

inline std::vector<float> small_values(int64_t n, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& e : x) {
    seed = seed * 1664525u + 1013904223u;
    e = float(int32_t(seed >> 8) % 2001 - 1000) / 1000.0f;
  }
  return x;
}

// Every kernel path (not the float64 reference) this build and CPU run.
inline std::vector<Isa> kernel_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    if (isa_available(isa)) out.push_back(isa);
  return out;
}

}  // namespace tileattn::testing_support
