// Inference through C: appending to a caller-owned KV cache (contiguous or
// paged) and attending new queries to it.
#include <cmath>

#include "capi/convert.hpp"
#include "capi/guard.hpp"
#include "tileattn/kv_cache.hpp"

using namespace tileattn;

namespace {

constexpr std::size_t kKvCacheArgsV1Size = TILEATTN_CAPI_SIZE_THROUGH(tileattn_kv_cache_args, reserved1);

// Defaults are those of tileattn::KvCacheArgs.
tileattn_kv_cache_args default_kv_cache_args() {
  const KvCacheArgs defaults;
  tileattn_kv_cache_args args = capi::zeroed_struct<tileattn_kv_cache_args>();
  args.dtype = TILEATTN_F32;
  args.q.stride[3] = args.o.stride[3] = args.k_cache.stride[3] = args.v_cache.stride[3] = 1;
  args.k_new.stride[3] = args.v_new.stride[3] = 1;
  args.lse_stride[2] = 1;
  args.causal = defaults.causal;
  args.window_left = defaults.window_left;
  args.window_right = defaults.window_right;
  args.scale = defaults.scale;
  args.isa = TILEATTN_ISA_AUTO;
  args.kv_quant = TILEATTN_KV_NONE;
  args.k_scale_stride[2] = args.v_scale_stride[2] = 1;
  return args;
}

KvCacheArgs to_kv_cache_args(const tileattn_kv_cache_args* user) {
  tileattn_kv_cache_args c = default_kv_cache_args();
  capi::read_versioned(user, "args", kKvCacheArgsV1Size, c);
  if (c.reserved0 != 0 || c.reserved1 != 0 || c.reserved4 != 0)
    throw Error("args->reserved0, reserved1 and reserved4 must be 0");
  KvCacheArgs a;
  a.batch = c.batch;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.dtype = capi::to_dtype(c.dtype, "dtype");
  a.seqlen_q = c.seqlen_q;
  a.q = capi::to_view(c.q);
  a.o = capi::to_view(c.o);
  a.lse = c.lse;
  a.lse_stride = capi::to_array(c.lse_stride);
  a.k_cache = capi::to_view(c.k_cache);
  a.v_cache = capi::to_view(c.v_cache);
  a.capacity = c.capacity;
  a.cache_seqlens = c.cache_seqlens;
  a.block_table = c.block_table;
  a.block_table_stride = c.block_table_stride;
  a.page_size = c.page_size;
  a.num_pages = c.num_pages;
  a.seqlen_new = c.seqlen_new;
  a.k_new = capi::to_view(c.k_new);
  a.v_new = capi::to_view(c.v_new);
  a.new_counts = c.new_counts;
  a.rotary_cos = c.rotary_cos;
  a.rotary_sin = c.rotary_sin;
  a.rotary_dim = c.rotary_dim;
  a.rotary_positions = c.rotary_positions;
  a.rotary_interleaved = c.rotary_interleaved != 0;
  a.causal = c.causal != 0;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.scale = c.scale;
  a.softcap = c.softcap;
  a.bf16_probabilities = c.bf16_probabilities != 0;
  a.alibi_slopes = c.alibi_slopes;
  a.alibi_batch_stride = c.alibi_batch_stride;
  a.sinks = c.sinks;
  a.cache_batch_idx = c.cache_batch_idx;
  a.cache_batch = c.cache_batch;
  a.cache_leftpad = c.cache_leftpad;
  if (c.reserved3 != 0) throw Error("args->reserved3 must be 0");
  a.rotary_fa2_query_positions = c.rotary_fa2_query_positions != 0;
  a.threads = c.threads;
  a.isa = capi::to_isa(c.isa, "isa");
  if (c.kv_quant < TILEATTN_KV_NONE || c.kv_quant > TILEATTN_KV_FP8_E4M3)
    throw Error("kv_quant: expected TILEATTN_KV_NONE, TILEATTN_KV_INT8 or TILEATTN_KV_FP8_E4M3, got " +
                std::to_string(c.kv_quant));
  a.kv_quant = static_cast<KvQuant>(c.kv_quant);
  a.k_scale = c.k_scale;
  a.v_scale = c.v_scale;
  a.k_scale_stride = capi::to_array(c.k_scale_stride);
  a.v_scale_stride = capi::to_array(c.v_scale_stride);
  a.v_head_dim = c.v_head_dim;
  a.fp32_output = c.fp32_output != 0;
  if (c.reserved5 != 0) throw Error("args->reserved5 must be 0");
  return a;
}

}  // namespace

extern "C" {

tileattn_status(tileattn_kv_cache_args_init)(tileattn_kv_cache_args* args) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(args, sizeof *args, kKvCacheArgsV1Size, default_kv_cache_args(), "args");  // the whole struct
  });
}

tileattn_status tileattn_kv_cache_args_init_sized(tileattn_kv_cache_args* args, size_t struct_size) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(args, struct_size, kKvCacheArgsV1Size, default_kv_cache_args(), "args");
  });
}

tileattn_status tileattn_kv_cache_append(const tileattn_kv_cache_args* args) {
  return capi::guarded(__func__, [&] { kv_cache_append(to_kv_cache_args(args)); });
}

tileattn_status tileattn_attention_with_kvcache(const tileattn_kv_cache_args* args) {
  return capi::guarded(__func__, [&] { attention_with_kvcache(to_kv_cache_args(args)); });
}

}  // extern "C"
