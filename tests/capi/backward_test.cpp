// Training through the C API: the same bits as the C++ attention_backward,
// and bad input rejected with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "capi/c_args.hpp"
#include "testing/problem_case.hpp"
#include "training/backward_support.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/tileattn.h"

namespace tileattn {
namespace {

using testing::Case;
using testing::CaseData;

struct Gradients {
  std::vector<float> dq, dk, dv, d_sinks;
};

struct BackwardFixture {
  CaseData data;
  std::vector<float> d_o;
  explicit BackwardFixture(const Case& c) : data(c) {
    data.args.threads = 2;
    attention_forward(data.args);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    d_o.resize(data.o32.size());
    for (float& x : d_o) x = uniform(rng);
  }
  Gradients empty() const { return {std::vector<float>(data.q32.size()), std::vector<float>(data.k32.size()),
                                    std::vector<float>(data.v32.size()), std::vector<float>(data.sinks.size())}; }
  BackwardArgs cpp_args(Gradients& g) const {
    BackwardArgs b;
    b.forward = data.args;
    b.o = {data.args.o.data, data.args.o.stride};
    b.d_o = {d_o.data(), data.args.o.stride};
    b.lse = data.args.lse;
    b.lse_stride = data.args.lse_stride;
    b.dq = {g.dq.data(), data.args.q.stride};
    b.dk = {g.dk.data(), data.args.k.stride};
    b.dv = {g.dv.data(), data.args.v.stride};
    if (data.args.sinks) b.d_sinks = g.d_sinks.data();
    return b;
  }
};

tileattn_backward_args c_args(const BackwardArgs& b, const tileattn_forward_args* forward) {
  tileattn_backward_args c;
  tileattn_backward_args_init(&c);
  c.forward = forward;
  c.o = capi_testing::c_tensor(b.o);
  c.d_o = capi_testing::c_tensor(b.d_o);
  c.lse = b.lse;
  for (int i = 0; i < 3; ++i) c.lse_stride[i] = b.lse_stride[i];
  c.dq = capi_testing::c_tensor(b.dq);
  c.dk = capi_testing::c_tensor(b.dk);
  c.dv = capi_testing::c_tensor(b.dv);
  c.d_sinks = b.d_sinks;
  return c;
}

TEST(CApiBackward, BitwiseEqualToCpp) {
  for (testing::MaskCase mask : {testing::MaskCase::none, testing::MaskCase::causal, testing::MaskCase::boolean})
  for (float softcap : {0.0f, 5.0f}) {
    Case c;
    c.softcap = softcap;
    if (softcap > 0.0f) c.alibi = Case::Alibi::batch_heads;
    c.sinks = softcap > 0.0f;
    c.input_scale = softcap > 0.0f ? 4.0f : 1.0f;
    c.batch = 2;
    c.heads = 4;
    c.kv_heads = 2;
    c.seqlen_q = 33;
    c.seqlen_k = 47;
    c.head_dim = 40;
    c.mask = mask;
    BackwardFixture f(c);
    Gradients cpp = f.empty(), via_c = f.empty();
    attention_backward(f.cpp_args(cpp));

    const tileattn_forward_args forward = capi_testing::to_c_args(f.data.args);
    const tileattn_backward_args args = c_args(f.cpp_args(via_c), &forward);
    ASSERT_EQ(tileattn_backward(&args), TILEATTN_OK) << tileattn_last_error();
    EXPECT_EQ(std::memcmp(cpp.dq.data(), via_c.dq.data(), cpp.dq.size() * 4), 0) << "dQ differs";
    EXPECT_EQ(std::memcmp(cpp.dk.data(), via_c.dk.data(), cpp.dk.size() * 4), 0) << "dK differs";
    EXPECT_EQ(std::memcmp(cpp.dv.data(), via_c.dv.data(), cpp.dv.size() * 4), 0) << "dV differs";
    EXPECT_EQ(cpp.d_sinks, via_c.d_sinks) << "d_sinks differ";
    for (float x : via_c.d_sinks) EXPECT_NE(x, 0.0f) << "d_sinks not written";
    bool nonzero = false;
    for (float x : via_c.dv) nonzero |= x != 0.0f;
    EXPECT_TRUE(nonzero);
  }
}

// fp32_gradients reaches the kernel: a bf16 backward writes the C++ call's
// fp32 dQ, dK and dV bit for bit through the C struct; the reserved field
// after it must be 0.
TEST(CApiBackward, Fp32GradientsBitwiseEqualToCpp) {
  testing::BackwardCase bc;
  bc.c.dtype = DType::bf16;
  bc.c.heads = 4;
  bc.c.kv_heads = 2;
  bc.c.seqlen_q = 33;
  bc.c.seqlen_k = 47;
  bc.c.mask = testing::MaskCase::causal;
  testing::BackwardData data(bc, Isa::automatic);
  const size_t nq = data.dq.f16.size(), nk = data.dk.f16.size(), nv = data.dv.f16.size();
  std::vector<float> cpp(nq + nk + nv), via_c(nq + nk + nv, -1.0f);
  BackwardArgs b = data.args;
  b.fp32_gradients = true;
  b.dq.data = cpp.data();
  b.dk.data = cpp.data() + nq;
  b.dv.data = cpp.data() + nq + nk;
  attention_backward(b);
  const tileattn_forward_args forward = capi_testing::to_c_args(b.forward);
  b.dq.data = via_c.data();
  b.dk.data = via_c.data() + nq;
  b.dv.data = via_c.data() + nq + nk;
  tileattn_backward_args args = c_args(b, &forward);
  args.fp32_gradients = 1;
  ASSERT_EQ(tileattn_backward(&args), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(via_c, cpp);
  // A caller whose struct ends before the field (the previous release's
  // size) gets 16-bit gradients whatever lies beyond its struct.
  static_assert(offsetof(tileattn_backward_args, reserved0) + sizeof(int32_t) == sizeof(tileattn_backward_args));
  std::vector<uint16_t> narrow(nq + nk + nv, 0);
  tileattn_backward_args older = args;
  older.struct_size = offsetof(tileattn_backward_args, fp32_gradients);
  older.dq.data = narrow.data();
  older.dk.data = narrow.data() + nq;
  older.dv.data = narrow.data() + nq + nk;
  ASSERT_EQ(tileattn_backward(&older), TILEATTN_OK) << tileattn_last_error();
  attention_backward(data.args);  // the ordinary bf16 gradients
  EXPECT_TRUE(std::equal(narrow.begin(), narrow.begin() + long(nq), data.dq.f16.begin())) << "dQ differs";
  EXPECT_TRUE(std::equal(narrow.begin() + long(nq), narrow.begin() + long(nq + nk), data.dk.f16.begin())) << "dK differs";
  EXPECT_TRUE(std::equal(narrow.begin() + long(nq + nk), narrow.end(), data.dv.f16.begin())) << "dV differs";

  std::fill(via_c.begin(), via_c.end(), -1.0f);
  args.reserved0 = 1;
  EXPECT_EQ(tileattn_backward(&args), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("reserved0"), std::string::npos) << tileattn_last_error();
  for (float x : via_c) ASSERT_EQ(x, -1.0f);
}

TEST(CApiBackward, BadInputWritesNothing) {
  BackwardFixture f(Case{});
  Gradients g = f.empty();
  std::fill(g.dq.begin(), g.dq.end(), 7.0f);
  const tileattn_forward_args forward = capi_testing::to_c_args(f.data.args);
  tileattn_backward_args args = c_args(f.cpp_args(g), &forward);

  args.forward = nullptr;
  EXPECT_EQ(tileattn_backward(&args), TILEATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error(), "tileattn_backward: args->forward is null");
  args.forward = &forward;
  args.lse = nullptr;
  EXPECT_EQ(tileattn_backward(&args), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("lse"), std::string::npos) << tileattn_last_error();
  args.lse = f.data.lse.data();
  args.dk.data = nullptr;
  EXPECT_EQ(tileattn_backward(&args), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("dk"), std::string::npos) << tileattn_last_error();
  EXPECT_EQ(tileattn_backward_validate(&args), TILEATTN_INVALID_ARGUMENT);
  for (float x : g.dq) ASSERT_EQ(x, 7.0f) << "dQ written despite the error";
  // V's head dim reaches the backward: O, dO, V and dV laid out head_dim wide
  // but described twice as wide overlap their own rows (dV, written, is refused;
  // O and dO are only read).
  args.dk.data = g.dk.data();
  tileattn_forward_args wide_v = forward;
  wide_v.v_head_dim = forward.head_dim * 2;
  args.forward = &wide_v;
  EXPECT_EQ(tileattn_backward(&args), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("dv: output strides overlap"), std::string::npos)
      << tileattn_last_error();
  for (float x : g.dq) ASSERT_EQ(x, 7.0f) << "dQ written despite the error";
}

TEST(CApiBackward, ProbabilitiesEqualCpp) {
  Case c;
  c.seqlen_q = 9;
  c.seqlen_k = 13;
  c.mask = testing::MaskCase::causal;
  CaseData data(c);
  const int64_t n = c.batch * c.heads * c.seqlen_q * c.seqlen_k;
  const std::array<int64_t, 4> stride{c.heads * c.seqlen_q * c.seqlen_k, c.seqlen_q * c.seqlen_k, c.seqlen_k, 1};
  std::vector<float> cpp(size_t(n), -1.0f), via_c(size_t(n), -1.0f);
  attention_probabilities(data.args, cpp.data(), stride);
  const tileattn_forward_args forward = capi_testing::to_c_args(data.args);
  ASSERT_EQ(tileattn_attention_probabilities(&forward, via_c.data(), stride.data()), TILEATTN_OK)
      << tileattn_last_error();
  EXPECT_EQ(cpp, via_c);
  EXPECT_EQ(tileattn_attention_probabilities(&forward, via_c.data(), nullptr), TILEATTN_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace tileattn
