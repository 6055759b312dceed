// The tolerance rule for gradients, in one place for every checker of them:
// the GoogleTest suites (tests/training/backward_support.hpp) and
// tileattn-ring --check --backward (src/mpi/gradient_check.hpp). Kept free
// of GoogleTest so that a plain program can include it.
//
// |got - ref| <= 2 x |naive - ref| + a floor of one unit in the last place of
// the dtype (4 x tolerance_floor) at max(1, max |ref|, max |D|).
// D = rowsum(dO o O) enters the floor because dS = P o (dP - D) cancels it:
// when a row sees a single key, P = 1 and dP = D, the naive implementation
// cancels exactly (error 0) while a tiled one keeps the rounding of dP and D,
// about an ulp of |D| (a dot product of head_dim terms rounded two ways).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "testing/problem_case.hpp"

namespace tileattn::testing {

struct GradientCheck {
  double error = 0, naive_error = 0, tolerance = 0;
  double magnitude = 0;  // the floor's scale: max(1, max |ref|, max |D|)
  bool nan_mismatch = false;
  bool ok() const { return !nan_mismatch && error <= tolerance; }
};

// got, ref and naive: the same gradient, element for element (ref in
// float64, naive in the dtype); max_delta: max |D| over the rows.
inline GradientCheck check_gradient(const std::vector<double>& got, const std::vector<double>& ref,
                                    const std::vector<double>& naive, DType dtype, double max_delta) {
  GradientCheck g;
  double scale = std::max(1.0, max_delta);
  for (size_t e = 0; e < ref.size(); ++e) {
    if (std::isnan(ref[e]) != std::isnan(got[e])) g.nan_mismatch = true;
    if (std::isnan(ref[e])) continue;
    scale = std::max(scale, std::abs(ref[e]));
    g.error = std::max(g.error, std::abs(got[e] - ref[e]));
    if (!std::isnan(naive[e])) g.naive_error = std::max(g.naive_error, std::abs(naive[e] - ref[e]));
  }
  g.magnitude = scale;
  g.tolerance = 2 * g.naive_error + 4 * tolerance_floor(dtype) * scale;
  return g;
}

}  // namespace tileattn::testing
