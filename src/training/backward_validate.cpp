// Validation of a backward call, with the forward's helpers: the shared
// inputs are checked exactly as the forward checks them, then O, dO, LSE and
// the three gradients; outputs may not overlap each other or any input.
#include <algorithm>
#include <string>

#include "core/validate.hpp"
#include "training/backward_problem.hpp"

namespace tileattn::detail {

namespace {

[[noreturn]] void fail(const std::string& message) { throw Error(message); }

}  // namespace

void validate(const BackwardArgs& b) {
  const ForwardArgs& a = b.forward;
  if (a.kv.quant != KvQuant::none)
    throw NotSupported("backward: quantized K/V (kv.quant " + std::string(kv_quant_name(a.kv.quant)) +
                       ") has no backward");
  if (a.kv.seqlens || a.kv.block_table)
    throw NotSupported("backward: KV-cache sources (kv.seqlens, kv.block_table) have no backward");
  if (a.fp32_output)
    throw NotSupported("backward: forward.fp32_output is not supported (o and d_o have forward.dtype)");
  // The forward's checks on the shared inputs, with O in the output view's
  // place (it has the output's shape), checked as the input it is here: read,
  // not written, so a broadcast (stride 0) or an O over an input is accepted.
  ForwardArgs shared = a;
  shared.o = OutputView{const_cast<void*>(b.o.data), b.o.stride};
  shared.lse = nullptr;
  detail::validate(shared, detail::OutputUse::read_only);  // qualified: no ADL pick of tileattn::validate

  const AttentionShape& s = a.shape;
  const bool varlen_q = a.cu_seqlens_q != nullptr, varlen_k = a.cu_seqlens_k != nullptr;
  int64_t max_nq = varlen_q ? 0 : s.seqlen_q;
  for (int64_t i = 0; varlen_q && i < s.batch; ++i)
    max_nq = std::max<int64_t>(max_nq, a.cu_seqlens_q[i + 1] - a.cu_seqlens_q[i]);
  const int64_t esize = int64_t(dtype_size(a.dtype));
  const int64_t q_batches = varlen_q ? 1 : s.batch, k_batches = varlen_k ? 1 : s.batch;
  const int64_t dv_dim = value_head_dim(s);  // V, O, dO and dV
  const int64_t q_sizes[4] = {q_batches, s.heads, s.seqlen_q, s.head_dim};
  const int64_t k_sizes[4] = {k_batches, s.kv_heads, s.seqlen_k, s.head_dim};
  const int64_t o_sizes[4] = {q_batches, s.heads, s.seqlen_q, dv_dim};
  const int64_t v_sizes[4] = {k_batches, s.kv_heads, s.seqlen_k, dv_dim};
  const int64_t l_sizes[3] = {q_batches, s.heads, s.seqlen_q};

  auto required = [](const void* data, const char* name, int64_t elements) {
    if (elements > 0 && !data) fail(std::string(name) + ": data is null");
  };
  const int64_t q_elements = q_sizes[0] * q_sizes[1] * q_sizes[2] * q_sizes[3];
  const int64_t k_elements = k_sizes[0] * k_sizes[1] * k_sizes[2] * k_sizes[3];
  required(b.o.data, "o", q_elements);
  required(b.d_o.data, "d_o", q_elements);
  required(b.lse, "lse", q_elements);
  required(b.dq.data, "dq", q_elements);
  required(b.dk.data, "dk", k_elements);
  required(b.dv.data, "dv", k_elements);
  if (q_elements > 0 && (!a.q.data)) fail("q: data is null");
  if (k_elements > 0 && (!a.k.data || !a.v.data)) fail(!a.k.data ? "k: data is null" : "v: data is null");

  const ViewSpan q = view_range("q", a.q.data, esize, q_sizes, a.q.stride.data(), 4);
  const ViewSpan k = view_range("k", a.k.data, esize, k_sizes, a.k.stride.data(), 4);
  const ViewSpan v = view_range("v", a.v.data, esize, v_sizes, a.v.stride.data(), 4);
  const ViewSpan o = view_range("o", b.o.data, esize, o_sizes, b.o.stride.data(), 4);
  const ViewSpan d_o = view_range("d_o", b.d_o.data, esize, o_sizes, b.d_o.stride.data(), 4);
  const ViewSpan lse = view_range("lse", b.lse, 4, l_sizes, b.lse_stride.data(), 3);
  ViewSpan mask;
  if (a.mask.kind != MaskSpec::Kind::none) {
    int64_t max_nk = varlen_k ? 0 : s.seqlen_k;
    for (int64_t i = 0; varlen_k && i < s.batch; ++i)
      max_nk = std::max<int64_t>(max_nk, a.cu_seqlens_k[i + 1] - a.cu_seqlens_k[i]);
    const int64_t m_sizes[4] = {s.batch, s.heads, max_nq, max_nk};
    mask = view_range("mask", a.mask.data, a.mask.kind == MaskSpec::Kind::boolean ? 1 : 4, m_sizes,
                      a.mask.stride.data(), 4);
  }
  const int64_t grad_esize = int64_t(dtype_size(gradient_dtype(b)));
  const ViewSpan dq = view_range("dq", b.dq.data, grad_esize, q_sizes, b.dq.stride.data(), 4);
  const ViewSpan dk = view_range("dk", b.dk.data, grad_esize, k_sizes, b.dk.stride.data(), 4);
  const ViewSpan dv = view_range("dv", b.dv.data, grad_esize, v_sizes, b.dv.stride.data(), 4);
  check_injective("dq", q_sizes, b.dq.stride.data(), 4);
  check_injective("dk", k_sizes, b.dk.stride.data(), 4);
  check_injective("dv", v_sizes, b.dv.stride.data(), 4);

  // d_sinks: fp32 [heads], dense; only with the forward's sinks.
  if (b.d_sinks && !a.sinks) fail("d_sinks: given without forward.sinks (there is no sink to differentiate)");
  const int64_t h_sizes[1] = {s.heads};
  const int64_t unit_stride[1] = {1};
  const ViewSpan d_sinks = b.d_sinks ? view_range("d_sinks", b.d_sinks, 4, h_sizes, unit_stride, 1) : ViewSpan{};
  const ViewSpan sinks = sinks_view(a), alibi = alibi_slopes_view(a);

  struct Named {
    const char* name;
    const ViewSpan* range;
  };
  const Named inputs[] = {{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}, {"d_o", &d_o},
                          {"lse", &lse}, {"mask", &mask}, {"sinks", &sinks}, {"alibi_slopes", &alibi}};
  const Named outputs[] = {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"d_sinks", &d_sinks}};
  const std::array<NamedView, 6> index_arrays = index_array_views(a);
  for (const Named& out : outputs) {
    for (const Named& in : inputs)
      if (views_overlap(*out.range, *in.range))
        fail(std::string(out.name) + ": output overlaps input " + in.name);
    for (const NamedView& in : index_arrays)
      if (views_overlap(*out.range, in.view)) fail(std::string(out.name) + ": output overlaps input " + in.name);
  }
  if (views_overlap(dq, dk)) fail("dq: overlaps output dk");
  if (views_overlap(dq, dv)) fail("dq: overlaps output dv");
  if (views_overlap(dk, dv)) fail("dk: overlaps output dv");
  for (const Named& out : {Named{"dq", &dq}, Named{"dk", &dk}, Named{"dv", &dv}})
    if (views_overlap(d_sinks, *out.range)) fail(std::string("d_sinks: overlaps output ") + out.name);
}

}  // namespace tileattn::detail

namespace tileattn {
void validate(const BackwardArgs& args) { detail::validate(args); }
}  // namespace tileattn
