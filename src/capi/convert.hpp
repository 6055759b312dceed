// Conversions from the C API's plain structs and int32 enum values to the
// C++ API's types. Every enum value is checked: C callers can pass anything.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "tileattn/attention.hpp"
#include "tileattn/merge.hpp"
#include "tileattn/tileattn.h"

namespace tileattn::capi {

DType to_dtype(int32_t value, const char* name);
Isa to_isa(int32_t value, const char* name);
int32_t from_isa(Isa isa);

inline InputView to_view(const tileattn_tensor& t) {
  return InputView{t.data, {t.stride[0], t.stride[1], t.stride[2], t.stride[3]}};
}
inline OutputView to_view(const tileattn_out_tensor& t) {
  return OutputView{t.data, {t.stride[0], t.stride[1], t.stride[2], t.stride[3]}};
}
inline std::array<int64_t, 3> to_array(const int64_t (&s)[3]) { return {s[0], s[1], s[2]}; }

// tileattn_forward_args of this library's size with every default (those
// of tileattn::ForwardArgs, so that C and C++ callers who set the same
// fields get the same computation), and the size of its first release.
tileattn_forward_args default_forward_args();
inline constexpr std::size_t kForwardArgsV1Size =
    offsetof(tileattn_forward_args, block_kv) + sizeof(tileattn_forward_args::block_kv);

// Reads the caller's tileattn_forward_args (any version) into ForwardArgs.
ForwardArgs to_forward_args(const tileattn_forward_args* args);

}  // namespace tileattn::capi
