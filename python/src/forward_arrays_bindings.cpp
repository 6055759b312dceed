// tileattn._tileattn.forward_arrays / check_forward: flash_attention's array
// work in one C++ call -- frameworks, ranks, dtypes, devices, shapes, mask
// broadcasting, strides, output allocation and the kernel call -- so that a
// small call costs little more than the kernel (docs/python.md, "Call
// overhead"). The Python layer (tileattn/_forward.py) parses the scalar
// options first; each message here names the argument it is about, in the
// words of the Python API.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include <nanobind/stl/optional.h>

#include "array_view.hpp"
#include "dtype_checks.hpp"
#include "bindings.hpp"
#include "kernel_timer.hpp"
#include "new_arrays.hpp"
#include "torch_eager.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/backward.hpp"

namespace tileattn::python {

namespace {

using namespace nb::literals;

// layout 0: [B, H, N, D] ("bhsd"); 1: [B, N, H, D] ("bshd").
const char* layout_name(int layout) { return layout == 1 ? "'bshd'" : "'bhsd'"; }

// [batch, head, row, dim] order of a 4-D view in `layout`.
std::array<int64_t, 4> kernel_order(const std::array<int64_t, kMaxRank>& x, int layout) {
  if (layout == 1) return {x[0], x[2], x[1], x[3]};
  return {x[0], x[1], x[2], x[3]};
}

// A packed varlen array [total, H, D] as the 4-D view [1, total, H, D] in
// layout bshd, the batch stride 0: the kernel takes rows from cu_seqlens.
ArrayView as_packed_4d(const ArrayView& a) {
  ArrayView v = a;
  v.rank = 4;
  v.shape = {1, a.shape[0], a.shape[1], a.shape[2]};
  v.stride = {0, a.stride[0], a.stride[1], a.stride[2]};
  return v;
}

ArrayView read_qkv(const char* name, nb::handle obj, Access access, int layout, bool packed) {
  ArrayView a = read_array(name, obj, access);
  if (packed) {
    if (a.rank != 3) {
      fail_value(std::string(name) + ": expected a 3-D packed array [total, H, D] with cu_seqlens, got shape " +
                 shape_text(a));
    }
    return as_packed_4d(a);
  }
  if (a.rank != 4) {
    fail_value(std::string(name) + ": expected a 4-D array " +
               (layout == 1 ? "[B, N, H, D]" : "[B, H, N, D]") + " (layout=" + layout_name(layout) +
               "), got shape " + shape_text(a));
  }
  return a;
}

// A cu_seqlens argument: integer [B + 1], read as int32 in place when it is
// dense int32, else converted once (kept alive by `kept`). With
// Access::metadata only the shape and type are checked. The library checks
// the values (0, non-decreasing, ending at the packed total).
const int32_t* read_cu_seqlens(const char* name, nb::handle obj, Framework fw, Access access,
                               int64_t& batch, nb::object& kept) {
  if (framework_of(name, obj) != fw) fail_type(std::string(name) + ": must be a " + framework_name(fw) + " array like q");
  ArrayView a = read_array(name, obj, access);
  if (a.type != ElementType::i32 && a.type != ElementType::i64 && a.type != ElementType::other_int) {
    fail_type(std::string(name) + ": expected an integer array [B + 1], got dtype " + dtype_text(obj));
  }
  if (a.rank != 1 || a.shape[0] < 1) fail_value(std::string(name) + ": expected shape [B + 1], got " + shape_text(a));
  batch = a.shape[0] - 1;
  if (access == Access::metadata) return nullptr;
  if (a.type != ElementType::i32 || (a.shape[0] > 1 && a.stride[0] != 1)) {
    kept = fw == Framework::torch ? obj.attr("to")(nb::module_::import_("torch").attr("int32")).attr("contiguous")()
                                  : nb::module_::import_("numpy").attr("ascontiguousarray")(obj, "dtype"_a = "int32");
    a = read_array(name, kept, access);
  }
  return static_cast<const int32_t*>(a.data);
}

// Element strides of the mask broadcast (NumPy rules) to [B, H, Nq, Nk]:
// missing leading dims and dims of size 1 get stride 0, so a [Nq, Nk] mask
// serves every batch and head without being expanded in memory.
std::array<int64_t, 4> broadcast_mask(const ArrayView& m, const std::array<int64_t, 4>& target) {
  auto target_text = [&] {
    return "[B, H, Nq, Nk] = (" + std::to_string(target[0]) + ", " + std::to_string(target[1]) +
           ", " + std::to_string(target[2]) + ", " + std::to_string(target[3]) + ")";
  };
  if (m.rank < 1 || m.rank > 4) {
    fail_value("attn_mask: expected 1 to 4 dims broadcastable to " + target_text() +
               ", got shape " + shape_text(m));
  }
  std::array<int64_t, 4> stride{0, 0, 0, 0};
  const int pad = 4 - m.rank;
  for (int i = 0; i < m.rank; ++i) {
    const int64_t size = m.shape[i];
    const int64_t want = target[pad + i];
    if (size == want) {
      stride[pad + i] = size != 1 ? m.stride[i] : 0;
    } else if (size != 1) {
      fail_value("attn_mask: shape " + shape_text(m) + " does not broadcast to " + target_text() +
                 " (dim " + std::to_string(i) + " is " + std::to_string(size) + ")");
    }
  }
  return stride;
}

// One flash_attention call, checked: ForwardArgs without the output, and the
// mask object the kernel reads (a float32 copy when it was another float type).
struct ForwardCall {
  ForwardArgs args;
  Framework framework = Framework::numpy;
  ArrayView q;
  ArrayView o;  // O's shape as the caller sees it: q's, with V's head dim last
  nb::object mask;
  nb::object alibi;
  nb::object sinks;
  nb::object cu_q, cu_k;  // int32 copies of cu_seqlens when they were not int32
  bool packed = false;     // varlen: q, k, v, o are [total, H, D]
  int layout = 0;          // of the 4-D views (packed: 1, [1, total, H, D])
};

ForwardCall prepare(nb::handle q, nb::handle k, nb::handle v, nb::handle mask, int layout,
                    bool causal, int64_t window_left, int64_t window_right,
                    std::optional<double> scale, double dropout_p, double softcap, nb::handle alibi,
                    nb::handle sinks, Access access, nb::handle cu_q = nb::none(),
                    nb::handle cu_k = nb::none(), int64_t max_seqlen_q = -1, int64_t max_seqlen_k = -1) {
  if (layout != 0 && layout != 1) fail_value("layout: unknown code " + std::to_string(layout));
  ForwardCall call;
  const Framework fw = framework_of("q", q);
  call.packed = !cu_q.is_none() || !cu_k.is_none();
  int64_t packed_batch = 0;
  const int32_t* cu_q_data = nullptr;
  const int32_t* cu_k_data = nullptr;
  if (call.packed) {
    if (cu_q.is_none() || cu_k.is_none()) fail_value("cu_seqlens_q, cu_seqlens_k: give both or neither");
    int64_t batch_k = 0;
    cu_q_data = read_cu_seqlens("cu_seqlens_q", cu_q, fw, access, packed_batch, call.cu_q);
    cu_k_data = read_cu_seqlens("cu_seqlens_k", cu_k, fw, access, batch_k, call.cu_k);
    if (batch_k != packed_batch) {
      fail_value("cu_seqlens_k: " + std::to_string(batch_k + 1) + " entries but cu_seqlens_q has " +
                 std::to_string(packed_batch + 1));
    }
    // A given max_seqlen (FlashAttention-2 requires one and sizes its work from it; the
    // kernel reads the lengths from cu_seqlens) must be at least the longest sequence.
    const std::pair<const char*, std::pair<const int32_t*, int64_t>> maxima[2] = {
        {"max_seqlen_q", {cu_q_data, max_seqlen_q}}, {"max_seqlen_k", {cu_k_data, max_seqlen_k}}};
    for (const auto& [name, given] : maxima) {
      const auto [cu, value] = given;
      if (value < 0 || cu == nullptr) continue;
      int64_t longest = 0;
      for (int64_t b = 0; b < packed_batch; ++b) longest = std::max<int64_t>(longest, int64_t(cu[b + 1]) - cu[b]);
      if (value < longest) {
        fail_value(std::string(name) + ": " + std::to_string(value) + " is less than the longest sequence (" +
                   std::to_string(longest) + ")");
      }
    }
    if (!mask.is_none()) {
      throw NotSupported("attn_mask: not supported with cu_seqlens (packed varlen batches take "
                         "is_causal, window, softcap and alibi_slopes)");
    }
    layout = 1;  // [1, total, H, D] views
  }
  for (auto [name, x] : {std::pair{"k", k}, std::pair{"v", v}}) {
    const Framework fx = framework_of(name, x);
    if (fx != fw) {
      fail_type(std::string(name) + ": is a " + framework_name(fx) + " array but q is " +
                framework_name(fw) + "; pass all of q, k, v from one framework");
    }
  }
  const ArrayView qa = read_qkv("q", q, access, layout, call.packed);
  const ArrayView ka = read_qkv("k", k, access, layout, call.packed);
  const ArrayView va = read_qkv("v", v, access, layout, call.packed);
  const DType dtype = attention_dtype("q", q, qa);
  check_dtype_like_q("k", k, ka, q, qa);
  check_dtype_like_q("v", v, va, q, qa);
  const auto qs = kernel_order(qa.shape, layout);  // b, h, nq, d
  const auto ks = kernel_order(ka.shape, layout);  // b, hk, nk, d
  const auto vs = kernel_order(va.shape, layout);  // b, hk, nk, dv
  if (vs[0] != ks[0] || vs[1] != ks[1] || vs[2] != ks[2]) {
    fail_value("v: shape " + shape_text(va) + " must equal k's " + shape_text(ka) +
               " but for the head dim (the last dimension)");
  }
  if (ks[0] != qs[0]) {
    fail_value("k: batch " + std::to_string(ks[0]) + " differs from q's " + std::to_string(qs[0]));
  }
  if (ks[3] != qs[3]) {
    fail_value("k: head_dim " + std::to_string(ks[3]) + " differs from q's " + std::to_string(qs[3]));
  }
  if (ks[1] < 1 || qs[1] % ks[1] != 0) {
    fail_value("k: " + std::to_string(ks[1]) + " heads must divide q's " + std::to_string(qs[1]) +
               " heads (GQA/MQA)");
  }
  if (qs[3] < 1 || qs[3] > kMaxHeadDim)
    fail_value("q: head_dim must be in 1.." + std::to_string(kMaxHeadDim) + ", got " + std::to_string(qs[3]));
  if (vs[3] < 1 || vs[3] > kMaxValueHeadDim) {
    fail_value("v: head_dim must be in 1.." + std::to_string(kMaxValueHeadDim) + " (V's may differ from q's), got " +
               std::to_string(vs[3]));
  }

  ForwardArgs& a = call.args;
  a.dtype = dtype;
  a.shape = AttentionShape{call.packed ? packed_batch : qs[0], qs[1], ks[1], qs[2], ks[2], qs[3], vs[3]};
  a.cu_seqlens_q = cu_q_data;
  a.cu_seqlens_k = cu_k_data;
  a.q = InputView{qa.data, kernel_order(qa.stride, layout)};
  a.k = InputView{ka.data, kernel_order(ka.stride, layout)};
  a.v = InputView{va.data, kernel_order(va.stride, layout)};
  a.mask.causal = causal;
  a.mask.window_left = window_left;
  a.mask.window_right = window_right;
  // The same value on every path (the custom op takes the scale as a float).
  a.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(qs[3])));
  a.dropout_p = static_cast<float>(dropout_p);
  a.softcap = static_cast<float>(softcap);  // checked by Python (parse_softcap) and validate()
  a.bf16_probabilities = bf16_probabilities_setting().load(std::memory_order_relaxed);
  read_alibi_slopes(alibi, access, a.shape.batch, qs[1], a.alibi_slopes, a.alibi_batch_stride);
  call.alibi = nb::borrow(alibi);
  a.sinks = read_sinks(sinks, access, qs[1]);
  call.sinks = nb::borrow(sinks);

  call.mask = nb::borrow(mask);
  if (!mask.is_none()) {
    if (framework_of("attn_mask", mask) != fw) {
      fail_type(std::string("attn_mask: must be a ") + framework_name(fw) + " array like q");
    }
    ArrayView m = read_array("attn_mask", mask, access);
    if (m.type == ElementType::f16 || m.type == ElementType::bf16 || m.type == ElementType::other_float) {
      // The kernel adds float32; another float type is converted (one copy of the mask).
      call.mask = fw == Framework::torch ? mask.attr("float")() : mask.attr("astype")("float32");
      m = read_array("attn_mask", call.mask, access);
    } else if (m.type != ElementType::boolean && m.type != ElementType::f32) {
      fail_type("attn_mask: dtype " + dtype_text(mask) +
                " is not supported (bool = keep, or float = added)");
    }
    a.mask.kind = m.type == ElementType::boolean ? MaskSpec::Kind::boolean : MaskSpec::Kind::additive;
    a.mask.data = m.data;
    a.mask.stride = broadcast_mask(m, {qs[0], qs[1], qs[2], ks[2]});
  }
  call.framework = fw;
  call.q = qa;
  call.layout = layout;
  if (call.packed) {  // what the caller gave: [total, H, D]
    call.q.rank = 3;
    call.q.shape = {qa.shape[1], qa.shape[2], qa.shape[3]};
    call.q.stride = {qa.stride[1], qa.stride[2], qa.stride[3]};
  }
  call.o = call.q;
  call.o.shape[size_t(call.o.rank - 1)] = vs[3];
  return call;
}

// Packed rows outside every sequence (before cu_seqlens_q[0], from
// cu_seqlens_q[B] on) of the outputs this call allocated: O 0 and LSE -inf,
// rows that see no key. The library leaves such rows alone (a caller may fill
// one buffer over several calls, as with FlashAttention-2); an array made
// here would otherwise hand back whatever its fresh memory held.
void clear_rows_outside_the_sequences(const ForwardArgs& a, bool o_allocated, bool lse_allocated) {
  const AttentionShape& s = a.shape;
  if (!a.cu_seqlens_q || s.batch < 1) return;
  const int64_t esize = int64_t(dtype_size(output_dtype(a)));
  const int64_t dv = value_head_dim(s);
  const int64_t ranges[2][2] = {{0, a.cu_seqlens_q[0]}, {a.cu_seqlens_q[s.batch], s.seqlen_q}};
  for (const auto& range : ranges)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t r = range[0]; r < range[1]; ++r) {
        if (o_allocated) {
          char* row = static_cast<char*>(a.o.data) + (h * a.o.stride[1] + r * a.o.stride[2]) * esize;
          for (int64_t d = 0; d < dv; ++d) std::memset(row + d * a.o.stride[3] * esize, 0, size_t(esize));
        }
        if (lse_allocated) a.lse[h * a.lse_stride[1] + r * a.lse_stride[2]] = -INFINITY;
      }
}

// The attention probabilities of a checked call (backward.hpp's
// attention_probabilities): float32 [B, H, max Nq, max Nk] in the call's
// framework, entries outside the mask 0, dropout applied (dropped 0, kept
// scaled by 1 / (1 - p)). For small shapes: the library refuses more than
// 2^28 entries.
nb::object probabilities(const ForwardCall& call) {
  const ForwardArgs& a = call.args;
  const AttentionShape& s = a.shape;
  auto longest = [&](const int32_t* cu, int64_t rows) {
    if (!cu) return rows;
    int64_t m = 0;
    for (int64_t b = 0; b < s.batch; ++b) m = std::max<int64_t>(m, int64_t(cu[b + 1]) - cu[b]);
    return m;
  };
  const int64_t nq = longest(a.cu_seqlens_q, s.seqlen_q), nk = longest(a.cu_seqlens_k, s.seqlen_k);
  const nb::object probs = new_float32(call.framework, {s.batch, s.heads, nq, nk});
  const ArrayView pv = read_array("probs", probs, Access::allocated);
  {
    nb::gil_scoped_release release;
    attention_probabilities(a, static_cast<float*>(pv.data), {pv.stride[0], pv.stride[1], pv.stride[2], pv.stride[3]});
  }
  return probs;
}

// flash_attention on arrays. o (q's shape, dtype and framework, contiguous)
// is allocated when none is given; lse (float32 [B, H, Nq]) is written into
// the given array, else allocated when with_lse, else not computed. Returns
// (o, lse or None).
nb::object forward_arrays(nb::handle q, nb::handle k, nb::handle v, nb::handle mask, int layout,
                          bool causal, int64_t window_left, int64_t window_right,
                          std::optional<double> scale, double dropout_p, uint64_t seed, int threads,
                          bool with_lse, nb::handle o, nb::handle lse, bool eager_only, double softcap,
                          nb::handle alibi_slopes, nb::handle sinks, nb::handle cu_seqlens_q,
                          nb::handle cu_seqlens_k, bool with_probs, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  if (eager_only && is_array(q) && framework_of("q", q) == Framework::torch &&
      !torch_call_is_plain_eager({q, k, v, mask, o, lse, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k})) {
    return nb::none();
  }
  ForwardCall call = prepare(q, k, v, mask, layout, causal, window_left, window_right, scale,
                             dropout_p, softcap, alibi_slopes, sinks, Access::read, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k);
  ForwardArgs& a = call.args;
  const AttentionShape& s = a.shape;
  // lse: [B, H, Nq]; packed: [H, total_q] (the kernel's [1, H, total_q] with batch stride 0).
  const int64_t lse_shape[3] = {s.batch, s.heads, s.seqlen_q};
  const int64_t* lse_expected = call.packed ? lse_shape + 1 : lse_shape;
  const int lse_rank = call.packed ? 2 : 3;
  const bool o_like_q = a.shape.v_head_dim == a.shape.head_dim;
  const nb::object o_obj = !o.is_none() ? nb::borrow(o) : o_like_q ? new_array_like(q, call.q) : new_array_shaped(q, call.o);
  nb::object lse_obj = nb::borrow(lse);
  if (lse.is_none() && with_lse) {
    lse_obj = call.packed ? new_float32(call.framework, {s.heads, s.seqlen_q})
                          : new_float32(call.framework, {s.batch, s.heads, s.seqlen_q});
  }
  // A given output is the public functions' `out=`.
  ArrayView ov = o.is_none() ? read_array("o", o_obj, Access::allocated)
                             : read_output("out", o_obj, call.framework, call.q.type, q,
                                           call.o.shape.data(), call.o.rank, /*float32_too=*/true);
  a.fp32_output = ov.type == ElementType::f32 && call.q.type != ElementType::f32;
  if (call.packed) ov = as_packed_4d(ov);
  a.o = OutputView{ov.data, kernel_order(ov.stride, call.layout)};
  if (!lse_obj.is_none()) {
    const ArrayView lv = lse.is_none() ? read_array("lse", lse_obj, Access::allocated)
                                       : read_output("lse", lse_obj, call.framework, ElementType::f32,
                                                     nb::handle(), lse_expected, lse_rank);
    a.lse = static_cast<float*>(lv.data);
    a.lse_stride = call.packed ? std::array<int64_t, 3>{0, lv.stride[0], lv.stride[1]}
                               : std::array<int64_t, 3>{lv.stride[0], lv.stride[1], lv.stride[2]};
  }
  a.seed = seed;
  a.threads = threads;
  try {
    // q, k, v and the mask stay referenced by the caller (and `call`), the outputs by o_obj/lse_obj.
    nb::gil_scoped_release release;
    run_forward(a);
  } catch (const Error& e) {
    if (!o.is_none()) fail_for_out(e);
    throw;
  }
  clear_rows_outside_the_sequences(a, o.is_none(), lse.is_none() && !lse_obj.is_none());
  if (!with_probs) return nb::make_tuple(o_obj, lse_obj);
  return nb::make_tuple(o_obj, lse_obj, probabilities(call));
}

// The checks of forward_arrays on metadata alone (shapes, dtypes, devices:
// also works on torch's fake tensors while tracing). Returns (mask, scale):
// the mask as the kernel reads it and the softmax scale in use.
nb::tuple check_forward(nb::handle q, nb::handle k, nb::handle v, nb::handle mask, int layout,
                        bool causal, int64_t window_left, int64_t window_right,
                        std::optional<double> scale, double dropout_p, double softcap,
                        nb::handle alibi_slopes, nb::handle sinks, nb::handle cu_seqlens_q,
                        nb::handle cu_seqlens_k) {
  ForwardCall call = prepare(q, k, v, mask, layout, causal, window_left, window_right, scale,
                             dropout_p, softcap, alibi_slopes, sinks, Access::metadata, cu_seqlens_q,
                             cu_seqlens_k);
  const double used = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(call.args.shape.head_dim));
  return nb::make_tuple(call.mask, used);
}

}  // namespace

void bind_forward_arrays(nb::module_& m) {
  // q, k, v accept None so that the checks name the argument (nanobind would refuse the call).
  m.def("forward_arrays", &forward_arrays, "q"_a.none(), "k"_a.none(), "v"_a.none(),
        "attn_mask"_a.none(), "layout"_a, "causal"_a, "window_left"_a, "window_right"_a, "scale"_a.none(), "dropout_p"_a, "seed"_a,
        "threads"_a, "with_lse"_a, "o"_a.none() = nb::none(), "lse"_a.none() = nb::none(), "eager_only"_a = false, "softcap"_a = 0.0,
        "alibi_slopes"_a.none() = nb::none(), "sinks"_a.none() = nb::none(),
        "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "with_probs"_a = false,
        "max_seqlen_q"_a = -1, "max_seqlen_k"_a = -1,
        "flash_attention on NumPy arrays or torch CPU tensors, checked; returns (o, lse or None) "
        "(with_probs: (o, lse or None, probabilities)), "
        "or None (nothing done) with eager_only when torch could observe the custom op "
        "torch.ops.tileattn.flash_attention (a tensor subclass, autograd, a tracer or mode)");
  m.def("check_forward", &check_forward, "q"_a.none(), "k"_a.none(), "v"_a.none(),
        "attn_mask"_a.none(), "layout"_a, "causal"_a, "window_left"_a, "window_right"_a, "scale"_a.none(), "dropout_p"_a,
        "softcap"_a = 0.0, "alibi_slopes"_a.none() = nb::none(), "sinks"_a.none() = nb::none(),
        "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(),
        "forward_arrays' checks on metadata only; returns (mask as the kernel reads it, scale)");
  m.def("dlpack_exchange_available", &dlpack_exchange_available, "array"_a,
        "test hook: whether torch tensors of this type are read through the DLPack C exchange API");
  m.def("use_dlpack_exchange", &use_dlpack_exchange, "enabled"_a,
        "test hook: read torch tensors through their attributes when False; returns the old setting");
}

}  // namespace tileattn::python
