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

// A small 4-D view for the listing below.
struct SmallView {
  const char* data;
  int64_t e;  // element size in bytes
  int64_t sizes[4], strides[4];
  detail::ViewSpan span() const { return detail::view_range("x", data, e, sizes, strides, 4); }
  template <class F>
  void for_each_byte(F f) const {
    for (int64_t i0 = 0; i0 < sizes[0]; ++i0)
      for (int64_t i1 = 0; i1 < sizes[1]; ++i1)
        for (int64_t i2 = 0; i2 < sizes[2]; ++i2)
          for (int64_t i3 = 0; i3 < sizes[3]; ++i3) {
            const int64_t off = (i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3]) * e;
            for (int64_t x = 0; x < e; ++x) f(data + off + x);
          }
  }
};

// Whether two views share a byte, by listing every byte of both (small views only).
bool overlap_by_listing(const SmallView& a, const SmallView& b) {
  std::set<const char*> bytes;
  a.for_each_byte([&](const char* p) { bytes.insert(p); });
  bool shared = false;
  b.for_each_byte([&](const char* p) { shared = shared || bytes.count(p) != 0; });
  return shared;
}

// views_overlap is exact: views of one buffer that interleave without
// sharing an element are apart (K and V of a fused cache [pages, 2, page,
// heads, D], FlashInfer's layout; q, k, v and out of one [B, N, 4, H, D]
// buffer; GQA's q and k of one [N, H + 2 Hkv, D] projection; an fp32 LSE
// interleaved with bf16 rows), and random views of any shapes, strides and
// element sizes agree with a byte-by-byte listing.
TEST(Validate, ViewsOverlapIsExact) {
  static char buffer[1 << 16];
  const int64_t pages = 3, page = 4, heads = 2, d = 8;
  // [P, Hkv, page, D] views of [P, 2, page, Hkv, D]
  const SmallView k{buffer + 64, 2, {pages, heads, page, d}, {2 * page * heads * d, d, heads * d, 1}};
  SmallView v = k;
  v.data = k.data + page * heads * d * 2;  // [:, 1]
  EXPECT_FALSE(detail::views_overlap(k.span(), v.span()));
  EXPECT_FALSE(overlap_by_listing(k, v));
  SmallView shifted = k;
  shifted.data = k.data + 2;
  EXPECT_TRUE(detail::views_overlap(k.span(), shifted.span()));
  shifted.data = v.data + 1;
  EXPECT_TRUE(detail::views_overlap(k.span(), shifted.span())) << "half an element apart";

  // q, k, v, o: [B, H, N, D] views of one [B, N, 4, H, D] buffer.
  const int64_t b = 2, n = 5, h = 3;
  const SmallView q4{buffer + 4096, 4, {b, h, n, d}, {n * 4 * h * d, d, 4 * h * d, 1}};
  for (int part = 1; part < 4; ++part) {
    SmallView other = q4;
    other.data = q4.data + part * h * d * 4;
    EXPECT_FALSE(detail::views_overlap(q4.span(), other.span())) << part;
    EXPECT_FALSE(detail::views_overlap(other.span(), q4.span())) << part;
  }
  // GQA: q [1, 4, n, d] and k [1, 2, n, d] of [n, 4 + 2 + 2, d].
  const SmallView gq{buffer + 20000, 4, {1, 4, n, d}, {0, d, 8 * d, 1}};
  SmallView gk{gq.data + 4 * d * 4, 4, {1, 2, n, d}, {0, d, 8 * d, 1}};
  EXPECT_FALSE(detail::views_overlap(gq.span(), gk.span()));
  gk.data -= 4;
  EXPECT_TRUE(detail::views_overlap(gq.span(), gk.span()));
  // An fp32 [B, H, N] LSE in the gaps of bf16 rows of d elements.
  const SmallView rows{buffer + 30000, 2, {1, h, n, d}, {0, n * (d + 2), d + 2, 1}};
  SmallView lse{rows.data + 2 * d, 4, {1, h, n, 1}, {0, n * (d + 2) / 2, (d + 2) / 2, 1}};
  EXPECT_FALSE(detail::views_overlap(rows.span(), lse.span()));
  lse.data -= 2;
  EXPECT_TRUE(detail::views_overlap(rows.span(), lse.span()));

  std::mt19937 rng(11);
  const auto random_view = [&](const char* base) {
    SmallView x{base, 1 + int64_t(rng() % 4), {}, {}};
    for (int i = 0; i < 4; ++i) {
      x.sizes[i] = 1 + int64_t(rng() % 4);
      x.strides[i] = int64_t(rng() % 24) - 6;
    }
    return x;
  };
  int same = 0, apart = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const SmallView a = random_view(buffer + 20000);
    SmallView c = trial % 2 ? random_view(a.data + int64_t(rng() % 400) - 200) : a;  // even trials: one geometry
    if (trial % 2 == 0) c.data = a.data + int64_t(rng() % 400) - 200;
    const bool listed = overlap_by_listing(a, c);
    EXPECT_EQ(detail::views_overlap(a.span(), c.span()), listed) << "trial " << trial;
    (listed ? same : apart)++;
  }
  EXPECT_GT(apart, 200);
  EXPECT_GT(same, 200);
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
