// Slow, simple implementations to check the fast path against.
//  - reference_forward: float64 arithmetic throughout (the ground truth).
//  - naive_forward: standard attention in the working precision -- inputs in
//    args.dtype, fp32 scores materialized row by row, P normalized, O = P V
//    accumulated in fp32 and rounded to args.dtype. Its error against the
//    float64 reference sets the tolerance (DESIGN.md: at most twice that error
//    plus a tiny floor).
// Both read q/k/v/mask exactly as attention_forward does and ignore args.o.
#pragma once

#include <vector>

#include "tileattn/attention.hpp"

namespace tileattn {

struct ReferenceOutput {
  // O as a dense [q_batches, heads, seqlen_q, value_head_dim] array, where
  // q_batches = batch (1 for a packed variable-length batch). Rows that no
  // sequence covers stay 0.
  std::vector<double> o;
  // [q_batches, heads, seqlen_q]; -inf where no key is visible.
  std::vector<double> lse;
};

ReferenceOutput reference_forward(const ForwardArgs& args);
ReferenceOutput naive_forward(const ForwardArgs& args);

}  // namespace tileattn
