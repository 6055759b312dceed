// Rotary position embedding (RoPE) tables.
//
// A rotary embedding turns pairs of dimensions (x0, x1) of a query or key at
// position p into
//   x0' = x0 * cos(p * f_i) - x1 * sin(p * f_i)
//   x1' = x0 * sin(p * f_i) + x1 * cos(p * f_i),   f_i = theta^(-2i / rotary_dim),
// for pair i in 0 .. rotary_dim/2 - 1; dimensions rotary_dim .. head_dim - 1
// pass through unchanged. Two conventions pick the pairs:
//   NeoX / Llama (rotary_interleaved = false): (x[i], x[i + rotary_dim/2])
//   GPT-J        (rotary_interleaved = true):  (x[2i], x[2i + 1])
// The tables hold cos and sin of p * f_i as fp32, [positions, rotary_dim/2],
// row p for position p -- the layout FlashAttention-2's rotary_cos/rotary_sin use.
#pragma once

#include <cstdint>
#include <vector>

#include "tileattn/types.hpp"

namespace tileattn {

struct RopeTables {
  int64_t positions = 0;   // rows
  int64_t rotary_dim = 0;  // even; each row has rotary_dim / 2 entries
  std::vector<float> cos;  // [positions, rotary_dim / 2]
  std::vector<float> sin;  // [positions, rotary_dim / 2]
};

// Tables for positions 0 .. max_positions - 1. Angles are computed in
// float64 and rounded once to fp32. Throws Error for theta <= 0 (or not
// finite), max_positions < 0, rotary_dim odd or < 2, or tables larger than a
// std::vector can hold.
RopeTables rope_tables(double theta, int64_t max_positions, int64_t rotary_dim);

// Tables whose row r is position positions[r] (any order, repeats allowed,
// each >= 0).
RopeTables rope_tables(double theta, const std::vector<int64_t>& positions, int64_t rotary_dim);

}  // namespace tileattn
