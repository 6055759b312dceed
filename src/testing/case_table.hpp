// The table of cases shared by the correctness tests and the benchmarks.
#pragma once

#include <vector>

#include "testing/problem_case.hpp"

namespace tileattn::testing {

// Awkward sizes, every mask, GQA ratios, layouts, strides, varlen, dtypes.
std::vector<Case> correctness_cases();

}  // namespace tileattn::testing
