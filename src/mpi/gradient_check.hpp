// tileattn-ring's gradient check: the project's tolerance rule for gradients
// (testing/tolerance.hpp, the one the GoogleTest suites apply) and the
// conversion of a gathered gradient to double for it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/half.hpp"
#include "testing/tolerance.hpp"

namespace tileattn::mpi::detail {

using testing::check_gradient;
using testing::GradientCheck;

// A dense [batch, heads, rows, head_dim] tensor of `dtype` as double.
inline std::vector<double> as_double(const void* data, DType dtype, int64_t elements) {
  std::vector<double> out(static_cast<size_t>(elements));
  for (int64_t e = 0; e < elements; ++e) out[size_t(e)] = tileattn::detail::load_element(data, int(dtype), e);
  return out;
}

}  // namespace tileattn::mpi::detail
