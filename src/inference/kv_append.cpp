// Appending new keys/values into a contiguous or paged cache, quantizing
// them on the way into an int8 or fp8 cache.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/half.hpp"
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
  return static_cast<char*>(cache.data) + offset * int64_t(dtype_size(kv_storage_dtype(a.dtype, a.kv_quant)));
}

// The scale slot of row `position` of sequence b, KV head h.
float* scale_slot(const KvCacheArgs& a, float* scales, const std::array<int64_t, 3>& stride, int64_t b,
                  int64_t h, int64_t position) {
  if (a.kv_quant == KvQuant::fp8_e4m3) return scales + h;
  int64_t outer = a.cache_batch_idx ? a.cache_batch_idx[b] : b, row = position;  // as cache_row
  if (a.block_table) {
    outer = a.block_table[b * a.block_table_stride + position / a.page_size];
    row = position % a.page_size;
  }
  return scales + outer * stride[0] + h * stride[1] + row * stride[2];
}

// Quantizes one row (`dtype`, contiguous, d elements) into dst (element
// stride dst_stride) with the rules of KvCacheArgs::kv_quant; int8 writes
// its scale to *scale, fp8 reads it.
void quantize_row(const KvCacheArgs& a, const void* row, int64_t d, char* dst, int64_t dst_stride, float* scale) {
  const int dtype = int(a.dtype);
  if (a.kv_quant == KvQuant::int8) {
    float amax = 0.0f;
    bool finite = true;
    for (int64_t c = 0; c < d; ++c) {
      const float x = load_element(row, dtype, c);
      finite = finite && std::isfinite(x);
      amax = std::fabs(x) > amax ? std::fabs(x) : amax;
    }
    const float s = !finite ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
    for (int64_t c = 0; c < d; ++c) {
      float q = 0.0f;
      if (finite && s > 0.0f) {
        q = std::nearbyint(load_element(row, dtype, c) / s);
        q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
      }
      reinterpret_cast<int8_t*>(dst)[c * dst_stride] = static_cast<int8_t>(q);
    }
    *scale = s;
    return;
  }
  const float s = *scale;
  for (int64_t c = 0; c < d; ++c) {
    float x = load_element(row, dtype, c) / s;
    if (x > 448.0f) x = 448.0f;  // NaN passes both tests and stays NaN
    if (x < -448.0f) x = -448.0f;
    reinterpret_cast<uint8_t*>(dst)[c * dst_stride] = float_to_f8e4m3(x);
  }
}

const char* new_row(const KvCacheArgs& a, const InputView& view, int64_t b, int64_t h, int64_t t) {
  const int64_t offset = b * view.stride[0] + h * view.stride[1] + t * view.stride[2];
  return static_cast<const char*>(view.data) + offset * int64_t(dtype_size(a.dtype));
}

}  // namespace

// Quantized caches: each new row (rotated, rounded to dtype: the row an
// unquantized cache would hold) goes through a dense row buffer into
// quantize_row.
void write_quantized_append(const KvCacheArgs& a, const AppendPlan& plan) {
  const bool rotary = a.rotary_cos != nullptr;
  const int64_t half = a.rotary_dim / 2;
  const int64_t esize = int64_t(dtype_size(a.dtype));
  const int64_t dv = value_head_dim(a);
  std::vector<char> row(size_t(std::max(a.head_dim, dv) * esize));
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t first = a.cache_seqlens[b];
    for (int64_t h = 0; h < a.kv_heads; ++h)
      for (int64_t t = 0; t < plan.counts[size_t(b)]; ++t) {
        const int64_t position = first + t;
        const char* k_src = new_row(a, a.k_new, b, h, t);
        if (rotary) {
          const RopeRow rope{a.rotary_cos + position * half, a.rotary_sin + position * half,
                             a.rotary_dim, a.rotary_interleaved};
          rotate_row(k_src, a.k_new.stride[3], row.data(), 1, a.head_dim, a.dtype, rope);
        } else {
          copy_row(k_src, a.k_new.stride[3], row.data(), 1, a.head_dim, a.dtype);
        }
        quantize_row(a, row.data(), a.head_dim, cache_row(a, a.k_cache, b, h, position), a.k_cache.stride[3],
                     scale_slot(a, a.k_scale, a.k_scale_stride, b, h, position));
        copy_row(new_row(a, a.v_new, b, h, t), a.v_new.stride[3], row.data(), 1, dv, a.dtype);
        quantize_row(a, row.data(), dv, cache_row(a, a.v_cache, b, h, position), a.v_cache.stride[3],
                     scale_slot(a, a.v_scale, a.v_scale_stride, b, h, position));
      }
  }
}

void write_append(const KvCacheArgs& a, const AppendPlan& plan) {
  if (a.kv_quant != KvQuant::none) return write_quantized_append(a, plan);
  const bool rotary = a.rotary_cos != nullptr;
  const int64_t half = a.rotary_dim / 2;
  const int64_t dv = value_head_dim(a);
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
                 a.v_cache.stride[3], dv, a.dtype);
      }
  }
}

}  // namespace tileattn::detail

namespace tileattn {

void kv_cache_append(const KvCacheArgs& args) {
  const detail::AppendPlan plan = detail::validate_append(args, /*attends=*/false);
  detail::write_append(args, plan);
  for (int64_t b = 0; b < args.batch; ++b) args.cache_seqlens[b] = plan.new_lengths[size_t(b)];
}

}  // namespace tileattn
