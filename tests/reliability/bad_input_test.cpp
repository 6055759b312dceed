// Every bad input of issue 7, at the C++ entry: refused with an Error that
// names the argument and the expected value, and nothing written.
#include <cmath>
#include <limits>

#include "reliability/bad_input_support.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/reference.hpp"

namespace tileattn::reliability {
namespace {

using testing::Case;
using testing::CaseData;
using testing::MaskCase;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(BadInput, Shapes) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    CaseData data(small_case(dtype));
    const ForwardArgs good = data.args;
    data.args.shape.batch = -1;
    expect_forward_refused(data, {"batch", ">= 0", "-1"});
    data.args = good;
    data.args.shape.heads = 0;
    expect_forward_refused(data, {"heads", ">= 1"});
    data.args = good;
    data.args.shape.kv_heads = 0;
    expect_forward_refused(data, {"kv_heads", ">= 1"});
    data.args = good;
    data.args.shape.kv_heads = 3;
    expect_forward_refused(data, {"kv_heads (3) must divide heads (4)"});
    data.args = good;
    data.args.shape.head_dim = 0;
    expect_forward_refused(data, {"head_dim", "1..576", "0"});
    data.args.shape.head_dim = 577;
    expect_forward_refused(data, {"head_dim", "1..576", "577"});
    data.args = good;
    data.args.shape.seqlen_q = -3;
    expect_forward_refused(data, {"seqlen_q", ">= 0", "-3"});
    data.args = good;
    data.args.shape.seqlen_k = -1;
    expect_forward_refused(data, {"seqlen_k", ">= 0"});
  }
}

TEST(BadInput, Dtype) {
  CaseData data(small_case());
  data.args.dtype = static_cast<DType>(7);
  expect_forward_refused(data, {"dtype", "fp32, fp16 or bf16"});
}

TEST(BadInput, OutputStridesNegativeZeroOrOverlapping) {
  CaseData data(small_case());
  const ForwardArgs good = data.args;
  // Negative: the output would be written backwards from o.data, below the buffer.
  data.args.o.stride[3] = -1;
  expect_forward_refused(data, {"o", "strides must be positive", "dimension 3", "-1"});
  data.args = good;
  data.args.o.stride[1] = 0;  // every head writes the same rows
  expect_forward_refused(data, {"o", "strides must be positive", "dimension 1"});
  data.args = good;
  data.args.o.stride[2] = 8;  // rows of 16 elements, 8 apart: overlapping
  expect_forward_refused(data, {"o", "overlap", "dimension 2"});
  data.args = good;
  data.args.lse_stride = {9, 0, 1};  // heads share the LSE of each row
  expect_forward_refused(data, {"lse", "strides must be positive"});
}

TEST(BadInput, StridesThatOverflowOrLeaveTheAddressSpace) {
  CaseData data(small_case());
  const ForwardArgs good = data.args;
  data.args.k.stride[2] = std::numeric_limits<int64_t>::max() / 4;
  expect_forward_refused(data, {"k", "overflows int64"});
  data.args = good;
  data.args.q.stride[0] = std::numeric_limits<int64_t>::min() / 2;
  expect_forward_refused(data, {"q"});
  data.args = good;
  data.args.v.stride[1] = -(int64_t{1} << 61);  // exactly INT64_MIN bytes below v
  expect_forward_refused(data, {"v", "reach below address 0"});
  data.args = good;
  // The second batch ends just below INT64_MAX bytes past q: in int64, but
  // q's address plus that is not.
  data.args.q.stride[0] = std::numeric_limits<int64_t>::max() / 4 - 1024;
  expect_forward_refused(data, {"q", "overflow the address space"});
}

TEST(BadInput, SizeProductsOverflowBeforeAnyAllocation) {
  CaseData data(small_case());
  const ForwardArgs good = data.args;
  data.args.shape.seqlen_q = int64_t{1} << 40;
  data.args.shape.head_dim = 256;
  data.args.shape.heads = data.args.shape.kv_heads = int64_t{1} << 20;
  expect_forward_refused(data, {"q", "overflows int64"});
  data.args = good;
  data.args.shape.seqlen_k = int64_t{1} << 62;
  expect_forward_refused(data, {"k", "overflows int64"});
}

TEST(BadInput, CuSeqlens) {
  Case c = small_case();
  c.varlen = true;
  c.varlen_q_lengths = {3, 5, 1};
  c.varlen_k_lengths = {4, 2, 6};
  CaseData data(c);
  data.cu_q = {0, 3, 2, 9};  // decreasing
  expect_forward_refused(data, {"cu_seqlens_q", "non-decreasing", "entry 2 (2) < entry 1 (3)"});
  data.cu_q = {-1, 3, 8, 9};
  expect_forward_refused(data, {"cu_seqlens_q[0]", ">= 0", "-1"});
  data.cu_q = {0, 3, 8, 9};
  data.cu_k = {0, 4, 6, 13};  // 13 > 12 packed key rows
  expect_forward_refused(data, {"cu_seqlens_k[3] = 13", "exceeds the packed rows", "12"});
}

TEST(BadInput, BlockTable) {
  // A paged cache of 3 pages of 4 rows, one sequence of 9 keys.
  Case c = small_case();
  c.batch = 1;
  c.seqlen_k = 12;
  CaseData data(c);
  std::vector<int32_t> seqlens{9}, table{2, 0, 1};
  data.args.kv.seqlens = seqlens.data();
  data.args.kv.block_table = table.data();
  data.args.kv.block_table_stride = 3;
  data.args.kv.page_size = 4;
  data.args.kv.num_pages = 3;
  data.args.k.stride = {data.args.k.stride[2] * 4 * c.kv_heads, data.args.k.stride[2] * 4,
                        data.args.k.stride[2], 1};
  data.args.v.stride = data.args.k.stride;
  const ForwardArgs good = data.args;
  attention_forward(data.args);  // the valid table is accepted

  table = {2, 3, 1};
  expect_forward_refused(data, {"block_table[0, 1] = 3", "out of range 0..2"});
  table = {2, -1, 1};
  expect_forward_refused(data, {"block_table[0, 1] = -1", "out of range"});
  table = {2, 0, 1};
  data.args.kv.block_table_stride = 2;
  expect_forward_refused(data, {"block_table", "needs 3 pages", "has 2"});
  data.args = good;
  data.args.kv.page_size = 0;
  expect_forward_refused(data, {"page_size", ">= 1"});
  // Pages per sequence were once (n + page_size - 1) / page_size: a signed
  // overflow here (fuzz/fuzz_kv_cache.cpp found it in the KV cache's copy).
  data.args.kv.page_size = std::numeric_limits<int64_t>::max();
  expect_forward_refused(data, {"k", "overflows int64"});
  data.args = good;
  seqlens = {-2};
  expect_forward_refused(data, {"kv seqlens[0]", ">= 0", "-2"});
  seqlens = {9};
  data.args.kv.block_table = nullptr;
  data.args.kv.seqlens = seqlens.data();
  data.args.shape.seqlen_k = 8;  // contiguous cache of capacity 8 cannot hold 9 keys
  expect_forward_refused(data, {"kv seqlens[0] = 9", "exceeds the cache capacity (8)"});
}

TEST(BadInput, WindowDropoutScaleThreadsTiles) {
  CaseData data(small_case());
  const ForwardArgs good = data.args;
  data.args.mask.window_left = -2;
  expect_forward_refused(data, {"window_left", ">= -1", "-2"});
  data.args = good;
  data.args.mask.window_right = -5;
  expect_forward_refused(data, {"window_right", ">= -1"});
  for (float p : {-0.1f, 1.0f, 1.5f, kNaN}) {
    data.args = good;
    data.args.dropout_p = p;
    expect_forward_refused(data, {"dropout_p", "[0, 1)"});
  }
  for (float s : {kInf, -kInf}) {
    data.args = good;
    data.args.scale = s;
    expect_forward_refused(data, {"scale", "finite"});
  }
  data.args = good;
  data.args.threads = -1;
  expect_forward_refused(data, {"threads", ">= 0"});
  data.args = good;
  data.args.block_q = 5000;
  expect_forward_refused(data, {"block_q", "0..1024"});
  data.args = good;
  data.args.block_kv = -1;
  expect_forward_refused(data, {"block_kv", "0..1024"});
}

TEST(BadInput, NullPointers) {
  CaseData data(small_case());
  const ForwardArgs good = data.args;
  data.args.q.data = nullptr;
  expect_forward_refused(data, {"q: data is null"});
  data.args = good;
  data.args.v.data = nullptr;
  expect_forward_refused(data, {"v: data is null"});
  data.args = good;
  data.args.mask.kind = MaskSpec::Kind::boolean;
  expect_forward_refused(data, {"mask: data is null"});
  data.args = good;
  data.args.mask.kind = static_cast<MaskSpec::Kind>(9);
  data.args.mask.data = data.args.q.data;
  expect_forward_refused(data, {"mask", "unknown kind"});
  // Mask data without its kind would be ignored, silently.
  data.args = good;
  data.args.mask.data = data.args.q.data;
  expect_forward_refused(data, {"mask: data given with kind none"});
}

// The vocabulary functions on values outside their enums and on negative
// sizes: an Error (or "unknown" for the names), not a size or strides made up.
TEST(BadInput, EnumValuesOutsideTheEnumsAndNegativeSizes) {
  EXPECT_THROW(dtype_size(static_cast<DType>(9)), Error);
  EXPECT_STREQ(dtype_name(static_cast<DType>(9)), "unknown");
  EXPECT_STREQ(layout_name(static_cast<Layout>(5)), "unknown");
  EXPECT_THROW(dense_strides(static_cast<Layout>(5), 1, 2, 3, 4), Error);
  EXPECT_THROW(dense_strides(Layout::bhsd, 1, -2, 3, 4), Error);
  EXPECT_THROW(dense_strides(Layout::bshd, 1, 2, 3, -4), Error);
  EXPECT_EQ(dense_strides(Layout::bshd, 1, 2, 3, 4), (std::array<int64_t, 4>{24, 4, 8, 1}));
  EXPECT_THROW(choose_tiles(Isa::generic, 0, DType::f32), Error);
  EXPECT_THROW(choose_tiles(Isa::generic, kMaxHeadDim + 1, DType::f32), Error);
  EXPECT_GT(choose_tiles(Isa::generic, kMaxHeadDim, DType::f32).block_q, 0);
}

TEST(BadInput, OutputAliasingAnInput) {
  Case c = small_case();
  c.mask = MaskCase::additive;
  CaseData data(c);
  const ForwardArgs good = data.args;
  for (const void* input : {data.args.q.data, data.args.k.data, data.args.v.data, data.args.mask.data}) {
    data.args = good;
    data.args.o.data = const_cast<void*>(input);
    // The snapshot covers the real O buffer; the aliased input must be unchanged too.
    std::vector<float> q = data.q32, k = data.k32, v = data.v32, m = data.add_mask;
    expect_forward_refused(data, {"o: output overlaps"});
    EXPECT_EQ(q, data.q32);
    EXPECT_EQ(k, data.k32);
    EXPECT_EQ(v, data.v32);
    EXPECT_EQ(m, data.add_mask);
  }
  // Partial overlap: O starts in the middle of Q.
  data.args = good;
  data.args.o.data = data.q32.data() + 17;
  expect_forward_refused(data, {"o: output overlaps input q"});
  data.args = good;
  data.args.lse = static_cast<float*>(data.args.o.data);
  expect_forward_refused(data, {"lse: overlaps output o"});
  data.args = good;
  data.args.lse = const_cast<float*>(static_cast<const float*>(data.args.k.data));
  expect_forward_refused(data, {"lse: overlaps an input"});
  // The score modifiers' per-head inputs: sinks [H] and ALiBi slopes [H] or [B, H].
  data.args = good;
  data.args.sinks = static_cast<const float*>(data.args.o.data);
  expect_forward_refused(data, {"o: output overlaps input sinks"});
  std::vector<float> lse(size_t(c.batch * c.heads * c.seqlen_q), 0.0f);
  data.args = good;
  data.args.lse = lse.data();
  data.args.lse_stride = {c.heads * c.seqlen_q, c.seqlen_q, 1};
  data.args.alibi_slopes = lse.data() + 1;
  data.args.alibi_batch_stride = c.heads;
  expect_forward_refused(data, {"lse: overlaps input alibi_slopes"});
}

// The index arrays work items read as they run (here cu_seqlens_q and
// cu_seqlens_k of packed sequences) may not lie under O or LSE: an item's
// writes would move the rows of items still running. The arrays sit in
// buffers of the test's own, checked unchanged.
TEST(BadInput, OutputOverAnIndexArray) {
  Case c = small_case();
  c.varlen = true;
  c.varlen_q_lengths = {3, 5};
  c.varlen_k_lengths = {4, 6};
  CaseData data(c);
  const ForwardArgs good = data.args;
  std::vector<float> o_with_cu(data.o32.size() + 8, 0.0f);
  std::memcpy(o_with_cu.data() + 4, data.cu_q.data(), data.cu_q.size() * sizeof(int32_t));
  data.args.o.data = o_with_cu.data();
  data.args.cu_seqlens_q = reinterpret_cast<const int32_t*>(o_with_cu.data() + 4);
  const std::vector<float> o_before = o_with_cu;
  expect_forward_refused(data, {"o: output overlaps input cu_seqlens_q"});
  EXPECT_EQ(o_with_cu, o_before);
  data.args = good;
  std::vector<float> lse_with_cu(data.lse.size() + 8, 0.0f);
  std::memcpy(lse_with_cu.data() + 2, data.cu_k.data(), data.cu_k.size() * sizeof(int32_t));
  data.args.lse = lse_with_cu.data();
  data.args.cu_seqlens_k = reinterpret_cast<const int32_t*>(lse_with_cu.data() + 2);
  const std::vector<float> lse_before = lse_with_cu;
  expect_forward_refused(data, {"lse: overlaps input cu_seqlens_k"});
  EXPECT_EQ(lse_with_cu, lse_before);
}

// An empty batch is valid whatever packed row count Q claims; no path may
// size a buffer by that count (the float64 reference path once allocated
// heads x seqlen_q x head_dim doubles here -- 16 TB -- found by fuzz_forward).
TEST(BadInput, EmptyBatchAllocatesNothingOnAnyPath) {
  CaseData data(small_case());
  std::vector<int32_t> cu{2'000'000'000};
  data.args.shape.batch = 0;
  data.args.shape.heads = data.args.shape.kv_heads = 8;
  data.args.shape.head_dim = 128;
  data.args.shape.seqlen_q = 2'000'000'000;
  data.args.cu_seqlens_q = cu.data();
  const OutputSnapshot before = poison_outputs(data);
  for (Isa isa : {Isa::automatic, Isa::generic, Isa::reference}) {
    data.args.isa = isa;
    EXPECT_NO_THROW(attention_forward(data.args)) << isa_name(isa);
  }
  EXPECT_TRUE(outputs_unchanged(data, before)) << "an empty batch wrote an output";
  EXPECT_TRUE(reference_forward(data.args).o.empty());
}

// Sizes whose product is 0 with a huge batch or head count (a 128-byte .npy
// of shape (2^40, 1, 0, 16) is one): nothing to write, and the forward and
// backward return at once instead of walking 2^40 (sequence, head) pairs.
TEST(BadInput, EmptyViewsWithHugeBatchOrHeadsReturnAtOnce) {
  CaseData data(small_case());
  const ForwardArgs good = data.args;
  float sinks_grad[4] = {7, 7, 7, 7};
  for (int which = 0; which < 2; ++which) {
    data.args = good;
    AttentionShape& s = data.args.shape;
    s.seqlen_q = s.seqlen_k = 0;
    if (which == 0) s.batch = int64_t(1) << 40;
    else s.heads = s.kv_heads = int64_t(1) << 40;
    const OutputSnapshot before = poison_outputs(data);
    for (Isa isa : {Isa::automatic, Isa::generic, Isa::reference}) {
      data.args.isa = isa;
      EXPECT_NO_THROW(attention_forward(data.args)) << isa_name(isa);
      BackwardArgs b;
      b.forward = data.args;
      b.o = InputView{data.args.o.data, data.args.o.stride};
      b.d_o = InputView{data.args.o.data, data.args.o.stride};
      b.lse = data.args.lse;
      b.lse_stride = data.args.lse_stride;
      b.dq = data.args.o;
      b.dk = data.args.o;
      b.dv = data.args.o;
      EXPECT_NO_THROW(attention_backward(b)) << isa_name(isa);
    }
    EXPECT_TRUE(outputs_unchanged(data, before)) << "an empty call wrote an output";
  }
  // d_sinks, a sum over no rows, is 0.
  data.args = good;
  data.args.shape.seqlen_q = data.args.shape.seqlen_k = 0;
  data.args.shape.batch = int64_t(1) << 40;
  std::vector<float> sinks(size_t(data.args.shape.heads), 0.5f);
  data.args.sinks = sinks.data();
  BackwardArgs b;
  b.forward = data.args;
  b.o = InputView{data.args.o.data, data.args.o.stride};
  b.d_o = b.o;
  b.lse = data.args.lse;
  b.lse_stride = data.args.lse_stride;
  b.dq = b.dk = b.dv = data.args.o;
  b.d_sinks = sinks_grad;
  ASSERT_LE(data.args.shape.heads, 4);
  attention_backward(b);
  for (int64_t h = 0; h < data.args.shape.heads; ++h) EXPECT_EQ(sinks_grad[h], 0.0f) << h;
}

// Input views may use any strides: negative, zero (broadcast) and overlapping
// ones read the same elements as a dense copy and give bitwise the same O.
TEST(BadInput, InputStridesNegativeZeroAndOverlappingAreRead) {
  Case c = small_case();
  c.kv_heads = 1;
  c.heads = 2;
  const int64_t d = c.head_dim, n = c.seqlen_k;
  CaseData dense(c);
  dense.args.threads = 1;
  // V: batch 1 repeats batch 0, so a zero batch stride reads the same values.
  for (int64_t i = 0; i < n * d; ++i) dense.v32[size_t(n * d + i)] = dense.v32[size_t(i)];
  // Q: one array read through rows that overlap (row r starts at element r).
  std::vector<float> sliding(size_t(c.batch * c.heads * c.seqlen_q + d + 8));
  for (size_t i = 0; i < sliding.size(); ++i) sliding[i] = float(int(i % 7) - 3) / 4.0f;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t r = 0; r < c.seqlen_q; ++r)
        for (int64_t x = 0; x < d; ++x)
          dense.q32[size_t(((b * c.heads + h) * c.seqlen_q + r) * d + x)] =
              sliding[size_t((b * c.heads + h) * c.seqlen_q + r + x)];
  CaseData view = dense;  // same values; pointers below are set to its own buffers
  attention_forward(dense.args);

  // K: rows stored in reverse order, read with a negative row stride.
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t x = 0; x < d; ++x)
        view.k32[size_t((b * n + (n - 1 - j)) * d + x)] = dense.k32[size_t((b * n + j) * d + x)];
  view.args.k.data = view.k32.data() + (n - 1) * d;
  view.args.k.stride = {n * d, 0, -d, 1};
  view.args.v.data = view.v32.data();
  view.args.v.stride[0] = 0;
  view.args.q.data = sliding.data();
  view.args.q.stride = {c.heads * c.seqlen_q, c.seqlen_q, 1, 1};
  view.args.o.data = view.o32.data();
  view.args.lse = view.lse.data();
  attention_forward(view.args);
  EXPECT_EQ(view.o32, dense.o32);
  EXPECT_EQ(view.lse, dense.lse);
}

}  // namespace
}  // namespace tileattn::reliability
