// Where the float64 references read key j's K or V row of a sequence, and the
// scale its elements are multiplied by: contiguous or paged (block table),
// a quantized cache's per-key scale (1 without quantization). One place for
// the forward reference (reference.cpp) and the dropout / backward one
// (training/reference_backward.cpp).
#pragma once

#include <array>
#include <cstdint>

#include "core/problem.hpp"
#include "tileattn/attention.hpp"

namespace tileattn::detail {

struct KvRow {
  int64_t offset = 0;   // element offset of the row's first element
  double scale = 1.0;   // the dequantization scale (exact as a double)
};

inline KvRow kv_row(const ForwardArgs& a, const std::array<int64_t, 4>& stride, const float* scales,
                    const std::array<int64_t, 3>& scale_stride, int64_t b, const Sequence& seq, int64_t kvh,
                    int64_t j) {
  int64_t outer, row;
  if (a.kv.block_table) {
    outer = a.kv.block_table[b * a.kv.block_table_stride + j / a.kv.page_size];
    row = j % a.kv.page_size;
  } else {
    outer = seq.k_batch;
    row = seq.k_row0 + j;
  }
  KvRow r;
  r.offset = outer * stride[0] + kvh * stride[1] + row * stride[2];
  if (a.kv.quant != KvQuant::none)
    r.scale = double(scales[outer * scale_stride[0] + kvh * scale_stride[1] + row * scale_stride[2]]);
  return r;
}

inline KvRow k_row(const ForwardArgs& a, int64_t b, const Sequence& seq, int64_t kvh, int64_t j) {
  return kv_row(a, a.k.stride, a.kv.k_scale, a.kv.k_scale_stride, b, seq, kvh, j);
}
inline KvRow v_row(const ForwardArgs& a, int64_t b, const Sequence& seq, int64_t kvh, int64_t j) {
  return kv_row(a, a.v.stride, a.kv.v_scale, a.kv.v_scale_stride, b, seq, kvh, j);
}

}  // namespace tileattn::detail
