// Rows of a packed (varlen) tensor that no sequence covers: cu_seqlens
// gives sequence b the rows cu[b] .. cu[b + 1] - 1, so rows 0 .. cu[0] - 1
// and cu[batch] .. total_rows - 1 belong to none. No attention reads them;
// the outputs' such rows are written as a row that attends to no key: O,
// dQ, dK and dV zeros, LSE -inf (rather than left as they were, which hands
// a caller's uninitialized memory back as results and, through autograd,
// into accumulated gradients).
#pragma once

#include <array>
#include <cstdint>

#include "tileattn/types.hpp"

namespace tileattn::detail {

// Zeros rows outside cu's sequences of `data`, a [heads, total_rows, dim]
// view (element strides {unused batch, head, row, dim}) of `dtype`; nothing
// without cu.
void zero_uncovered_rows(void* data, DType dtype, const std::array<int64_t, 4>& stride, int64_t heads,
                         int64_t dim, const int32_t* cu, int64_t batch, int64_t total_rows);

// The same for an fp32 [heads, total_rows] LSE (strides {unused, head, row}): -inf.
void fill_uncovered_lse(float* lse, const std::array<int64_t, 3>& stride, int64_t heads, const int32_t* cu,
                        int64_t batch, int64_t total_rows);

}  // namespace tileattn::detail
