// Training: the backward pass of attention (dQ, dK, dV), recomputing the
// probabilities tile by tile from the log-sum-exp the forward saved (the
// N x N matrix is never stored), and the attention probabilities themselves
// for small shapes and debugging.
//
//   P  = exp(scale * Q K^T + mask - LSE)      (recomputed per tile)
//   Z  = dropout mask: 1 / (1 - p) kept, 0 dropped (same generator as the forward)
//   D  = rowsum(dO o O)
//   dV = (P o Z)^T dO
//   dS = P o (Z o (dO V^T) - D)
//   dQ = scale * dS K,  dK = scale * dS^T Q    (GQA: dK, dV summed over the group)
//   d_sink[h] = -sum_rows exp(sink[h] - LSE) D  (attention sinks: the LSE holds the sink)
//
// Every gradient accumulates in fp32 across tiles and is rounded to the
// output dtype once, at the end. The result is bitwise the same run after run
// and for any number of threads: the work split depends on the shape only.
#pragma once

#include <array>
#include <cstdint>

#include "tileattn/attention.hpp"

namespace tileattn {

struct BackwardArgs {
  // The forward call's arguments: shape, dtype, q, k, v, mask, cu_seqlens,
  // scale, dropout_p and seed (they must be the forward's, so the mask is the
  // same), threads, isa, tile overrides. `forward.o` and `forward.lse` are
  // not used (O and LSE are the inputs below); KV-cache sources (forward.kv)
  // have no backward and are refused. V, O, dO and dV take V's head dim
  // (value_head_dim(forward.shape)), Q, K, dQ and dK head_dim.
  ForwardArgs forward;
  InputView o;    // [batch, heads, seqlen_q, v_head_dim], forward.dtype: the forward's output
  InputView d_o;  // same shape and dtype: gradient of the loss with respect to O
  // The forward's log-sum-exp (fp32, natural log), [batch, heads, seqlen_q].
  const float* lse = nullptr;
  std::array<int64_t, 3> lse_stride{0, 0, 1};
  OutputView dq;  // [batch, heads, seqlen_q, head_dim], gradient_dtype(*this)
  OutputView dk;  // [batch, kv_heads, seqlen_k, head_dim], gradient_dtype(*this)
  OutputView dv;  // [batch, kv_heads, seqlen_k, v_head_dim], gradient_dtype(*this)
  // Optional, with forward.sinks: the gradient of the sinks, fp32 [heads]
  // (dense), overwritten: d_sinks[h] = -sum over the rows of head h (every
  // sequence) of P_sink * D, P_sink = exp(sinks[h] - LSE) the sink's share
  // of the row's softmax. Null: not computed.
  float* d_sinks = nullptr;
  // dQ, dK and dV in fp32 whatever forward.dtype is: the gradients before
  // their rounding to 16 bits, for gradients summed further (accumulation
  // over micro-batches into fp32 gradients, ring attention's blocks) before
  // one rounding. The inputs (q, k, v, o, d_o) keep forward.dtype and its
  // products (bf16 dot products on the amx / avx512bf16 rungs).
  bool fp32_gradients = false;
};

// The dtype of dq, dk and dv: fp32 with fp32_gradients, else forward.dtype.
inline DType gradient_dtype(const BackwardArgs& args) {
  return args.fp32_gradients ? DType::f32 : args.forward.dtype;
}

// Validates `args` (throws Error naming the argument: shapes, strides, null
// pointers, outputs overlapping each other or any input) and writes dQ, dK,
// dV. Nothing is written when validation fails. Isa::reference computes the
// float64 reference gradients (slow, for checking).
void attention_backward(const BackwardArgs& args);

// Only the validation step of attention_backward.
void validate(const BackwardArgs& args);

// The attention probabilities the forward multiplies V with, after dropout:
// probs[b, h, i, j] = exp(scale * q_i . k_j + mask - lse_i) * Z_ij, fp32,
// written at probs + b * stride[0] + h * stride[1] + i * stride[2] + j * stride[3]
// for every sequence b, query head h, query i and key j (varlen: i and j are
// positions inside the sequence, the batch index is the sequence). Entries
// outside the mask are 0; rows that see no key are all 0. For small shapes
// and debugging: refuses (Error) more than kMaxProbabilityElements entries.
// `args` is validated as attention_forward validates it; its O and LSE are
// not written. Each row is computed in float64 and rounded to fp32.
constexpr int64_t kMaxProbabilityElements = int64_t{1} << 28;
void attention_probabilities(const ForwardArgs& args, float* probs,
                             const std::array<int64_t, 4>& stride);

}  // namespace tileattn
