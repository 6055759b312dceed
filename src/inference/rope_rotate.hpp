// Rotating one row (a query or key of one head) by a RoPE table row, and
// copying rows between tensors of the same dtype. Used where new tokens
// enter the cache and where decode queries are prepared.
#pragma once

#include <cstdint>

#include "tileattn/types.hpp"

namespace tileattn::detail {

// One row's rotary parameters: the table row of its position.
struct RopeRow {
  const float* cos = nullptr;  // rotary_dim / 2 entries
  const float* sin = nullptr;
  int64_t rotary_dim = 0;
  bool interleaved = false;
};

// dst[c] = rotated src[c] for c < head_dim (strides in elements), computed in
// float64 and rounded once to `dtype`; dimensions >= rotary_dim are copied.
// dst and src must not overlap.
void rotate_row(const void* src, int64_t src_stride, void* dst, int64_t dst_stride,
                int64_t head_dim, DType dtype, const RopeRow& rope);

// dst[c] = src[c] bit for bit, c < head_dim.
void copy_row(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t head_dim,
              DType dtype);

}  // namespace tileattn::detail
