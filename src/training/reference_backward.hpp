// Slow, simple backward implementations to check the fast path against (and,
// with dropout, forward ones: the lead's reference_forward has no dropout).
//  - reference_backward: float64 throughout, from Q, K, V, dO and the mask
//    alone (O, LSE and P recomputed exactly; args.o / args.lse are ignored):
//    the analytic gradient of standard attention, with the same dropout mask
//    as the fast path (the generator in core/dropout.hpp).
//  - reference_backward_from_lse: the same float64 gradients, but with P =
//    exp(score - args.lse) and D = rowsum(dO o args.o) taken from the
//    arguments: the share of these keys when the given LSE and O cover more
//    keys than args holds (a block of ring attention; detail::run_backward
//    with lse_of_these_keys false). Its o and lse are left empty.
//  - naive_backward: the same standard-attention formulas in the working
//    precision: inputs in the dtype, P materialized row by row in fp32, O
//    rounded to the dtype before D = rowsum(dO o O), gradients accumulated in
//    fp32 and rounded to the dtype. Its error against the float64 reference
//    sets the tolerance (2 x naive error + a tiny floor).
#pragma once

#include <vector>

#include "tileattn/backward.hpp"

namespace tileattn::training {

struct BackwardReference {
  std::vector<double> o;    // [q_batches, heads, seqlen_q, v_head_dim] (dropout applied)
  std::vector<double> lse;  // [q_batches, heads, seqlen_q]; -inf where no key is visible
  std::vector<double> delta;  // [q_batches, heads, seqlen_q]: D = rowsum(dO o O)
  std::vector<double> dq;   // [q_batches, heads, seqlen_q, head_dim]
  std::vector<double> dk;   // [k_batches, kv_heads, seqlen_k, head_dim]
  std::vector<double> dv;   // [k_batches, kv_heads, seqlen_k, v_head_dim]
  std::vector<double> d_sinks;  // [heads] with ForwardArgs::sinks, else empty
};

BackwardReference reference_backward(const BackwardArgs& args);
BackwardReference reference_backward_from_lse(const BackwardArgs& args);
BackwardReference naive_backward(const BackwardArgs& args);

// Forward only: O and LSE with dropout, float64; and the same in the working
// precision (naive_backward's forward half), whose error sets the tolerance.
// Both read a quantized or paged KV cache (args.kv) as the forward does:
// each element times its key's scale.
BackwardReference reference_forward_with_dropout(const ForwardArgs& args);
BackwardReference naive_forward_with_dropout(const ForwardArgs& args);

}  // namespace tileattn::training
