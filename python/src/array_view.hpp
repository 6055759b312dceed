// Reading a NumPy array or a torch tensor as (data, shape, element strides,
// element type) from C++, without copying and without Python-level attribute
// calls on the common path:
//   - NumPy arrays through the buffer protocol;
//   - torch tensors through the DLPack C exchange API (the capsule
//     type(t).__dlpack_c_exchange_api__, torch >= 2.10), which fills a DLTensor
//     in a C call; older torch, tensors the API refuses (meta, fake tensors
//     under tracing) and calls that need no data go through the tensor's
//     attributes (shape, dtype, is_cpu, data_ptr(), stride()).
// Every error names the argument: TypeError for wrong types and dtypes,
// ValueError for wrong ranks, devices and strides.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nanobind/nanobind.h>

namespace tileattn::python {

namespace nb = nanobind;

enum class Framework { numpy, torch };

// What the kernels can read; other_float is a float type they cannot read
// (an additive mask of that type is converted to float32 first); i32 and i64
// are native-endian signed integers (cache lengths, block tables), other_int
// any other integer type.
enum class ElementType { f32, f16, bf16, boolean, i32, i64, other_int, other_float, other };

// What a caller needs of an array: its metadata only (shape, type, device;
// enough to validate a call, works on torch's fake tensors), its data for
// reading, its data for writing (an array the caller gave: a NumPy array must
// be writable, a torch tensor must not be an inference tensor outside
// inference mode, where torch itself refuses in-place updates), or the data of
// an array this package has just allocated (nothing of the caller's to check).
enum class Access { metadata, read, write, allocated };

inline constexpr int kMaxRank = 8;

struct ArrayView {
  Framework framework = Framework::numpy;
  ElementType type = ElementType::other;
  void* data = nullptr;  // first logical element; null with Access::metadata
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};  // in elements; unset with Access::metadata
};

// Whether `obj` is a NumPy array or a torch tensor.
bool is_array(nb::handle obj);

// Framework of `obj`; TypeError naming `name` when it is neither.
Framework framework_of(const char* name, nb::handle obj);
const char* framework_name(Framework f);

// Reads `obj`. Errors: TypeError (not an array), ValueError (rank above
// kMaxRank, a tensor not on the CPU or not strided (sparse), a NumPy byte
// stride that is not a multiple of the element size, a torch tensor with the
// negative bit set (its memory holds the negation of its values; asked only of
// tensors without a unit stride, which every public way to get the bit gives),
// a read-only array or an inference tensor outside inference mode with
// Access::write).
ArrayView read_array(const char* name, nb::handle obj, Access access);

// The shape as Python prints a tuple: "(1, 2, 3)", "(4,)".
std::string shape_text(const ArrayView& a);

// str(obj.dtype), for messages.
std::string dtype_text(nb::handle obj);

// Test hooks. use_dlpack_exchange(false) makes torch tensors go through their
// attributes even where the DLPack C exchange API is available (returns the
// previous setting); dlpack_exchange_available says whether this file can use
// the API of obj's type (a version it knows, with the function it calls).
bool use_dlpack_exchange(bool enabled);
bool dlpack_exchange_available(nb::handle obj);

}  // namespace tileattn::python
