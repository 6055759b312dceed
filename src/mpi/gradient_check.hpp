// The tolerance rule for gradients, as tests/training/backward_support.hpp
// applies it (that header is GoogleTest-bound, so tileattn-ring restates
// it): |got - ref| <= 2 x |naive - ref| + a floor of one unit in the last
// place of the dtype at max(1, max |ref|, max |D|), D = rowsum(dO o O).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/half.hpp"
#include "testing/problem_case.hpp"

namespace tileattn::mpi::detail {

struct GradientCheck {
  double error = 0, naive_error = 0, tolerance = 0;
  bool nan_mismatch = false;
  bool ok() const { return !nan_mismatch && error <= tolerance; }
};

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
  g.tolerance = 2 * g.naive_error + 4 * testing::tolerance_floor(dtype) * scale;
  return g;
}

// A dense [batch, heads, rows, head_dim] tensor of `dtype` as double.
inline std::vector<double> as_double(const void* data, DType dtype, int64_t elements) {
  std::vector<double> out(static_cast<size_t>(elements));
  for (int64_t e = 0; e < elements; ++e) out[size_t(e)] = tileattn::detail::load_element(data, int(dtype), e);
  return out;
}

}  // namespace tileattn::mpi::detail
