// Appending new keys/values into a contiguous or paged cache.
#include "inference/kv_plan.hpp"
#include "inference/rope_rotate.hpp"

namespace tileattn::detail {

namespace {

// Address of row `position` of sequence b, KV head h, in a cache view.
char* cache_row(const KvCacheArgs& a, const OutputView& cache, int64_t b, int64_t h,
                int64_t position) {
  int64_t outer = a.cache_batch_idx ? a.cache_batch_idx[b] : b, row = position;
  if (a.block_table) {
    outer = a.block_table[b * a.block_table_stride + position / a.page_size];
    row = position % a.page_size;
  }
  const int64_t offset = outer * cache.stride[0] + h * cache.stride[1] + row * cache.stride[2];
  return static_cast<char*>(cache.data) + offset * int64_t(dtype_size(a.dtype));
}

const char* new_row(const KvCacheArgs& a, const InputView& view, int64_t b, int64_t h, int64_t t) {
  const int64_t offset = b * view.stride[0] + h * view.stride[1] + t * view.stride[2];
  return static_cast<const char*>(view.data) + offset * int64_t(dtype_size(a.dtype));
}

}  // namespace

void write_append(const KvCacheArgs& a, const AppendPlan& plan) {
  const bool rotary = a.rotary_cos != nullptr;
  const int64_t half = a.rotary_dim / 2;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t first = a.cache_seqlens[b];
    for (int64_t h = 0; h < a.kv_heads; ++h)
      for (int64_t t = 0; t < plan.counts[size_t(b)]; ++t) {
        const int64_t position = first + t;
        char* k_dst = cache_row(a, a.k_cache, b, h, position);
        const char* k_src = new_row(a, a.k_new, b, h, t);
        if (rotary) {
          const RopeRow rope{a.rotary_cos + position * half, a.rotary_sin + position * half,
                             a.rotary_dim, a.rotary_interleaved};
          rotate_row(k_src, a.k_new.stride[3], k_dst, a.k_cache.stride[3], a.head_dim, a.dtype, rope);
        } else {
          copy_row(k_src, a.k_new.stride[3], k_dst, a.k_cache.stride[3], a.head_dim, a.dtype);
        }
        copy_row(new_row(a, a.v_new, b, h, t), a.v_new.stride[3], cache_row(a, a.v_cache, b, h, position),
                 a.v_cache.stride[3], a.head_dim, a.dtype);
      }
  }
}

}  // namespace tileattn::detail

namespace tileattn {

void kv_cache_append(const KvCacheArgs& args) {
  const detail::AppendPlan plan = detail::validate_append(args);
  detail::write_append(args, plan);
  for (int64_t b = 0; b < args.batch; ++b) args.cache_seqlens[b] = plan.new_lengths[size_t(b)];
}

}  // namespace tileattn
