#include "inference/rope_rotate.hpp"

#include <cstring>

#include "core/half.hpp"

namespace tileattn::detail {

namespace {

double load(const void* base, DType dtype, int64_t index) {
  return double(load_element(base, int(dtype), index));
}

void store(void* base, DType dtype, int64_t index, double value) {
  const float f = float(value);
  if (dtype == DType::f32) static_cast<float*>(base)[index] = f;
  // float64 -> fp32 -> fp16/bf16: in rare near-tie cases two roundings differ
  // from one by a unit in the last place; the result is still within one ulp.
  else if (dtype == DType::f16) static_cast<uint16_t*>(base)[index] = float_to_f16(f);
  else static_cast<uint16_t*>(base)[index] = float_to_bf16(f);
}

}  // namespace

void rotate_row(const void* src, int64_t src_stride, void* dst, int64_t dst_stride,
                int64_t head_dim, DType dtype, const RopeRow& rope) {
  const int64_t half = rope.rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    // The pair (a, b) this table entry rotates.
    const int64_t a = rope.interleaved ? 2 * i : i;
    const int64_t b = rope.interleaved ? 2 * i + 1 : i + half;
    const double x0 = load(src, dtype, a * src_stride), x1 = load(src, dtype, b * src_stride);
    const double c = rope.cos[i], s = rope.sin[i];
    store(dst, dtype, a * dst_stride, x0 * c - x1 * s);
    store(dst, dtype, b * dst_stride, x0 * s + x1 * c);
  }
  const size_t esize = dtype_size(dtype);
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  for (int64_t c = rope.rotary_dim; c < head_dim; ++c)
    std::memcpy(to + c * dst_stride * int64_t(esize), from + c * src_stride * int64_t(esize), esize);
}

void copy_row(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t head_dim,
              DType dtype) {
  const size_t esize = dtype_size(dtype);
  if (src_stride == 1 && dst_stride == 1) {
    std::memcpy(dst, src, size_t(head_dim) * esize);
    return;
  }
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  for (int64_t c = 0; c < head_dim; ++c)
    std::memcpy(to + c * dst_stride * int64_t(esize), from + c * src_stride * int64_t(esize), esize);
}

}  // namespace tileattn::detail
