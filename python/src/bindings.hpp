// Pieces of the extension module tileattn._tileattn, one file per operator.
//
// Most bindings take raw data addresses (Python ints) and element strides, not
// array objects: the Python layer (python/tileattn/_arrays.py) reads them
// from NumPy arrays and torch tensors without copying and keeps the objects
// alive for the duration of the call. forward_arrays (flash_attention's path)
// takes the arrays themselves and reads them in C++ (array_view.hpp), which
// is much cheaper per call. Every size, stride and overlap is then
// validated by the C++ library before anything is read or written, so a bad
// address/stride combination is an Error (ValueError), never a crash.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include <nanobind/nanobind.h>

#include "tileattn/attention.hpp"

namespace tileattn::python {

namespace nb = nanobind;

// Addresses cross as Python ints.
using Address = std::uintptr_t;

template <typename T>
inline T* from_address(Address a) {
  return reinterpret_cast<T*>(a);
}

using Stride4 = std::array<int64_t, 4>;

// An Error of the KV-cache calls with the C++ names of the new keys and
// values (k_new, v_new) spelled as Python's attention_with_kvcache names its
// arguments (k, v).
inline Error with_python_kv_names(const Error& e) {
  std::string text = e.what();
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"k_new", "k"}, {"v_new", "v"}})
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  return Error(text);
}
using Stride3 = std::array<int64_t, 3>;

// tileattn.set_bf16_probabilities(): the process-wide value of
// ForwardArgs::bf16_probabilities for every forward call made from Python
// (as torch's backend precision flags: a model's attention calls pass no
// such argument).
inline std::atomic<bool>& bf16_probabilities_setting() {
  static std::atomic<bool> enabled{false};
  return enabled;
}

// The inputs and options of a forward call on raw addresses, as the
// raw-address forward and backward bindings take them (shape [batch, heads,
// kv_heads, seqlen_q, seqlen_k, head_dim]); the dtype and mask codes are
// checked (Error names them). The outputs are left unset.
ForwardArgs forward_inputs(int dtype, const std::array<int64_t, 6>& shape, Address q,
                           const Stride4& q_stride, Address k, const Stride4& k_stride, Address v,
                           const Stride4& v_stride, int mask_kind, Address mask,
                           const Stride4& mask_stride, bool causal, int64_t window_left,
                           int64_t window_right, float scale, float dropout_p, uint64_t seed,
                           int threads);

void bind_forward(nb::module_& m);
void bind_forward_arrays(nb::module_& m);
void bind_merge(nb::module_& m);
void bind_kvcache(nb::module_& m);
void bind_kvcache_arrays(nb::module_& m);
void bind_backward(nb::module_& m);
void bind_buffer(nb::module_& m);
void bind_machine(nb::module_& m);
void bind_threads(nb::module_& m);

}  // namespace tileattn::python
