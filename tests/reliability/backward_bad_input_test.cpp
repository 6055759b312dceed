// The bad inputs of issue 7 at the backward entry (attention_backward):
// each refused with an Error naming the argument, and dQ, dK, dV untouched.
// tests/training/validation_test.cpp covers the backward's own arguments
// (dO, LSE, gradient overlaps); these are the forward-shaped ones it shares.
#include <functional>
#include <limits>

#include "training/backward_support.hpp"

namespace tileattn::testing {
namespace {

constexpr float kSentinel = 123.0f;

BackwardCase small_backward_case() {
  BackwardCase bc;
  bc.c.batch = 2;
  bc.c.heads = 4;
  bc.c.kv_heads = 2;
  bc.c.seqlen_q = 9;
  bc.c.seqlen_k = 13;
  bc.c.head_dim = 16;
  return bc;
}

void expect_backward_refused(BackwardData& data, const std::function<void(BackwardArgs&)>& corrupt,
                             const std::vector<std::string>& needles) {
  for (auto* buffer : {&data.dq.f32, &data.dk.f32, &data.dv.f32}) std::fill(buffer->begin(), buffer->end(), kSentinel);
  BackwardArgs a = data.args;
  corrupt(a);
  try {
    attention_backward(a);
    ADD_FAILURE() << "accepted; expected an error mentioning '" << needles.front() << "'";
  } catch (const Error& e) {
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message '" << e.what() << "' lacks '" << needle << "'";
  }
  for (const auto* buffer : {&data.dq.f32, &data.dk.f32, &data.dv.f32})
    for (float x : *buffer) ASSERT_EQ(x, kSentinel) << "a gradient was written despite the error (" << needles.front() << ")";
}

TEST(BackwardBadInput, ShapesDtypeHeadsAndHeadDim) {
  BackwardData data(small_backward_case(), Isa::automatic);
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.shape.batch = -1; }, {"batch", ">= 0"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.shape.heads = 0; }, {"heads", ">= 1"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.shape.kv_heads = 3; },
                          {"kv_heads (3) must divide heads (4)"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.shape.head_dim = 577; }, {"head_dim", "1..576"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.shape.seqlen_q = -1; }, {"seqlen_q", ">= 0"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.dtype = static_cast<DType>(7); }, {"dtype"});
}

TEST(BackwardBadInput, GradientStridesNegativeZeroOrOverlapping) {
  BackwardData data(small_backward_case(), Isa::automatic);
  expect_backward_refused(data, [](BackwardArgs& a) { a.dq.stride[3] = -1; }, {"dq", "strides must be positive"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.dk.stride[1] = 0; }, {"dk", "strides must be positive"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.dv.stride[2] = 8; }, {"dv", "overlap"});
}

TEST(BackwardBadInput, WindowDropoutScaleAndOverflow) {
  BackwardData data(small_backward_case(), Isa::automatic);
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.mask.window_left = -2; }, {"window_left", ">= -1"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.dropout_p = 1.0f; }, {"dropout_p", "[0, 1)"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.scale = std::numeric_limits<float>::infinity(); },
                          {"scale", "finite"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.shape.seqlen_k = int64_t{1} << 62; },
                          {"k", "overflows int64"});
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.k.stride[2] = std::numeric_limits<int64_t>::max() / 4; },
                          {"k", "overflows int64"});
}

TEST(BackwardBadInput, GradientOnAnInput) {
  BackwardData data(small_backward_case(), Isa::automatic);
  expect_backward_refused(data, [&](BackwardArgs& a) { a.dv.data = const_cast<float*>(data.fwd.v32.data()); },
                          {"dv: output overlaps input v"});
  expect_backward_refused(data, [&](BackwardArgs& a) { a.dk.data = const_cast<float*>(data.fwd.k32.data()); },
                          {"dk: output overlaps input k"});
  // The score modifiers' per-head inputs are read while the gradients are written.
  expect_backward_refused(data, [](BackwardArgs& a) { a.forward.alibi_slopes = static_cast<const float*>(a.dq.data); },
                          {"dq: output overlaps input alibi_slopes"});
}

// Two packed sequences (3 and 5 queries, 4 and 6 keys).
BackwardCase varlen_backward_case() {
  BackwardCase bc = small_backward_case();
  bc.c.varlen = true;
  bc.c.varlen_q_lengths = {3, 5};
  bc.c.varlen_k_lengths = {4, 6};
  return bc;
}

// A gradient over an index array the items read as they run (cu_seqlens_q here).
TEST(BackwardBadInput, GradientOverAnIndexArray) {
  const BackwardCase bc = varlen_backward_case();
  BackwardData data(bc, Isa::automatic);
  std::vector<float> dq_with_cu(size_t(bc.c.heads * 8 * bc.c.head_dim) + 8, 0.0f);
  std::memcpy(dq_with_cu.data() + 3, data.fwd.cu_q.data(), data.fwd.cu_q.size() * sizeof(int32_t));
  const std::vector<float> before = dq_with_cu;
  expect_backward_refused(data, [&](BackwardArgs& a) {
    a.dq.data = dq_with_cu.data();
    a.forward.cu_seqlens_q = reinterpret_cast<const int32_t*>(dq_with_cu.data() + 3);
  }, {"dq: output overlaps input cu_seqlens_q"});
  EXPECT_EQ(dq_with_cu, before);
}

TEST(BackwardBadInput, CuSeqlens) {
  BackwardData data(varlen_backward_case(), Isa::automatic);
  data.fwd.cu_q = {0, 6, 2};  // decreasing
  expect_backward_refused(data, [](BackwardArgs&) {}, {"cu_seqlens_q", "non-decreasing"});
  data.fwd.cu_q = {0, 3, 8};
  data.fwd.cu_k = {0, 4, 11};  // 11 > 10 packed key rows
  expect_backward_refused(data, [](BackwardArgs&) {}, {"cu_seqlens_k[2] = 11", "exceeds the packed rows"});
}

}  // namespace
}  // namespace tileattn::testing
