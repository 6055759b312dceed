// Shared validation helpers, used by every public entry (forward, backward,
// KV cache) so that all of them check the same way.
#pragma once

#include <cstdint>

#include "tileattn/attention.hpp"

namespace tileattn::detail {

// Bytes [lo, hi) a strided view may touch (addresses); empty for a view with
// a zero-size dimension. Throws Error when the extent overflows.
struct ByteRange {
  int64_t lo = 0, hi = 0;
  bool empty = true;
};
ByteRange view_range(const char* name, const void* data, int64_t element_size,
                     const int64_t* sizes, const int64_t* strides, int rank);
bool ranges_overlap(const ByteRange& a, const ByteRange& b);
// Whether views a and b (their ranges ra, rb from view_range) share a byte.
// Views of one shape and one set of strides are checked exactly (a fused
// cache [pages, 2, page, heads, D] holds K and V interleaved, in overlapping
// byte ranges, without sharing an element); any other pair by its byte
// ranges, which may say "overlap" for views that interleave.
bool views_overlap(const ByteRange& ra, const ByteRange& rb, const void* a, const void* b, int64_t element_size,
                   const int64_t* sizes_a, const int64_t* strides_a, const int64_t* sizes_b,
                   const int64_t* strides_b, int rank);
// Throws unless distinct indices map to distinct elements (outputs).
void check_injective(const char* name, const int64_t* sizes, const int64_t* strides, int rank);
void validate_cu_seqlens(const char* name, const int32_t* cu, int64_t batch, int64_t total_rows);
// Q/K's head_dim in 1..kMaxHeadDim, V's v_head_dim in 1..kMaxValueHeadDim
// (0: head_dim, which must then fit V's range too); the forward's and the
// KV cache's shared check.
void validate_head_dims(int64_t head_dim, int64_t v_head_dim);

void validate(const ForwardArgs& args);

}  // namespace tileattn::detail
