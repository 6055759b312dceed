// BackwardArgs::fp32_gradients: 16-bit inputs with dQ, dK and dV written in
// fp32. On every path (forced), fp16 and bf16, over shapes that take each
// of the backward's routes (GQA sums, key chunks with dQ partial sums,
// masks, packed sequences, dropout, sinks, recomputed normalizers):
// - rounding the fp32 gradients to the inputs' dtype gives the ordinary
//   call's gradients bit for bit (the only difference is the final
//   rounding), and d_sinks is the same;
// - the fp32 gradients keep fp32 precision: against the float64 backward
//   from the same O and LSE (reference_backward_from_lse: the rounded O's D;
//   the reference path: float64 from the inputs, as it computes),
//   each gradient's error is at most 1/8 of the 16-bit gradient's (gradients
//   computed in 16 bits and widened would have the 16-bit error).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backward_support.hpp"
#include "testing/case_table.hpp"
#include "tileattn/machine.hpp"
#include "training/reference_backward.hpp"

namespace tileattn::testing {
namespace {

std::vector<BackwardCase> fp32_gradient_cases() {
  std::vector<BackwardCase> cases;
  auto add = [&](Case c, float dropout = 0.0f) {
    for (DType dtype : {DType::f16, DType::bf16}) {
      BackwardCase bc;
      bc.c = c;
      bc.c.dtype = dtype;
      bc.dropout_p = dropout;
      cases.push_back(bc);
    }
  };
  add(head_dim_case(59, MaskCase::causal));
  add(head_dim_case(128, MaskCase::none));
  add(gqa_case(8, 2));
  add(length_case(17, 130));
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
    Case c;  // packed sequences
    c.varlen = true;
    c.varlen_q_lengths = {5, 0, 33};
    c.varlen_k_lengths = {9, 4, 40};
    c.mask = MaskCase::causal;
    add(c);
  }
  {
    Case c;  // strided bshd views
    c.layout = Layout::bshd;
    c.strided = true;
    c.mask = MaskCase::window;
    c.window_left = 7;
    c.window_right = 3;
    add(c);
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
  for (size_t i = 0; i < cases.size(); ++i) cases[i].c.seed = 7100 + i;
  return cases;
}

class Fp32Gradients : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(Fp32Gradients, RoundToTheOrdinaryGradientsAndKeepFp32Precision) {
  const BackwardCase& bc = GetParam();
  const DType dt = bc.c.dtype;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx, Isa::reference}) {
    if (isa != Isa::reference && !isa_available(isa)) continue;
    if (isa == Isa::reference && bc.dropout_p > 0.0f) continue;  // the reference path has no dropout
    SCOPED_TRACE(bc.name() + " on " + isa_name(isa));
    BackwardData ordinary(bc, isa), wide(bc, isa);
    attention_backward(ordinary.args);
    std::vector<float> dq(ordinary.dq.f16.size()), dk(ordinary.dk.f16.size()), dv(ordinary.dv.f16.size());
    wide.args.fp32_gradients = true;
    wide.args.dq.data = dq.data();
    wide.args.dk.data = dk.data();
    wide.args.dv.data = dv.data();
    attention_backward(wide.args);

    const struct {
      const char* name;
      const std::vector<float>& fp32;
      const std::vector<uint16_t>& bits;
    } gradients[] = {{"dq", dq, ordinary.dq.f16}, {"dk", dk, ordinary.dk.f16}, {"dv", dv, ordinary.dv.f16}};
    for (const auto& g : gradients)
      for (size_t i = 0; i < g.fp32.size(); ++i) {
        const uint16_t rounded = dt == DType::f16 ? detail::float_to_f16(g.fp32[i]) : detail::float_to_bf16(g.fp32[i]);
        if (rounded != g.bits[i]) {
          ADD_FAILURE() << g.name << " element " << i << ": fp32 " << g.fp32[i] << " rounds to bits " << rounded
                        << ", the ordinary call wrote " << g.bits[i];
          break;
        }
      }
    EXPECT_EQ(ordinary.d_sinks, wide.d_sinks);

    // Precision: both against float64 from the same O and LSE (the
    // reference path's own: float64 from the inputs alone).
    const training::BackwardReference ref = isa == Isa::reference
                                                ? training::reference_backward(ordinary.args)
                                                : training::reference_backward_from_lse(ordinary.args);
    const ForwardArgs& a = ordinary.args.forward;
    const AttentionShape& s = a.shape;
    const int64_t q_batches = a.cu_seqlens_q ? 1 : s.batch, k_batches = a.cu_seqlens_k ? 1 : s.batch;
    const struct {
      const char* name;
      const void* fp32;
      const void* ordinary;
      const std::array<int64_t, 4>& stride;
      int64_t batches, heads, rows, d;
      const std::vector<double>& ref;
    } checks[] = {
        {"dq", dq.data(), ordinary.dq.f16.data(), a.q.stride, q_batches, s.heads, s.seqlen_q, s.head_dim, ref.dq},
        {"dk", dk.data(), ordinary.dk.f16.data(), a.k.stride, k_batches, s.kv_heads, s.seqlen_k, s.head_dim, ref.dk},
        {"dv", dv.data(), ordinary.dv.f16.data(), a.v.stride, k_batches, s.kv_heads, s.seqlen_k, value_head_dim(s),
         ref.dv}};
    for (const auto& c : checks) {
      const std::vector<double> got32 = dense(c.fp32, DType::f32, c.stride, c.batches, c.heads, c.rows, c.d);
      const std::vector<double> got16 = dense(c.ordinary, dt, c.stride, c.batches, c.heads, c.rows, c.d);
      double err32 = 0, err16 = 0;
      for (size_t i = 0; i < got32.size(); ++i) {
        err32 = std::max(err32, std::abs(got32[i] - c.ref[i]));
        err16 = std::max(err16, std::abs(got16[i] - c.ref[i]));
      }
      EXPECT_LE(err32, err16 / 8) << c.name << ": fp32 error " << err32 << ", the 16-bit gradient's " << err16;
    }
  }
}

std::string fp32_gradients_name(const ::testing::TestParamInfo<BackwardCase>& info) {
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
