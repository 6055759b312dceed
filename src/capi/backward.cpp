// Training through C: tileattn_backward and tileattn_attention_probabilities.
#include "capi/convert.hpp"
#include "capi/guard.hpp"
#include "tileattn/backward.hpp"

using namespace tileattn;

namespace {

constexpr std::size_t kBackwardArgsV1Size = TILEATTN_CAPI_SIZE_THROUGH(tileattn_backward_args, dv);

tileattn_backward_args default_backward_args() {
  tileattn_backward_args args = capi::zeroed_struct<tileattn_backward_args>();
  args.o.stride[3] = args.d_o.stride[3] = 1;
  args.dq.stride[3] = args.dk.stride[3] = args.dv.stride[3] = 1;
  args.lse_stride[2] = 1;
  return args;
}

BackwardArgs to_backward_args(const tileattn_backward_args* user) {
  tileattn_backward_args c = default_backward_args();
  capi::read_versioned(user, "args", kBackwardArgsV1Size, c);
  capi::require(c.forward, "args->forward");
  BackwardArgs b;
  b.forward = capi::to_forward_args(c.forward);
  b.o = capi::to_view(c.o);
  b.d_o = capi::to_view(c.d_o);
  b.lse = c.lse;
  b.lse_stride = capi::to_array(c.lse_stride);
  b.dq = capi::to_view(c.dq);
  b.dk = capi::to_view(c.dk);
  b.dv = capi::to_view(c.dv);
  b.d_sinks = c.d_sinks;
  b.fp32_gradients = c.fp32_gradients != 0;
  if (c.reserved0 != 0) throw Error("args->reserved0 must be 0");
  return b;
}

}  // namespace

extern "C" {

tileattn_status(tileattn_backward_args_init)(tileattn_backward_args* args) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(args, sizeof *args, kBackwardArgsV1Size, default_backward_args(), "args");  // the whole struct
  });
}

tileattn_status tileattn_backward_args_init_sized(tileattn_backward_args* args, size_t struct_size) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(args, struct_size, kBackwardArgsV1Size, default_backward_args(), "args");
  });
}

tileattn_status tileattn_backward(const tileattn_backward_args* args) {
  return capi::guarded(__func__, [&] { attention_backward(to_backward_args(args)); });
}

tileattn_status tileattn_backward_validate(const tileattn_backward_args* args) {
  return capi::guarded(__func__, [&] { validate(to_backward_args(args)); });
}

tileattn_status tileattn_attention_probabilities(const tileattn_forward_args* args, float* probs,
                                                 const int64_t stride[4]) {
  return capi::guarded(__func__, [&] {
    const ForwardArgs forward = capi::to_forward_args(args);
    capi::require(stride, "stride");
    attention_probabilities(forward, probs, {stride[0], stride[1], stride[2], stride[3]});
  });
}

}  // extern "C"
