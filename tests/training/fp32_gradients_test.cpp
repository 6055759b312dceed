// BackwardArgs::fp32_gradients: 16-bit inputs with dQ, dK and dV written in
// fp32. On every path (forced), fp16 and bf16, over shapes that take each
// of the backward's routes (GQA sums, key chunks with dQ partial sums,
// masks, packed sequences, dropout, sinks, recomputed normalizers):
// - rounding the fp32 gradients to the inputs' dtype gives the ordinary
//   call's gradients bit for bit (the only difference is the final
//   rounding), every element the ordinary call writes is written and none
//   outside the views, and d_sinks is the same;
// - the fp32 gradients keep fp32 precision: against the float64 backward
//   from the same O and LSE (reference_backward_from_lse: the rounded O's D;
//   the reference path: float64 from the inputs, as it computes),
//   each gradient's error is at most 1/8 of the 16-bit gradient's (gradients
//   computed in 16 bits and widened would have the 16-bit error).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backward_support.hpp"
#include "testing/case_table.hpp"
#include "tileattn/machine.hpp"
#include "training/reference_backward.hpp"

namespace tileattn::testing {
namespace {

// A backward case with two more choices: bf16_probabilities (P and dS
// rounded to bf16 on the bf16 rungs; the fp32 gradients then carry that
// rounding, so only the bit-for-bit rounding is checked), and gradient views
// with rows padded by 3 elements (strides other than the inputs').
struct Fp32GradientCase {
  BackwardCase bc;
  bool bf16_probabilities = false;
  bool padded_gradients = false;
  std::string name() const {
    return bc.name() + (bf16_probabilities ? "_bf16probs" : "") + (padded_gradients ? "_padded" : "");
  }
};
void PrintTo(const Fp32GradientCase& c, std::ostream* os) { *os << c.name(); }

std::vector<Fp32GradientCase> fp32_gradient_cases() {
  std::vector<Fp32GradientCase> cases;
  auto add = [&](Case c, float dropout = 0.0f, bool bf16_probabilities = false, bool padded = false) {
    for (DType dtype : {DType::f16, DType::bf16}) {
      Fp32GradientCase gc;
      gc.bc.c = c;
      gc.bc.c.dtype = dtype;
      gc.bc.dropout_p = dropout;
      gc.bf16_probabilities = bf16_probabilities;
      gc.padded_gradients = padded;
      cases.push_back(gc);
    }
  };
  add(head_dim_case(59, MaskCase::causal));
  add(head_dim_case(128, MaskCase::none));
  add(gqa_case(8, 2));
  add(gqa_case(8, 2), 0.0f, /*bf16_probabilities=*/true, /*padded=*/true);
  add(length_case(17, 130));  // keys that no query sees (causal, bottom-right)
  {
    Case c;  // keys cut into chunks: dQ partial sums added afterwards
    c.heads = 2;
    c.kv_heads = 1;
    c.seqlen_q = 100;
    c.seqlen_k = 1100;
    c.head_dim = 16;
    c.mask = MaskCase::causal;
    add(c);
  }
  {
    Case c;  // packed sequences, one without queries, one without keys
    c.varlen = true;
    c.varlen_q_lengths = {5, 0, 33, 7};
    c.varlen_k_lengths = {9, 4, 40, 0};
    c.mask = MaskCase::causal;
    add(c);
    add(c, 0.0f, false, /*padded=*/true);
  }
  {
    Case c;  // strided bshd views
    c.layout = Layout::bshd;
    c.strided = true;
    c.mask = MaskCase::window;
    c.window_left = 7;
    c.window_right = 3;
    add(c);
    add(c, 0.0f, false, /*padded=*/true);
  }
  {
    Case c;  // MLA head dims: V and dV narrower than Q and K
    c.heads = 4;
    c.kv_heads = 1;
    c.head_dim = 192;
    c.v_head_dim = 128;
    c.mask = MaskCase::causal;
    add(c);
    add(c, 0.0f, /*bf16_probabilities=*/true);
  }
  {
    Case c;  // sinks (d_sinks) and dropout
    c.sinks = true;
    c.mask = MaskCase::causal;
    add(c);
    add(Case{}, 0.25f);
  }
  {
    Case c;  // |LSE| ~ 250: max and sum recomputed before the backward
    c.seqlen_q = c.seqlen_k = 64;
    c.head_dim = 32;
    c.scale = 10.0f;
    add(c);
  }
  for (size_t i = 0; i < cases.size(); ++i) cases[i].bc.c.seed = 7100 + i;
  return cases;
}

// One fp32 gradient: its buffer (NaN where nothing is written) and view.
struct WideGradient {
  const char* name;
  std::vector<float> buffer;
  std::array<int64_t, 4> stride;
  int64_t batches, heads, rows, d;
};

WideGradient wide_gradient(const char* name, const std::array<int64_t, 4>& like, size_t like_elements, bool padded,
                           int64_t batches, int64_t heads, int64_t rows, int64_t d) {
  WideGradient g{name, {}, like, batches, heads, rows, d};
  if (padded) g.stride = {heads * rows * (d + 3), rows * (d + 3), d + 3, 1};
  const size_t elements = padded ? size_t(batches * heads * rows * (d + 3)) : like_elements;
  g.buffer.assign(elements, std::numeric_limits<float>::quiet_NaN());
  return g;
}

class Fp32Gradients : public ::testing::TestWithParam<Fp32GradientCase> {};

TEST_P(Fp32Gradients, RoundToTheOrdinaryGradientsAndKeepFp32Precision) {
  const Fp32GradientCase& gc = GetParam();
  const BackwardCase& bc = gc.bc;
  const DType dt = bc.c.dtype;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx, Isa::reference}) {
    if (isa != Isa::reference && !isa_available(isa)) continue;
    if (isa == Isa::reference && bc.dropout_p > 0.0f) continue;  // the reference path has no dropout
    SCOPED_TRACE(gc.name() + " on " + isa_name(isa));
    BackwardData ordinary(bc, isa, gc.bf16_probabilities), wide(bc, isa, gc.bf16_probabilities);
    attention_backward(ordinary.args);
    const ForwardArgs& a = ordinary.args.forward;
    const AttentionShape& s = a.shape;
    const int64_t q_batches = a.cu_seqlens_q ? 1 : s.batch, k_batches = a.cu_seqlens_k ? 1 : s.batch;
    WideGradient grads[] = {
        wide_gradient("dq", a.q.stride, ordinary.dq.f16.size(), gc.padded_gradients, q_batches, s.heads, s.seqlen_q,
                      s.head_dim),
        wide_gradient("dk", a.k.stride, ordinary.dk.f16.size(), gc.padded_gradients, k_batches, s.kv_heads,
                      s.seqlen_k, s.head_dim),
        wide_gradient("dv", a.v.stride, ordinary.dv.f16.size(), gc.padded_gradients, k_batches, s.kv_heads,
                      s.seqlen_k, value_head_dim(s))};
    wide.args.fp32_gradients = true;
    wide.args.dq = {grads[0].buffer.data(), grads[0].stride};
    wide.args.dk = {grads[1].buffer.data(), grads[1].stride};
    wide.args.dv = {grads[2].buffer.data(), grads[2].stride};
    attention_backward(wide.args);
    const void* ordinary_data[] = {ordinary.dq.f16.data(), ordinary.dk.f16.data(), ordinary.dv.f16.data()};
    const std::array<int64_t, 4> ordinary_stride[] = {a.q.stride, a.k.stride, a.v.stride};

    // Precision: both against float64 from the same O and LSE (the
    // reference path's own: float64 from the inputs alone).
    const training::BackwardReference ref = isa == Isa::reference
                                                ? training::reference_backward(ordinary.args)
                                                : training::reference_backward_from_lse(ordinary.args);
    const std::vector<double>* refs[] = {&ref.dq, &ref.dk, &ref.dv};
    for (int t = 0; t < 3; ++t) {
      const WideGradient& g = grads[t];
      const std::vector<double> got32 =
          dense(g.buffer.data(), DType::f32, g.stride, g.batches, g.heads, g.rows, g.d);
      const std::vector<double> got16 = dense(ordinary_data[t], dt, ordinary_stride[t], g.batches, g.heads, g.rows, g.d);
      // Every element the 16-bit call writes is written (the buffer starts as
      // NaN) and rounds to it; a NaN stays NaN.
      for (size_t i = 0; i < got32.size(); ++i) {
        const bool same = std::isnan(got16[i])
                              ? std::isnan(got32[i])
                              : !std::isnan(got32[i]) && (dt == DType::f16 ? detail::float_to_f16(float(got32[i])) ==
                                                                                 detail::float_to_f16(float(got16[i]))
                                                                           : detail::float_to_bf16(float(got32[i])) ==
                                                                                 detail::float_to_bf16(float(got16[i])));
        if (!same) {
          ADD_FAILURE() << g.name << " element " << i << ": fp32 " << got32[i] << ", the ordinary call wrote "
                        << got16[i];
          break;
        }
      }
      // Nothing outside the view is written.
      std::vector<char> inside(g.buffer.size(), 0);
      for (int64_t b = 0; b < g.batches; ++b)
        for (int64_t h = 0; h < g.heads; ++h)
          for (int64_t r = 0; r < g.rows; ++r)
            for (int64_t c = 0; c < g.d; ++c)
              inside[size_t(b * g.stride[0] + h * g.stride[1] + r * g.stride[2] + c * g.stride[3])] = 1;
      for (size_t i = 0; i < g.buffer.size(); ++i)
        if (!inside[i] && !std::isnan(g.buffer[i])) {
          ADD_FAILURE() << g.name << ": element " << i << " outside the view written";
          break;
        }
      if (gc.bf16_probabilities) continue;
      double err32 = 0, err16 = 0;
      for (size_t i = 0; i < got32.size(); ++i) {
        err32 = std::max(err32, std::abs(got32[i] - (*refs[t])[i]));
        err16 = std::max(err16, std::abs(got16[i] - (*refs[t])[i]));
      }
      EXPECT_LE(err32, err16 / 8) << g.name << ": fp32 error " << err32 << ", the 16-bit gradient's " << err16;
    }
    EXPECT_EQ(ordinary.d_sinks, wide.d_sinks);
  }
}

std::string fp32_gradients_name(const ::testing::TestParamInfo<Fp32GradientCase>& info) {
  std::string name = info.param.name();
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp32Gradients, ::testing::ValuesIn(fp32_gradient_cases()), fp32_gradients_name);

// The overlap checks size the gradients' elements as 4 bytes: an fp32 dV
// whose last element's upper half is dO's first bf16 element (2-byte
// elements would end before it) is refused.
TEST(Fp32GradientsArgs, OverlapChecksTakeFourByteElements) {
  BackwardCase bc;
  bc.c.dtype = DType::bf16;
  bc.c.heads = bc.c.kv_heads = 1;
  bc.c.seqlen_q = bc.c.seqlen_k = 4;
  bc.c.head_dim = 16;
  BackwardData data(bc, Isa::automatic);
  const int64_t dv_elements = 4 * 16;
  alignas(64) static uint16_t memory[4096];
  std::vector<float> dq(data.dq.f16.size()), dk(data.dk.f16.size());
  BackwardArgs b = data.args;
  b.fp32_gradients = true;
  b.dq.data = dq.data();
  b.dk.data = dk.data();
  b.dv.data = memory;                                  // bytes [0, 4 * dv_elements)
  std::memcpy(memory + 2 * dv_elements - 1, data.d_o.f16.data(), data.d_o.f16.size() * 2);
  b.d_o.data = memory + 2 * dv_elements - 1;           // its first element: dV's last one's upper half
  try {
    validate(b);
    ADD_FAILURE() << "an fp32 dV overlapping dO's first element was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlaps"), std::string::npos) << e.what();
  }
  std::memcpy(memory + 2 * dv_elements, data.d_o.f16.data(), data.d_o.f16.size() * 2);
  b.d_o.data = memory + 2 * dv_elements;  // just past dV's last byte
  EXPECT_NO_THROW(validate(b));
}

}  // namespace
}  // namespace tileattn::testing
