#include <gtest/gtest.h>

#include "testing/problem_case.hpp"

namespace tileattn::testing {
namespace {

// Expects attention_forward to throw Error mentioning `needle` and to leave O untouched.
void expect_rejected(CaseData& data, const std::string& needle) {
  std::fill(data.o32.begin(), data.o32.end(), 7.0f);
  try {
    attention_forward(data.args);
    ADD_FAILURE() << "accepted; expected an error about '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (float x : data.o32) ASSERT_EQ(x, 7.0f) << "output written despite the error";
}

Case small() {
  Case c;
  c.seqlen_q = c.seqlen_k = 8;
  c.head_dim = 16;
  return c;
}

TEST(Validate, HeadsNotDivisible) {
  Case c = small();
  c.heads = 3;
  c.kv_heads = 2;
  CaseData data(c);
  expect_rejected(data, "kv_heads");
}

TEST(Validate, HeadDimOutOfRange) {
  CaseData data(small());
  data.args.shape.head_dim = 0;
  expect_rejected(data, "head_dim");
  data.args.shape.head_dim = 577;
  expect_rejected(data, "head_dim must be in 1..576, got 577");
}

// V's head dim: 1..512 (0: head_dim, which must then be <= 512 too); the
// output's rows are V's width, so O strides laid out for another width
// are refused.
TEST(Validate, ValueHeadDimOutOfRangeOrMismatched) {
  Case c = small();
  c.v_head_dim = 8;
  {
    CaseData data(c);
    data.args.shape.v_head_dim = 513;
    expect_rejected(data, "v_head_dim must be in 1..512 (0: head_dim), got 513");
    data.args.shape.v_head_dim = -1;
    expect_rejected(data, "v_head_dim must be in 1..512");
  }
  {
    Case mla = small();
    mla.head_dim = 576;
    mla.v_head_dim = 512;
    CaseData data(mla);
    data.args.shape.v_head_dim = 0;  // V would be 576 wide
    expect_rejected(data, "v_head_dim: V's head dim is head_dim (576)");
  }
  {
    CaseData data(c);  // O laid out [b, h, n, 8]
    data.args.shape.v_head_dim = 16;
    expect_rejected(data, "o: output strides overlap");
  }
}

TEST(Validate, NegativeSizes) {
  CaseData data(small());
  data.args.shape.seqlen_q = -1;
  expect_rejected(data, "seqlen_q");
}

TEST(Validate, NullData) {
  CaseData data(small());
  data.args.k.data = nullptr;
  expect_rejected(data, "k: data is null");
}

TEST(Validate, SizeOverflow) {
  CaseData data(small());
  data.args.shape.seqlen_q = int64_t{1} << 40;
  data.args.shape.heads = data.args.shape.kv_heads = int64_t{1} << 20;
  expect_rejected(data, "overflow");
}

TEST(Validate, OutputAliasingInput) {
  CaseData data(small());
  data.args.o.data = const_cast<void*>(data.args.q.data);
  try {
    attention_forward(data.args);
    ADD_FAILURE() << "aliasing accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlaps"), std::string::npos) << e.what();
  }
}

TEST(Validate, OverlappingOutputStrides) {
  CaseData data(small());
  data.args.o.stride[2] = 1;  // rows overlap each other
  expect_rejected(data, "overlap");
}

TEST(Validate, NonFiniteScaleAndBadDropout) {
  CaseData data(small());
  data.args.scale = std::numeric_limits<float>::infinity();
  expect_rejected(data, "scale");
  data.args.scale = 1.0f;
  data.args.dropout_p = 1.0f;
  expect_rejected(data, "dropout_p");
}

TEST(Validate, CuSeqlensMustBeMonotoneAndInRange) {
  Case c = small();
  c.varlen = true;
  c.varlen_q_lengths = {3, 4};
  c.varlen_k_lengths = {3, 4};
  CaseData data(c);
  data.cu_q[1] = 9;  // 0, 9, 7: decreasing
  expect_rejected(data, "cu_seqlens_q");
  data.cu_q[1] = 3;
  data.cu_k[2] = 100;
  expect_rejected(data, "cu_seqlens_k");
}

TEST(Validate, WindowBelowMinusOne) {
  CaseData data(small());
  data.args.mask.window_left = -2;
  expect_rejected(data, "window_left");
}

}  // namespace
}  // namespace tileattn::testing
