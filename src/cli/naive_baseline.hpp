// The naive attention baseline of `tileattn bench`: per (batch, head) the full
// Nq x Nk score matrix S = Q K^T is materialized with OpenBLAS sgemm, masked,
// softmaxed row by row, and O = P V is a second sgemm. fp32, layout bhsd.
#pragma once

#include <cstdint>

#include "cli/openblas.hpp"
#include "core/band.hpp"

namespace tileattn::cli {

struct BaselineShape {
  int64_t batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim;
  int64_t v_head_dim = 0;  // V, O, dO and dV; 0: head_dim
};

// q: [batch, heads, seqlen_q, head_dim]; k: [batch, kv_heads, seqlen_k,
// head_dim]; v: [batch, kv_heads, seqlen_k, Dv]; o: [batch, heads, seqlen_q,
// Dv] (Dv: v_head_dim, or head_dim), contiguous. The softmax rows are spread over `threads` threads;
// OpenBLAS uses its own (set_num_threads).
void naive_attention(const OpenBlas& blas, const BaselineShape& s, const detail::Band& band, float scale,
                     int threads, const float* q, const float* k, const float* v, float* o);

}  // namespace tileattn::cli

namespace tileattn::cli {

// The naive backward: per (batch, head) P is recomputed as above, then
// dV += P^T dO, dP = dO V^T, dS = P o (dP - rowsum(dO o O)), dQ = scale dS K and
// dK += scale dS^T Q, all with sgemm and two Nq x Nk matrices in memory.
// dk and dv accumulate over the query heads of a KV group: zero them first.
void naive_attention_backward(const OpenBlas& blas, const BaselineShape& s, const detail::Band& band,
                              float scale, int threads, const float* q, const float* k, const float* v,
                              const float* o, const float* d_o, float* dq, float* dk, float* dv);

}  // namespace tileattn::cli
