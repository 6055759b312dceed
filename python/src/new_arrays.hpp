// The outputs of the one-call bindings (forward_arrays, kvcache_arrays): new
// contiguous NumPy arrays or torch tensors, made through the framework's own
// allocator so that the caller gets an ordinary array it owns, or arrays the
// caller gives (`out=`), checked.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "array_view.hpp"
#include "tileattn/types.hpp"

namespace tileattn::python {

// A new contiguous array with the shape and dtype of `like` (read as `view`),
// in its framework.
nb::object new_array_like(nb::handle like, const ArrayView& view);

// A new contiguous array of `view`'s shape and framework with the dtype of
// `like` (O when V's head dim differs from q's).
nb::object new_array_shaped(nb::handle like, const ArrayView& view);

// A new float32 array of `shape` in framework `fw`.
nb::object new_float32(Framework fw, std::initializer_list<int64_t> shape);

// Checks a given output array `obj` named `name`: framework `fw`, writable,
// element type `type` (q's when `q` is given, else float32; with
// `float32_too`, float32 as well: an attention output in fp32 for 16-bit
// inputs, ForwardArgs::fp32_output) and shape `expected` (`rank` sizes).
// Errors name the argument.
ArrayView read_output(const char* name, nb::handle obj, Framework fw, ElementType type, nb::handle q,
                      const int64_t* expected, int rank, bool float32_too = false);

// A library error about a call given `out=` (ValueError), in the Python API's
// words: the library calls the output "o".
[[noreturn]] void fail_for_out(const Error& e);

}  // namespace tileattn::python
