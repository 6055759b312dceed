// tileattn._tileattn.backward: backward.hpp's attention_backward (dQ, dK, dV)
// on caller-owned memory, with the forward call's options so the mask and the
// dropout pattern are the forward's.
#include <array>
#include <cstdint>

#include <nanobind/stl/array.h>

#include "bindings.hpp"
#include "tileattn/backward.hpp"

namespace tileattn::python {

namespace {

// Shape [batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim].
void backward(int dtype, const std::array<int64_t, 6>& shape, Address q, const Stride4& q_stride,
              Address k, const Stride4& k_stride, Address v, const Stride4& v_stride, Address o,
              const Stride4& o_stride, Address d_o, const Stride4& d_o_stride, Address lse,
              const Stride3& lse_stride, Address dq, const Stride4& dq_stride, Address dk,
              const Stride4& dk_stride, Address dv, const Stride4& dv_stride, int mask_kind,
              Address mask, const Stride4& mask_stride, bool causal, int64_t window_left,
              int64_t window_right, float scale, float dropout_p, uint64_t seed, int threads,
              float softcap, Address alibi_slopes, int64_t alibi_batch_stride, Address sinks,
              Address d_sinks, Address cu_seqlens_q, Address cu_seqlens_k, int64_t v_head_dim) {
  BackwardArgs a;
  a.forward = forward_inputs(dtype, shape, q, q_stride, k, k_stride, v, v_stride, mask_kind, mask,
                             mask_stride, causal, window_left, window_right, scale, dropout_p, seed,
                             threads);
  a.forward.shape.v_head_dim = v_head_dim;  // other than head_dim: NotSupported (backward.hpp)
  a.forward.softcap = softcap;
  a.forward.alibi_slopes = from_address<const float>(alibi_slopes);
  a.forward.alibi_batch_stride = alibi_batch_stride;
  a.forward.sinks = from_address<const float>(sinks);
  a.d_sinks = from_address<float>(d_sinks);
  a.forward.cu_seqlens_q = from_address<const int32_t>(cu_seqlens_q);
  a.forward.cu_seqlens_k = from_address<const int32_t>(cu_seqlens_k);
  a.o = InputView{from_address<const void>(o), o_stride};
  a.d_o = InputView{from_address<const void>(d_o), d_o_stride};
  a.lse = from_address<const float>(lse);
  a.lse_stride = lse_stride;
  a.dq = OutputView{from_address<void>(dq), dq_stride};
  a.dk = OutputView{from_address<void>(dk), dk_stride};
  a.dv = OutputView{from_address<void>(dv), dv_stride};
  nb::gil_scoped_release release;
  attention_backward(a);
}

}  // namespace

void bind_backward(nb::module_& m) {
  m.def("backward", &backward, nb::arg("dtype"), nb::arg("shape"), nb::arg("q"),
        nb::arg("q_stride"), nb::arg("k"), nb::arg("k_stride"), nb::arg("v"), nb::arg("v_stride"),
        nb::arg("o"), nb::arg("o_stride"), nb::arg("d_o"), nb::arg("d_o_stride"), nb::arg("lse"),
        nb::arg("lse_stride"), nb::arg("dq"), nb::arg("dq_stride"), nb::arg("dk"),
        nb::arg("dk_stride"), nb::arg("dv"), nb::arg("dv_stride"), nb::arg("mask_kind"),
        nb::arg("mask"), nb::arg("mask_stride"), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("scale"), nb::arg("dropout_p"), nb::arg("seed"),
        nb::arg("threads"), nb::arg("softcap") = 0.0f, nb::arg("alibi_slopes") = Address(0),
        nb::arg("alibi_batch_stride") = int64_t(0), nb::arg("sinks") = Address(0), nb::arg("d_sinks") = Address(0),
        nb::arg("cu_seqlens_q") = Address(0), nb::arg("cu_seqlens_k") = Address(0),
        nb::arg("v_head_dim") = int64_t(0),
        "attention_backward on raw addresses; element strides in [batch, head, row, dim] order");
}

}  // namespace tileattn::python
