// The naive attention baseline of `tileattn bench`: per (batch, head) the full
// Nq x Nk score matrix S = Q K^T is materialized with OpenBLAS sgemm, masked,
// softmaxed row by row, and O = P V is a second sgemm. fp32, layout bhsd.
#pragma once

#include <cstdint>

#include "cli/band.hpp"
#include "cli/openblas.hpp"

namespace tileattn::cli {

struct BaselineShape {
  int64_t batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim;
};

// q, o: [batch, heads, seqlen_q, head_dim]; k, v: [batch, kv_heads, seqlen_k,
// head_dim], contiguous. The softmax rows are spread over `threads` threads;
// OpenBLAS uses its own (set_num_threads).
void naive_attention(const OpenBlas& blas, const BaselineShape& s, const BandMask& band, float scale,
                     int threads, const float* q, const float* k, const float* v, float* o);

}  // namespace tileattn::cli
