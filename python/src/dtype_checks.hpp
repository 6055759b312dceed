// The dtype rules of the attention arrays (q, k, v, caches, outputs), shared
// by the one-call bindings so that every entry point words them alike.
#pragma once

#include <string>

#include "array_view.hpp"
#include "tileattn/types.hpp"

namespace tileattn::python {

[[noreturn]] inline void fail_value(const std::string& message) { throw nb::value_error(message.c_str()); }
[[noreturn]] inline void fail_type(const std::string& message) { throw nb::type_error(message.c_str()); }

// The kernel dtype of an attention array; TypeError naming `name` when the
// kernels cannot read its dtype.
DType attention_dtype(const char* name, nb::handle obj, const ArrayView& a);

// attention_dtype, and TypeError unless the dtype is q's.
void check_dtype_like_q(const char* name, nb::handle obj, const ArrayView& a, nb::handle q,
                        const ArrayView& qa);

// TypeError unless `obj` (not None) is an array of framework `fw`.
void check_framework(const char* name, nb::handle obj, Framework fw);

// ALiBi slopes (None: off): float32 [heads] or [batch, heads], contiguous
// along heads (Python makes them so). Sets `slopes` and `batch_stride` as
// ForwardArgs takes them; ValueError / TypeError naming alibi_slopes.
inline void read_alibi_slopes(nb::handle obj, Access access, int64_t batch, int64_t heads, const float*& slopes,
                              int64_t& batch_stride) {
  slopes = nullptr;
  batch_stride = 0;
  if (obj.is_none()) return;
  const ArrayView a = read_array("alibi_slopes", obj, access);
  if (a.type != ElementType::f32) fail_type("alibi_slopes: expected float32");
  const bool per_batch = a.rank == 2;
  if (!((a.rank == 1 && a.shape[0] == heads) || (per_batch && a.shape[0] == batch && a.shape[1] == heads)))
    fail_value("alibi_slopes: expected shape [" + std::to_string(heads) + "] or [" + std::to_string(batch) + ", " +
               std::to_string(heads) + "], got " + shape_text(a));
  if (access == Access::metadata) return;
  if (heads > 1 && a.stride[a.rank - 1] != 1) fail_value("alibi_slopes: must be contiguous along heads");
  slopes = static_cast<const float*>(a.data);
  batch_stride = per_batch && batch > 1 ? a.stride[0] : 0;
}

// Attention sinks (None: off): float32 [heads], contiguous (Python makes
// them so). Returns the pointer ForwardArgs::sinks takes (null for None);
// ValueError / TypeError naming sinks. Non-finite values are the library's
// error (it names sinks[h]).
inline const float* read_sinks(nb::handle obj, Access access, int64_t heads) {
  if (obj.is_none()) return nullptr;
  const ArrayView a = read_array("sinks", obj, access);
  if (a.type != ElementType::f32) fail_type("sinks: expected float32");
  if (!(a.rank == 1 && a.shape[0] == heads))
    fail_value("sinks: expected shape [" + std::to_string(heads) + "] (one logit per query head), got " +
               shape_text(a));
  if (access == Access::metadata) return nullptr;
  if (heads > 1 && a.stride[0] != 1) fail_value("sinks: must be contiguous");
  return static_cast<const float*>(a.data);
}

}  // namespace tileattn::python
