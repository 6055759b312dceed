// tileattn_forward and tileattn_merge_states: thin wrappers over the C++ API.
#include <cmath>
#include <limits>

#include "capi/convert.hpp"
#include "capi/guard.hpp"

using namespace tileattn;

namespace {

constexpr std::size_t kMergeArgsV1Size = TILEATTN_CAPI_SIZE_THROUGH(tileattn_merge_args, lse_out_stride);

tileattn_merge_args default_merge_args() {
  tileattn_merge_args args = capi::zeroed_struct<tileattn_merge_args>();
  args.dtype = TILEATTN_F32;
  args.o_a.stride[3] = args.o_b.stride[3] = args.o_out.stride[3] = 1;
  args.lse_a_stride[2] = args.lse_b_stride[2] = args.lse_out_stride[2] = 1;
  return args;
}

}  // namespace

extern "C" {

tileattn_status(tileattn_forward_args_init)(tileattn_forward_args* args) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(args, sizeof *args, capi::kForwardArgsV1Size, capi::default_forward_args(), "args");  // the whole struct
  });
}

tileattn_status tileattn_forward_args_init_sized(tileattn_forward_args* args, size_t struct_size) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(args, struct_size, capi::kForwardArgsV1Size, capi::default_forward_args(), "args");
  });
}

tileattn_status tileattn_forward(const tileattn_forward_args* args) {
  return capi::guarded(__func__, [&] { attention_forward(capi::to_forward_args(args)); });
}

tileattn_status tileattn_forward_validate(const tileattn_forward_args* args) {
  return capi::guarded(__func__, [&] { validate(capi::to_forward_args(args)); });
}

tileattn_status(tileattn_merge_args_init)(tileattn_merge_args* args) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(args, sizeof *args, kMergeArgsV1Size, default_merge_args(), "args");  // the whole struct
  });
}

tileattn_status tileattn_merge_args_init_sized(tileattn_merge_args* args, size_t struct_size) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(args, struct_size, kMergeArgsV1Size, default_merge_args(), "args");
  });
}

tileattn_status tileattn_merge_states(const tileattn_merge_args* user) {
  return capi::guarded(__func__, [&] {
    tileattn_merge_args c = default_merge_args();
    capi::read_versioned(user, "args", kMergeArgsV1Size, c);
    if (c.reserved0 != 0) throw Error("args->reserved0 must be 0");
    MergeArgs m;
    m.batch = c.batch;
    m.heads = c.heads;
    m.rows = c.rows;
    m.head_dim = c.head_dim;
    m.dtype = capi::to_dtype(c.dtype, "dtype");
    m.o_a = capi::to_view(c.o_a);
    m.lse_a = c.lse_a;
    m.lse_a_stride = capi::to_array(c.lse_a_stride);
    m.o_b = capi::to_view(c.o_b);
    m.lse_b = c.lse_b;
    m.lse_b_stride = capi::to_array(c.lse_b_stride);
    m.o_out = capi::to_view(c.o_out);
    m.lse_out = c.lse_out;
    m.lse_out_stride = capi::to_array(c.lse_out_stride);
    merge_states(m);
  });
}

}  // extern "C"
