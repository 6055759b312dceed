// Shared validation helpers, used by every public entry (forward, backward,
// KV cache) so that all of them check the same way.
#pragma once

#include <array>
#include <cstdint>

#include "tileattn/attention.hpp"

namespace tileattn::detail {

// A strided view: the bytes [lo, hi) it may touch (addresses; empty for a
// view with a zero-size dimension) and its geometry, for views_overlap.
// view_range throws Error when the extent overflows.
struct ViewSpan {
  static constexpr int kMaxRank = 4;
  int64_t lo = 0, hi = 0;
  bool empty = true;
  int64_t origin = 0;  // the address of the element at index 0
  int64_t element_size = 0;
  int rank = 0;
  int64_t sizes[kMaxRank] = {}, strides[kMaxRank] = {};
};
ViewSpan view_range(const char* name, const void* data, int64_t element_size,
                    const int64_t* sizes, const int64_t* strides, int rank);
// The score modifiers' per-head inputs as views (empty when not given):
// ALiBi slopes [heads] or [batch, heads] (alibi_batch_stride > 0), sinks [heads].
ViewSpan alibi_slopes_view(const ForwardArgs& a);
ViewSpan sinks_view(const ForwardArgs& a);
// The int32 index arrays work items read as they run (their sequence's rows
// and pages), as views (empty when not given): cu_seqlens_q and
// cu_seqlens_k [batch + 1], kv seqlens, batch_index and row_start [batch],
// block_table [batch, block_table_stride]. An output over one of them would
// move later items' rows while they run.
struct NamedView {
  const char* name;
  ViewSpan view;
};
std::array<NamedView, 6> index_array_views(const ForwardArgs& a);
// Whether two views share a byte. Exact when the search over their index
// differences stays within a budget (views of one buffer that interleave,
// such as q, k and v of a fused QKV projection [B, N, 3, H, D] or K and V of
// a fused cache [pages, 2, page, heads, D], share none); past the budget,
// whether their byte ranges overlap.
bool views_overlap(const ViewSpan& a, const ViewSpan& b);
// Whether `dtype` is a type of q, k, v and o (fp32, fp16, bf16), not a
// KV-cache storage type or a value outside the enum.
inline bool is_activation_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
}
// Throws unless distinct indices map to distinct elements (outputs).
void check_injective(const char* name, const int64_t* sizes, const int64_t* strides, int rank);
void validate_cu_seqlens(const char* name, const int32_t* cu, int64_t batch, int64_t total_rows);
// Q/K's head_dim in 1..kMaxHeadDim, V's v_head_dim in 1..kMaxValueHeadDim
// (0: head_dim, which must then fit V's range too); the forward's and the
// KV cache's shared check.
void validate_head_dims(int64_t head_dim, int64_t v_head_dim);

// What the forward's check makes of args.o: the output the call writes
// (distinct indices, distinct elements, no input under it), or an input the
// backward only reads (any strides within bounds, overlaps allowed).
enum class OutputUse { written, read_only };
void validate(const ForwardArgs& args, OutputUse o_use = OutputUse::written);

}  // namespace tileattn::detail
