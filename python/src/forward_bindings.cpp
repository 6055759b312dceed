// tileattn._tileattn.forward: one call of attention_forward on caller-owned
// memory. The Python layer (tileattn/_forward.py) builds the arguments.
#include <array>
#include <cstdint>

#include <nanobind/stl/array.h>

#include "bindings.hpp"
#include "kernel_timer.hpp"
#include "tileattn/attention.hpp"

namespace tileattn::python {

ForwardArgs forward_inputs(int dtype, const std::array<int64_t, 6>& shape, Address q,
                           const Stride4& q_stride, Address k, const Stride4& k_stride, Address v,
                           const Stride4& v_stride, int mask_kind, Address mask,
                           const Stride4& mask_stride, bool causal, int64_t window_left,
                           int64_t window_right, float scale, float dropout_p, uint64_t seed,
                           int threads) {
  if (dtype < 0 || dtype > int(DType::bf16)) throw Error("dtype: unknown code");
  if (mask_kind < 0 || mask_kind > int(MaskSpec::Kind::additive)) throw Error("attn_mask: unknown kind");
  ForwardArgs a;
  a.dtype = DType(dtype);
  a.shape = AttentionShape{shape[0], shape[1], shape[2], shape[3], shape[4], shape[5]};
  a.q = InputView{from_address<const void>(q), q_stride};
  a.k = InputView{from_address<const void>(k), k_stride};
  a.v = InputView{from_address<const void>(v), v_stride};
  a.mask.kind = MaskSpec::Kind(mask_kind);
  a.mask.data = from_address<const void>(mask);
  a.mask.stride = mask_stride;
  a.mask.causal = causal;
  a.mask.window_left = window_left;
  a.mask.window_right = window_right;
  a.scale = scale;
  a.dropout_p = dropout_p;
  a.seed = seed;
  a.threads = threads;
  a.bf16_probabilities = bf16_probabilities_setting().load(std::memory_order_relaxed);
  return a;
}

namespace {

// Shape [batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim].
void forward(int dtype, const std::array<int64_t, 6>& shape, Address q, const Stride4& q_stride,
             Address k, const Stride4& k_stride, Address v, const Stride4& v_stride, Address o,
             const Stride4& o_stride, Address lse, const Stride3& lse_stride, int mask_kind,
             Address mask, const Stride4& mask_stride, bool causal, int64_t window_left,
             int64_t window_right, float scale, float dropout_p, uint64_t seed, int threads) {
  ForwardArgs a = forward_inputs(dtype, shape, q, q_stride, k, k_stride, v, v_stride, mask_kind, mask,
                                 mask_stride, causal, window_left, window_right, scale, dropout_p,
                                 seed, threads);
  a.o = OutputView{from_address<void>(o), o_stride};
  a.lse = from_address<float>(lse);
  a.lse_stride = lse_stride;
  nb::gil_scoped_release release;  // the caller's objects stay referenced by its frame
  run_forward(a);
}

}  // namespace

void bind_forward(nb::module_& m) {
  m.def("forward", &forward, nb::arg("dtype"), nb::arg("shape"), nb::arg("q"),
        nb::arg("q_stride"), nb::arg("k"), nb::arg("k_stride"), nb::arg("v"),
        nb::arg("v_stride"), nb::arg("o"), nb::arg("o_stride"), nb::arg("lse"),
        nb::arg("lse_stride"), nb::arg("mask_kind"), nb::arg("mask"), nb::arg("mask_stride"),
        nb::arg("causal"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("scale"),
        nb::arg("dropout_p"), nb::arg("seed"), nb::arg("threads"),
        "attention_forward on raw addresses; element strides in [batch, head, row, dim] order");
  bind_kernel_timer(m);
}

}  // namespace tileattn::python
