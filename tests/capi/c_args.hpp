// Test helper: the C API's description of the same problem as a C++
// ForwardArgs, so that one case can run through both APIs.
#pragma once

#include "tileattn/attention.hpp"
#include "tileattn/tileattn.h"

namespace tileattn::capi_testing {

inline tileattn_tensor c_tensor(const InputView& v) {
  return tileattn_tensor{v.data, {v.stride[0], v.stride[1], v.stride[2], v.stride[3]}};
}
inline tileattn_out_tensor c_tensor(const OutputView& v) {
  return tileattn_out_tensor{v.data, {v.stride[0], v.stride[1], v.stride[2], v.stride[3]}};
}

inline tileattn_forward_args to_c_args(const ForwardArgs& a) {
  tileattn_forward_args c;
  tileattn_forward_args_init(&c);
  c.batch = a.shape.batch;
  c.heads = a.shape.heads;
  c.kv_heads = a.shape.kv_heads;
  c.seqlen_q = a.shape.seqlen_q;
  c.seqlen_k = a.shape.seqlen_k;
  c.head_dim = a.shape.head_dim;
  c.v_head_dim = a.shape.v_head_dim;
  c.dtype = int32_t(a.dtype);
  c.q = c_tensor(a.q);
  c.k = c_tensor(a.k);
  c.v = c_tensor(a.v);
  c.o = c_tensor(a.o);
  c.lse = a.lse;
  for (int i = 0; i < 3; ++i) c.lse_stride[i] = a.lse_stride[i];
  c.cu_seqlens_q = a.cu_seqlens_q;
  c.cu_seqlens_k = a.cu_seqlens_k;
  c.causal = a.mask.causal;
  c.mask_kind = int32_t(a.mask.kind);
  c.window_left = a.mask.window_left;
  c.window_right = a.mask.window_right;
  c.mask_data = a.mask.data;
  for (int i = 0; i < 4; ++i) c.mask_stride[i] = a.mask.stride[i];
  c.kv_seqlens = a.kv.seqlens;
  c.block_table = a.kv.block_table;
  c.block_table_stride = a.kv.block_table_stride;
  c.page_size = a.kv.page_size;
  c.num_pages = a.kv.num_pages;
  c.scale = a.scale;
  c.softcap = a.softcap;
  c.bf16_probabilities = a.bf16_probabilities;
  c.fp32_output = a.fp32_output;
  c.alibi_slopes = a.alibi_slopes;
  c.alibi_batch_stride = a.alibi_batch_stride;
  c.sinks = a.sinks;
  c.dropout_p = a.dropout_p;
  c.seed = a.seed;
  c.threads = a.threads;
  c.isa = int32_t(a.isa);
  c.block_q = a.block_q;
  c.block_kv = a.block_kv;
  return c;
}

}  // namespace tileattn::capi_testing
