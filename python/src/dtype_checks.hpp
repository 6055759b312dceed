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

}  // namespace tileattn::python
