#include "core/uncovered_rows.hpp"

#include <cstring>
#include <limits>

namespace tileattn::detail {

namespace {

// Calls row(h, r) for every head and every row outside cu's sequences.
template <class Row>
void for_uncovered_rows(int64_t heads, const int32_t* cu, int64_t batch, int64_t total_rows, Row&& row) {
  if (!cu) return;
  const int64_t ranges[2][2] = {{0, cu[0]}, {cu[batch], total_rows}};
  for (const auto& range : ranges)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = range[0]; r < range[1]; ++r) row(h, r);
}

}  // namespace

void zero_uncovered_rows(void* data, DType dtype, const std::array<int64_t, 4>& stride, int64_t heads,
                         int64_t dim, const int32_t* cu, int64_t batch, int64_t total_rows) {
  const int64_t esize = int64_t(dtype_size(dtype));  // +0 is all zero bits in fp32, fp16 and bf16
  for_uncovered_rows(heads, cu, batch, total_rows, [&](int64_t h, int64_t r) {
    char* row = static_cast<char*>(data) + (h * stride[1] + r * stride[2]) * esize;
    for (int64_t d = 0; d < dim; ++d) std::memset(row + d * stride[3] * esize, 0, size_t(esize));
  });
}

void fill_uncovered_lse(float* lse, const std::array<int64_t, 3>& stride, int64_t heads, const int32_t* cu,
                        int64_t batch, int64_t total_rows) {
  if (!lse) return;
  for_uncovered_rows(heads, cu, batch, total_rows, [&](int64_t h, int64_t r) {
    lse[h * stride[1] + r * stride[2]] = -std::numeric_limits<float>::infinity();
  });
}

}  // namespace tileattn::detail
