// Combining partial attention results computed over disjoint key sets --
// the building block of split-KV decode, cascade and ring attention.
//
// With (o_a, lse_a) attention over keys A and (o_b, lse_b) over keys B (lse
// in natural log, -inf for "no key"), the attention over A u B is
//   lse = log(exp(lse_a) + exp(lse_b)),
//   o   = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b.
// Merging with an empty side (lse = -inf) returns the other side exactly; a
// NaN lse on either side gives NaN (o and lse), whatever the other side holds.
// An lse of +inf is FlashAttention-2's "no key" (its kernels write it, and so
// do tileattn's FA2 drop-ins): it is read as -inf, as vLLM's merge_attn_states
// reads it.
#pragma once

#include <array>
#include <cstdint>

#include "tileattn/attention.hpp"

namespace tileattn {

struct MergeArgs {
  int64_t batch = 0, heads = 0, rows = 0, head_dim = 0;  // head_dim: O's (V's), 1..512
  DType dtype = DType::f32;  // of o_a, o_b and o_out
  InputView o_a;             // [batch, heads, rows, head_dim]
  const float* lse_a = nullptr;
  std::array<int64_t, 3> lse_a_stride{0, 0, 1};  // [batch, heads, rows]
  InputView o_b;
  const float* lse_b = nullptr;
  std::array<int64_t, 3> lse_b_stride{0, 0, 1};
  // Outputs may be an input itself (in place): o_out the same view as o_a or
  // o_b, lse_out as lse_a or lse_b (same data and strides). Any other overlap
  // with an input is an Error.
  OutputView o_out;
  float* lse_out = nullptr;  // optional
  std::array<int64_t, 3> lse_out_stride{0, 0, 1};
};

// Validates (throws Error naming the argument) and merges.
void merge_states(const MergeArgs& args);

}  // namespace tileattn
