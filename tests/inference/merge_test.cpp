// merge_states: two partial results over disjoint key sets combine into the
// attention over their union; an empty side (LSE = -inf) changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kv_test_support.hpp"
#include "tileattn/merge.hpp"

namespace tileattn::kvtest {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

struct Halves {
  int64_t heads = 4, kv_heads = 2, rows = 5, keys = 97, split = 40, d = 64;
  Buffer q, k, v;
  Buffer o_a, o_b, o_out;
  std::vector<float> lse_a, lse_b, lse_out;

  explicit Halves(DType dtype, uint64_t seed = 3) {
    std::mt19937_64 rng(seed);
    q = Buffer(dtype, heads * rows * d);
    k = Buffer(dtype, kv_heads * keys * d);
    v = Buffer(dtype, k.elements());
    q.fill_uniform(rng);
    k.fill_uniform(rng, 2.0f);
    v.fill_uniform(rng);
  }

  // Attention of every query over keys [first, first + count), no mask.
  ForwardArgs args_over(int64_t first, int64_t count, Buffer& o, std::vector<float>& lse) {
    const DType dtype = q.dtype();
    const int64_t esize = int64_t(dtype_size(dtype));
    ForwardArgs f;
    f.shape = {1, heads, kv_heads, rows, count, d};
    f.dtype = dtype;
    const auto kv_stride = bhsd(1, kv_heads, keys, d);
    f.q = {q.data(), bhsd(1, heads, rows, d)};
    f.k = {static_cast<const char*>(k.data()) + first * d * esize, kv_stride};
    f.v = {static_cast<const char*>(v.data()) + first * d * esize, kv_stride};
    o = Buffer(dtype, heads * rows * d);
    lse.assign(size_t(heads * rows), 0.0f);
    f.o = {o.data(), bhsd(1, heads, rows, d)};
    f.lse = lse.data();
    f.lse_stride = {heads * rows, rows, 1};
    return f;
  }

  MergeArgs merge_args() {
    MergeArgs m;
    m.batch = 1;
    m.heads = heads;
    m.rows = rows;
    m.head_dim = d;
    m.dtype = q.dtype();
    const auto s = bhsd(1, heads, rows, d);
    m.o_a = {o_a.data(), s};
    m.o_b = {o_b.data(), s};
    m.lse_a = lse_a.data();
    m.lse_b = lse_b.data();
    m.lse_a_stride = m.lse_b_stride = m.lse_out_stride = {heads * rows, rows, 1};
    o_out = Buffer(q.dtype(), heads * rows * d);
    lse_out.assign(size_t(heads * rows), 0.0f);
    m.o_out = {o_out.data(), s};
    m.lse_out = lse_out.data();
    return m;
  }
};

TEST(MergeStates, TwoHalvesEqualAttentionOverTheWhole) {
  for (int64_t split : {1, 40, 96}) {
    Halves h(DType::f32, uint64_t(split));
    attention_forward(h.args_over(0, split, h.o_a, h.lse_a));
    attention_forward(h.args_over(split, h.keys - split, h.o_b, h.lse_b));
    merge_states(h.merge_args());
    Buffer whole;
    std::vector<float> unused;
    const ForwardArgs all = h.args_over(0, h.keys, whole, unused);
    const Check c = check_against_reference(all, h.o_out, bhsd(1, h.heads, h.rows, h.d), h.lse_out.data());
    EXPECT_TRUE(c.ok()) << "split " << split << ": " << c.describe();
  }
}

TEST(MergeStates, InPlaceIntoFirstInput) {
  Halves h(DType::f32);
  attention_forward(h.args_over(0, h.split, h.o_a, h.lse_a));
  attention_forward(h.args_over(h.split, h.keys - h.split, h.o_b, h.lse_b));
  MergeArgs m = h.merge_args();
  merge_states(m);
  const auto expected_o = h.o_out.bytes();
  const auto expected_lse = h.lse_out;
  m.o_out = {h.o_a.data(), m.o_a.stride};
  m.lse_out = h.lse_a.data();
  merge_states(m);
  EXPECT_EQ(h.o_a.bytes(), expected_o);
  EXPECT_EQ(h.lse_a, expected_lse);
}

// Merging with a side that saw no key returns the other side bit for bit,
// whichever side is empty, even when the empty side's O holds garbage.
TEST(MergeStates, EmptySideIsExact) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    Halves h(dtype);
    attention_forward(h.args_over(0, h.split, h.o_a, h.lse_a));
    h.o_b = Buffer(dtype, h.o_a.elements());
    for (int64_t i = 0; i < h.o_b.elements(); ++i) h.o_b.set(i, std::numeric_limits<float>::quiet_NaN());
    h.lse_b.assign(h.lse_a.size(), kMinusInf);
    merge_states(h.merge_args());
    EXPECT_EQ(h.o_out.bytes(), h.o_a.bytes()) << dtype_name(dtype);
    EXPECT_EQ(h.lse_out, h.lse_a) << dtype_name(dtype);

    std::swap(h.o_a, h.o_b);
    std::swap(h.lse_a, h.lse_b);
    merge_states(h.merge_args());
    EXPECT_EQ(h.o_out.bytes(), h.o_b.bytes()) << dtype_name(dtype) << " empty side first";
    EXPECT_EQ(h.lse_out, h.lse_b);

    // FlashAttention-2 writes +inf for "no key": the same as -inf here, not NaN.
    h.lse_a.assign(h.lse_a.size(), std::numeric_limits<float>::infinity());
    merge_states(h.merge_args());
    EXPECT_EQ(h.o_out.bytes(), h.o_b.bytes()) << dtype_name(dtype) << " +inf side";
    EXPECT_EQ(h.lse_out, h.lse_b);
  }
}

// The empty side produced by the forward itself (a window that hides every
// key gives O = 0, LSE = -inf) also merges exactly.
TEST(MergeStates, EmptySideFromForward) {
  Halves h(DType::f32);
  attention_forward(h.args_over(0, h.split, h.o_a, h.lse_a));
  ForwardArgs none = h.args_over(h.split, 0, h.o_b, h.lse_b);  // zero keys
  attention_forward(none);
  for (float l : h.lse_b) ASSERT_EQ(l, kMinusInf);
  merge_states(h.merge_args());
  EXPECT_EQ(h.o_out.bytes(), h.o_a.bytes());
  EXPECT_EQ(h.lse_out, h.lse_a);
}

TEST(MergeStates, BothEmptyGivesZerosAndMinusInf) {
  Halves h(DType::f32);
  h.o_a = Buffer(DType::f32, h.heads * h.rows * h.d);
  h.o_b = Buffer(DType::f32, h.o_a.elements());
  h.lse_a.assign(size_t(h.heads * h.rows), kMinusInf);
  h.lse_b = h.lse_a;
  merge_states(h.merge_args());
  for (int64_t i = 0; i < h.o_out.elements(); ++i) ASSERT_EQ(h.o_out.get(i), 0.0f);
  for (float l : h.lse_out) ASSERT_EQ(l, kMinusInf);
}

// A NaN LSE on either side makes the row NaN, also when the other side is
// empty (-inf), in both argument orders -- as the forward's split merge does.
TEST(MergeStates, NaNOnEitherSideGivesNaN) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (float other : {kMinusInf, 0.5f})
    for (bool nan_first : {true, false}) {
      Halves h(DType::f32);
      attention_forward(h.args_over(0, h.split, h.o_a, h.lse_a));
      attention_forward(h.args_over(h.split, h.keys - h.split, h.o_b, h.lse_b));
      (nan_first ? h.lse_a : h.lse_b).assign(h.lse_a.size(), kNaN);
      (nan_first ? h.lse_b : h.lse_a).assign(h.lse_a.size(), other);
      merge_states(h.merge_args());
      const std::string order = std::string(nan_first ? "NaN, " : "other, ") + std::to_string(other);
      for (float l : h.lse_out) ASSERT_TRUE(std::isnan(l)) << order << ": lse_out " << l;
      for (int64_t i = 0; i < h.o_out.elements(); ++i)
        ASSERT_TRUE(std::isnan(h.o_out.get(i))) << order << ": o_out[" << i << "] " << h.o_out.get(i);
    }
}

// In place means o_out IS o_a (or o_b): the same data and strides. Any other
// overlap with an input -- here the same buffer viewed as [batch, rows,
// heads, head_dim] -- would read rows already overwritten, so it is an Error
// naming the output, and nothing is written.
TEST(MergeStates, RejectsOutputsOverlappingAnInputInAnotherView) {
  Halves h(DType::f32);
  attention_forward(h.args_over(0, h.split, h.o_a, h.lse_a));
  attention_forward(h.args_over(h.split, h.keys - h.split, h.o_b, h.lse_b));
  const auto o_a = h.o_a.bytes(), o_b = h.o_b.bytes();
  const auto lse_a = h.lse_a, lse_b = h.lse_b;
  const auto expect_rejected = [&](const MergeArgs& m, const std::string& needle) {
    try {
      merge_states(m);
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(h.o_a.bytes(), o_a) << needle;
    EXPECT_EQ(h.o_b.bytes(), o_b) << needle;
    EXPECT_EQ(h.lse_a, lse_a) << needle;
    EXPECT_EQ(h.lse_b, lse_b) << needle;
  };
  const std::array<int64_t, 4> bshd{h.heads * h.rows * h.d, h.d, h.heads * h.d, 1};
  MergeArgs m = h.merge_args();
  m.o_out = {h.o_a.data(), bshd};
  expect_rejected(m, "o_out: overlaps o_a");
  m.o_out = {h.o_b.data(), bshd};
  expect_rejected(m, "o_out: overlaps o_b");
  m = h.merge_args();
  m.lse_out = h.lse_b.data();
  m.lse_out_stride = {h.heads * h.rows, 1, h.heads};  // [batch, rows, heads]
  expect_rejected(m, "lse_out: overlaps lse_b");
  m = h.merge_args();
  m.lse_out = reinterpret_cast<float*>(h.o_a.data());
  expect_rejected(m, "lse_out: overlaps o_a");
  // lse_a inside the memory o_out covers (a buffer large enough for o_out).
  std::vector<float> shared(size_t(h.o_out.elements()));
  std::copy(h.lse_a.begin(), h.lse_a.end(), shared.begin());
  m = h.merge_args();
  m.lse_a = shared.data();
  m.o_out = {shared.data(), m.o_out.stride};
  expect_rejected(m, "o_out: overlaps lse_a");

  // The same view in place is fine, also when a dimension of size 1 (batch)
  // has another stride.
  MergeArgs same = h.merge_args();
  merge_states(same);
  const auto expected = h.o_out.bytes();
  same.o_out = {h.o_a.data(), {12345, h.rows * h.d, h.d, 1}};
  merge_states(same);
  EXPECT_EQ(h.o_a.bytes(), expected);
}

TEST(MergeStates, RejectsBadArguments) {
  Halves h(DType::f32);
  attention_forward(h.args_over(0, h.split, h.o_a, h.lse_a));
  attention_forward(h.args_over(h.split, h.keys - h.split, h.o_b, h.lse_b));
  MergeArgs m = h.merge_args();
  m.lse_b = nullptr;
  EXPECT_THROW(merge_states(m), Error);
  m = h.merge_args();
  m.head_dim = 0;
  EXPECT_THROW(merge_states(m), Error);
  m = h.merge_args();
  m.rows = -1;
  try {
    merge_states(m);
    ADD_FAILURE() << "rows = -1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows must be >= 0"), std::string::npos) << e.what();
  }
  // A dtype that is no output type (i8, f8, a value outside the enum): refused, nothing written.
  for (DType bad : {DType::i8, DType::f8_e4m3, static_cast<DType>(9)}) {
    m = h.merge_args();
    m.dtype = bad;
    const auto before = h.o_out.bytes();
    EXPECT_THROW(merge_states(m), Error);
    EXPECT_EQ(h.o_out.bytes(), before);
  }
}

}  // namespace
}  // namespace tileattn::kvtest
