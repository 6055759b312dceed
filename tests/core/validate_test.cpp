#include <gtest/gtest.h>

#include <random>
#include <set>

#include "core/validate.hpp"
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

// Whether two views share a byte, by listing every byte of both (small views only).
bool overlap_by_listing(const char* a, const char* b, int64_t e, const int64_t* sizes, const int64_t* strides) {
  std::set<const char*> bytes;
  for (int64_t i0 = 0; i0 < sizes[0]; ++i0)
    for (int64_t i1 = 0; i1 < sizes[1]; ++i1)
      for (int64_t i2 = 0; i2 < sizes[2]; ++i2)
        for (int64_t i3 = 0; i3 < sizes[3]; ++i3) {
          const int64_t off = (i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3]) * e;
          for (int64_t x = 0; x < e; ++x) bytes.insert(a + off + x);
        }
  for (int64_t i0 = 0; i0 < sizes[0]; ++i0)
    for (int64_t i1 = 0; i1 < sizes[1]; ++i1)
      for (int64_t i2 = 0; i2 < sizes[2]; ++i2)
        for (int64_t i3 = 0; i3 < sizes[3]; ++i3) {
          const int64_t off = (i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3]) * e;
          for (int64_t x = 0; x < e; ++x)
            if (bytes.count(b + off + x)) return true;
        }
  return false;
}

// views_overlap is exact for two views of one shape and strides: K and V of a
// fused cache [pages, 2, page, heads, D] interleave in overlapping byte ranges
// without sharing an element (FlashInfer's layout; it was refused as "v_cache:
// overlaps k_cache"), and random views agree with a byte-by-byte listing.
TEST(Validate, ViewsOverlapIsExactForOneShapeAndStrides) {
  static char buffer[1 << 16];
  const int64_t pages = 3, page = 4, heads = 2, d = 8;
  const int64_t sizes[4] = {pages, heads, page, d};                          // [P, Hkv, page, D] views
  const int64_t strides[4] = {2 * page * heads * d, d, heads * d, 1};      // of [P, 2, page, Hkv, D]
  const auto range = [&](const char* p) { return detail::view_range("x", p, 2, sizes, strides, 4); };
  const char* k = buffer + 64;
  const char* v = k + page * heads * d * 2;  // [:, 1]
  EXPECT_TRUE(detail::ranges_overlap(range(k), range(v)));
  EXPECT_FALSE(detail::views_overlap(range(k), range(v), k, v, 2, sizes, strides, sizes, strides, 4));
  EXPECT_TRUE(detail::views_overlap(range(k), range(k + 2), k, k + 2, 2, sizes, strides, sizes, strides, 4));
  EXPECT_TRUE(detail::views_overlap(range(k), range(v + 1), k, v + 1, 2, sizes, strides, sizes, strides, 4))
      << "half an element apart";
  const int64_t other[4] = {strides[0], strides[1], strides[2], 2};  // other strides: byte ranges decide
  EXPECT_TRUE(detail::views_overlap(range(k), range(v), k, v, 2, sizes, strides, sizes, other, 4));

  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    int64_t sz[4], st[4];
    for (int i = 0; i < 4; ++i) {
      sz[i] = 1 + int64_t(rng() % 4);
      st[i] = int64_t(rng() % 24) - 6;
    }
    const int64_t e = 1 + int64_t(rng() % 4);
    const char* a = buffer + 20000;
    const char* b = a + int64_t(rng() % 400) - 200;
    const detail::ByteRange ra = detail::view_range("a", a, e, sz, st, 4), rb = detail::view_range("b", b, e, sz, st, 4);
    EXPECT_EQ(detail::views_overlap(ra, rb, a, b, e, sz, st, sz, st, 4), overlap_by_listing(a, b, e, sz, st))
        << "trial " << trial;
  }
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
