// attention_with_kvcache: validate everything, append, attend, then advance
// cache_seqlens. Attention itself is the forward operator reading K/V from
// the cache through ForwardArgs.kv (pages are gathered by its tile loader).
#include <optional>
#include <vector>

#include "inference/kv_plan.hpp"
#include "inference/rope_rotate.hpp"
#include "tileattn/machine.hpp"

namespace tileattn {

ForwardArgs kvcache_forward_args(const KvCacheArgs& a, const int32_t* seqlens) {
  ForwardArgs f;
  const bool paged = a.block_table != nullptr;
  // Paged caches have no per-sequence row dimension: the pages bound it.
  f.shape = {a.batch, a.heads, a.kv_heads, a.seqlen_q, paged ? 0 : a.capacity, a.head_dim, a.v_head_dim};
  f.dtype = a.dtype;
  f.q = a.q;
  f.k = {a.k_cache.data, a.k_cache.stride};
  f.v = {a.v_cache.data, a.v_cache.stride};
  f.o = a.o;
  f.lse = a.lse;
  f.lse_stride = a.lse_stride;
  f.mask.causal = a.causal;
  f.mask.window_left = a.window_left;
  f.mask.window_right = a.window_right;
  f.kv.seqlens = seqlens;
  f.kv.batch_index = a.cache_batch_idx;
  f.kv.cache_batch = a.cache_batch_idx && a.cache_batch == 0 ? a.batch : a.cache_batch;
  f.kv.row_start = a.cache_leftpad;
  if (paged) {
    f.kv.block_table = a.block_table;
    f.kv.block_table_stride = a.block_table_stride;
    f.kv.page_size = a.page_size;
    f.kv.num_pages = a.num_pages;
  }
  f.scale = a.scale;
  f.softcap = a.softcap;
  f.bf16_probabilities = a.bf16_probabilities;
  f.fp32_output = a.fp32_output;
  f.alibi_slopes = a.alibi_slopes;
  f.alibi_batch_stride = a.alibi_batch_stride;
  f.sinks = a.sinks;
  f.threads = a.threads;
  f.isa = a.isa;
  f.kv.quant = a.kv_quant;
  f.kv.k_scale = a.k_scale;
  f.kv.v_scale = a.v_scale;
  if (a.kv_quant == KvQuant::int8) {
    f.kv.k_scale_stride = a.k_scale_stride;
    f.kv.v_scale_stride = a.v_scale_stride;
  } else if (a.kv_quant == KvQuant::fp8_e4m3) {
    f.kv.k_scale_stride = {0, 1, 0};  // one scale per KV head
    f.kv.v_scale_stride = {0, 1, 0};
  }
  return f;
}

namespace {

// The new queries rotated to their positions, dense [batch, heads, seqlen_q,
// head_dim] in dtype. Decode has batch x heads x (a few) rows, so this copy
// is a few KB against the megabytes of cache each step reads.
class RotatedQueries {
 public:
  RotatedQueries(const KvCacheArgs& a, const std::vector<int32_t>& lengths) {
    const int64_t esize = int64_t(dtype_size(a.dtype));
    const int64_t rows = a.batch * a.heads * a.seqlen_q;
    storage_.resize(size_t((rows * a.head_dim * esize + 3) / 4));
    stride_ = dense_strides(Layout::bhsd, a.batch, a.heads, a.seqlen_q, a.head_dim);
    const int64_t half = a.rotary_dim / 2;
    char* base = reinterpret_cast<char*>(storage_.data());
    const char* q = static_cast<const char*>(a.q.data);
    for (int64_t b = 0; b < a.batch; ++b)
      for (int64_t h = 0; h < a.heads; ++h)
        for (int64_t t = 0; t < a.seqlen_q; ++t) {
          const int64_t position = detail::rotary_query_position(a, a.cache_seqlens[b], lengths[size_t(b)], t);
          const detail::RopeRow rope{a.rotary_cos + position * half, a.rotary_sin + position * half,
                                     a.rotary_dim, a.rotary_interleaved};
          const char* src = q + (b * a.q.stride[0] + h * a.q.stride[1] + t * a.q.stride[2]) * esize;
          char* dst = base + (b * stride_[0] + h * stride_[1] + t * stride_[2]) * esize;
          detail::rotate_row(src, a.q.stride[3], dst, 1, a.head_dim, a.dtype, rope);
        }
  }
  InputView view() const { return {storage_.data(), stride_}; }

 private:
  std::vector<float> storage_;  // float elements keep 2- and 4-byte dtypes aligned
  std::array<int64_t, 4> stride_{};
};

}  // namespace

void attention_with_kvcache(const KvCacheArgs& args) {
  // 1. Every check, nothing written.
  const detail::AppendPlan plan = detail::validate_append(args, /*attends=*/true);
  detail::validate_query_rotary(args, plan.new_lengths);
  // The cache checks first: to the forward the cache is just inputs k and v,
  // and its "o: output overlaps input k" would hide which cache it is.
  detail::validate_apart_from_cache(args, plan);
  ForwardArgs forward = kvcache_forward_args(args, plan.new_lengths.data());
  validate(forward);
  resolve_isa(args.isa);  // an unavailable TILEATTN_ISA throws here, not after the append
  const bool rotary = args.rotary_cos != nullptr;
  const bool has_queries = args.batch > 0 && args.seqlen_q > 0;

  // 2. Writes. The rotated queries are taken before the append so that q may
  // share memory with the new keys (a fused QKV projection buffer).
  std::vector<int32_t> lengths = plan.new_lengths;
  forward.kv.seqlens = lengths.data();
  std::optional<RotatedQueries> queries;
  if (rotary && has_queries) {
    queries.emplace(args, lengths);
    forward.q = queries->view();
  }
  detail::write_append(args, plan);
  attention_forward(forward);
  // A throw above (only allocation failure can, after validation) leaves
  // cache_seqlens unchanged: rows written past them are not part of the cache.
  for (int64_t b = 0; b < args.batch; ++b) args.cache_seqlens[b] = lengths[size_t(b)];
}

}  // namespace tileattn
