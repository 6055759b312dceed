// Inference through the C API: append + attend on contiguous and paged
// caches gives the same bits (cache, lengths, O, LSE) as the C++ API, and a
// rejected call leaves the cache as it was.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "inference/decode_fixture.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/tileattn.h"

namespace tileattn {
namespace {

constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kDim = 64, kNew = 3;

// One decode step's buffers; `paged` stores the cache as 8-row pages given to
// the sequences in scrambled order.
struct Decode {
  bool paged;
  int64_t capacity = 40, page_size = 8, pages_per_seq = 5;
  std::vector<float> k_cache, v_cache, q, o, lse, k_new, v_new;
  std::vector<int32_t> seqlens{17, 30}, block_table;

  explicit Decode(bool paged_cache) : paged(paged_cache) {
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto fill = [&](std::vector<float>& t, size_t n) {
      t.resize(n);
      for (float& x : t) x = u(rng);
    };
    fill(k_cache, size_t(kBatch * kKvHeads * capacity * kDim));
    fill(v_cache, k_cache.size());
    fill(q, size_t(kBatch * kHeads * kNew * kDim));
    fill(k_new, size_t(kBatch * kKvHeads * kNew * kDim));
    fill(v_new, k_new.size());
    o.assign(q.size(), 0.0f);
    lse.assign(size_t(kBatch * kHeads * kNew), 0.0f);
    for (int64_t i = 0; i < kBatch * pages_per_seq; ++i) block_table.push_back(int32_t((i * 7) % 10));
  }

  KvCacheArgs cpp_args() {
    KvCacheArgs a;
    a.batch = kBatch;
    a.heads = kHeads;
    a.kv_heads = kKvHeads;
    a.head_dim = kDim;
    a.seqlen_q = kNew;
    a.q = {q.data(), {kHeads * kNew * kDim, kNew * kDim, kDim, 1}};
    a.o = {o.data(), a.q.stride};
    a.lse = lse.data();
    a.lse_stride = {kHeads * kNew, kNew, 1};
    // Contiguous: [batch, kv_heads, capacity, dim]; paged: [10 pages, kv_heads, 8, dim].
    const std::array<int64_t, 4> cache_stride =
        paged ? std::array<int64_t, 4>{kKvHeads * page_size * kDim, page_size * kDim, kDim, 1}
              : std::array<int64_t, 4>{kKvHeads * capacity * kDim, capacity * kDim, kDim, 1};
    a.k_cache = {k_cache.data(), cache_stride};
    a.v_cache = {v_cache.data(), cache_stride};
    a.cache_seqlens = seqlens.data();
    if (paged) {
      a.block_table = block_table.data();
      a.block_table_stride = pages_per_seq;
      a.page_size = page_size;
      a.num_pages = kBatch * pages_per_seq;
    } else {
      a.capacity = capacity;
    }
    a.seqlen_new = kNew;
    a.k_new = {k_new.data(), {kKvHeads * kNew * kDim, kNew * kDim, kDim, 1}};
    a.v_new = {v_new.data(), a.k_new.stride};
    a.threads = 2;
    return a;
  }
};

void copy4(int64_t (&to)[4], const std::array<int64_t, 4>& from) {
  for (int i = 0; i < 4; ++i) to[i] = from[i];
}

tileattn_kv_cache_args to_c(const KvCacheArgs& a) {
  tileattn_kv_cache_args c;
  tileattn_kv_cache_args_init(&c);
  c.batch = a.batch;
  c.heads = a.heads;
  c.kv_heads = a.kv_heads;
  c.head_dim = a.head_dim;
  c.dtype = int32_t(a.dtype);
  c.seqlen_q = a.seqlen_q;
  c.q.data = a.q.data;
  copy4(c.q.stride, a.q.stride);
  c.o.data = a.o.data;
  copy4(c.o.stride, a.o.stride);
  c.lse = a.lse;
  for (int i = 0; i < 3; ++i) c.lse_stride[i] = a.lse_stride[i];
  c.k_cache.data = a.k_cache.data;
  copy4(c.k_cache.stride, a.k_cache.stride);
  c.v_cache.data = a.v_cache.data;
  copy4(c.v_cache.stride, a.v_cache.stride);
  c.capacity = a.capacity;
  c.cache_seqlens = a.cache_seqlens;
  c.block_table = a.block_table;
  c.block_table_stride = a.block_table_stride;
  c.page_size = a.page_size;
  c.num_pages = a.num_pages;
  c.seqlen_new = a.seqlen_new;
  c.k_new.data = a.k_new.data;
  copy4(c.k_new.stride, a.k_new.stride);
  c.v_new.data = a.v_new.data;
  copy4(c.v_new.stride, a.v_new.stride);
  c.causal = a.causal;
  c.window_left = a.window_left;
  c.window_right = a.window_right;
  c.scale = a.scale;
  c.softcap = a.softcap;
  c.alibi_slopes = a.alibi_slopes;
  c.alibi_batch_stride = a.alibi_batch_stride;
  c.sinks = a.sinks;
  c.cache_batch_idx = a.cache_batch_idx;
  c.cache_batch = a.cache_batch;
  c.cache_leftpad = a.cache_leftpad;
  c.rotary_fa2_query_positions = a.rotary_fa2_query_positions;
  c.threads = a.threads;
  c.kv_quant = int32_t(a.kv_quant);
  c.k_scale = a.k_scale;
  c.v_scale = a.v_scale;
  for (int i = 0; i < 3; ++i) c.k_scale_stride[i] = a.k_scale_stride[i], c.v_scale_stride[i] = a.v_scale_stride[i];
  c.v_head_dim = a.v_head_dim;
  c.fp32_output = a.fp32_output;
  return c;
}

// A quantized copy of a Decode's cache storage: int8 or fp8 bytes (zero:
// every cached value 0) and the scales (int8: zeros, written by appends;
// fp8: one per KV head).
struct QuantizedCache {
  std::vector<int8_t> k, v;
  std::vector<float> k_scale, v_scale;
  void attach(KvCacheArgs& a, KvQuant quant, const Decode& d) {
    k.assign(d.k_cache.size(), 0);
    v.assign(d.v_cache.size(), 0);
    const int64_t rows = d.paged ? d.page_size : d.capacity, outer = d.paged ? kBatch * d.pages_per_seq : kBatch;
    const bool int8 = quant == KvQuant::int8;
    k_scale.assign(size_t(int8 ? outer * kKvHeads * rows : kKvHeads), int8 ? 0.0f : 0.01f);
    v_scale.assign(k_scale.size(), int8 ? 0.0f : 0.02f);
    a.k_cache.data = k.data();
    a.v_cache.data = v.data();
    a.kv_quant = quant;
    a.k_scale = k_scale.data();
    a.v_scale = v_scale.data();
    a.k_scale_stride = a.v_scale_stride = {kKvHeads * rows, rows, 1};
  }
};

// MLA decode (K 576 wide, V 512, one KV head) through the appended
// v_head_dim: the same bits as C++ (cache, lengths, O, LSE), contiguous and paged.
TEST(CApiKvCache, MlaHeadDimsBitwiseEqualToCpp) {
  for (int64_t page_size : {0, 16}) {
    kvtest::DecodeSpec spec;
    spec.head_dim = 576;
    spec.v_head_dim = 512;
    spec.heads = 8;
    spec.kv_heads = 1;
    spec.cached = {40, 7};
    spec.page_size = page_size;
    spec.dtype = DType::bf16;
    SCOPED_TRACE(spec.name());
    kvtest::DecodeRun cpp(spec), via_c(spec);
    cpp.prefill();
    via_c.prefill();
    cpp.decode();
    const tileattn_kv_cache_args c = to_c(via_c.step_args());
    ASSERT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_OK) << tileattn_last_error();
    EXPECT_EQ(via_c.seqlens, cpp.seqlens);
    EXPECT_EQ(via_c.k_cache.bytes(), cpp.k_cache.bytes());
    EXPECT_EQ(via_c.v_cache.bytes(), cpp.v_cache.bytes());
    EXPECT_EQ(via_c.o.bytes(), cpp.o.bytes());
    EXPECT_EQ(via_c.lse, cpp.lse);
  }
}

TEST(CApiKvCache, InitGivesTheCppDefaults) {
  tileattn_kv_cache_args c;
  ASSERT_EQ(tileattn_kv_cache_args_init(&c), TILEATTN_OK);
  const KvCacheArgs defaults;
  EXPECT_EQ(c.causal, int32_t(defaults.causal));
  EXPECT_EQ(c.window_left, defaults.window_left);
  EXPECT_TRUE(std::isnan(c.scale));
  EXPECT_EQ(c.block_table, nullptr);
}

// fp32_output reaches the kernel: a bf16 decode step writes the C++ call's
// fp32 O bit for bit through the C struct.
TEST(CApiKvCache, Fp32OutputBitwiseEqualToCpp) {
  kvtest::DecodeSpec spec;
  spec.dtype = DType::bf16;
  spec.cached = {700, 90};
  spec.new_tokens = 2;
  kvtest::DecodeRun cpp(spec), via_c(spec);
  cpp.prefill();
  via_c.prefill();
  std::vector<float> o_cpp(size_t(cpp.o.elements())), o_c(o_cpp.size(), -1.0f);
  cpp.args.fp32_output = via_c.args.fp32_output = true;
  cpp.args.o.data = o_cpp.data();
  via_c.args.o.data = o_c.data();
  cpp.decode();
  const tileattn_kv_cache_args c = to_c(via_c.step_args());
  ASSERT_EQ(c.fp32_output, 1);
  ASSERT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(o_c, o_cpp);
  EXPECT_EQ(via_c.lse, cpp.lse);

  // The 4 bytes after fp32_output are a reserved field: nonzero is refused.
  static_assert(offsetof(tileattn_kv_cache_args, reserved5) + sizeof(int32_t) == sizeof(tileattn_kv_cache_args));
  tileattn_kv_cache_args bad = c;
  bad.reserved5 = 1;
  EXPECT_EQ(tileattn_attention_with_kvcache(&bad), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("reserved5"), std::string::npos) << tileattn_last_error();
}

TEST(CApiKvCache, AppendAndAttendBitwiseEqualToCpp) {
  for (bool paged : {false, true}) {
    SCOPED_TRACE(paged ? "paged" : "contiguous");
    Decode cpp(paged), via_c(paged);
    attention_with_kvcache(cpp.cpp_args());
    const tileattn_kv_cache_args c = to_c(via_c.cpp_args());
    ASSERT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_OK) << tileattn_last_error();
    EXPECT_EQ(via_c.seqlens, (std::vector<int32_t>{17 + kNew, 30 + kNew}));
    EXPECT_EQ(via_c.seqlens, cpp.seqlens);
    EXPECT_EQ(via_c.k_cache, cpp.k_cache);
    EXPECT_EQ(via_c.v_cache, cpp.v_cache);
    EXPECT_EQ(via_c.o, cpp.o);
    EXPECT_EQ(via_c.lse, cpp.lse);
  }
}

// The soft cap, ALiBi slopes and sinks reach the kernel through the C
// struct: same bits as C++, and not the unmodified result.
TEST(CApiKvCache, SoftcapBitwiseEqualToCpp) {
  for (bool paged : {false, true}) {
    SCOPED_TRACE(paged ? "paged" : "contiguous");
    Decode cpp(paged), via_c(paged), uncapped(paged);
    const std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f};
    const std::vector<float> sinks{1.5f, -0.5f, 3.0f, 0.25f};
    KvCacheArgs a = cpp.cpp_args();
    a.softcap = 0.3f;
    a.alibi_slopes = slopes.data();
    a.sinks = sinks.data();
    attention_with_kvcache(a);
    attention_with_kvcache(uncapped.cpp_args());
    KvCacheArgs b = via_c.cpp_args();
    b.softcap = 0.3f;
    b.alibi_slopes = slopes.data();
    b.sinks = sinks.data();
    const tileattn_kv_cache_args c = to_c(b);
    ASSERT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_OK) << tileattn_last_error();
    EXPECT_EQ(via_c.o, cpp.o);
    EXPECT_EQ(via_c.lse, cpp.lse);
    EXPECT_NE(cpp.o, uncapped.o);
  }
  Decode bad(false);
  KvCacheArgs a = bad.cpp_args();
  a.softcap = -1.0f;
  const tileattn_kv_cache_args c = to_c(a);
  EXPECT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("softcap"), std::string::npos) << tileattn_last_error();
}

// cache_batch_idx and cache_leftpad reach the kernel through the C struct:
// same bits as C++, and not the result without them; a bad index is refused.
TEST(CApiKvCache, BatchIndexAndLeftpadBitwiseEqualToCpp) {
  Decode cpp(false), via_c(false), plain(false);
  const std::vector<int32_t> rows{1, 0}, pad{3, 5};
  for (Decode* d : {&cpp, &via_c}) {
    KvCacheArgs a = d->cpp_args();
    a.cache_batch_idx = rows.data();
    a.cache_leftpad = pad.data();
    if (d == &cpp) {
      attention_with_kvcache(a);
    } else {
      const tileattn_kv_cache_args c = to_c(a);
      ASSERT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_OK) << tileattn_last_error();
    }
  }
  attention_with_kvcache(plain.cpp_args());
  EXPECT_EQ(via_c.o, cpp.o);
  EXPECT_EQ(via_c.lse, cpp.lse);
  EXPECT_EQ(via_c.k_cache, cpp.k_cache);
  EXPECT_NE(cpp.o, plain.o);
  Decode bad(false);
  const std::vector<int32_t> same{0, 0};
  KvCacheArgs a = bad.cpp_args();
  a.cache_batch_idx = same.data();
  const std::vector<float> k_before = bad.k_cache;
  const tileattn_kv_cache_args c = to_c(a);
  EXPECT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("cache_batch_idx"), std::string::npos) << tileattn_last_error();
  EXPECT_EQ(bad.k_cache, k_before);
}

// int8 and fp8 caches through the C struct's kv_quant / scale fields: the
// same cache bytes, scales, O and LSE as C++.
TEST(CApiKvCache, QuantizedCachesBitwiseEqualToCpp) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3})
    for (bool paged : {false, true}) {
      SCOPED_TRACE(std::string(kv_quant_name(quant)) + (paged ? " paged" : " contiguous"));
      Decode cpp(paged), via_c(paged);
      QuantizedCache cpp_cache, c_cache;
      KvCacheArgs a = cpp.cpp_args(), b = via_c.cpp_args();
      cpp_cache.attach(a, quant, cpp);
      c_cache.attach(b, quant, via_c);
      attention_with_kvcache(a);
      const tileattn_kv_cache_args c = to_c(b);
      ASSERT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_OK) << tileattn_last_error();
      EXPECT_EQ(c_cache.k, cpp_cache.k);
      EXPECT_EQ(c_cache.v, cpp_cache.v);
      EXPECT_EQ(c_cache.k_scale, cpp_cache.k_scale);
      EXPECT_EQ(via_c.o, cpp.o);
      EXPECT_EQ(via_c.lse, cpp.lse);
      EXPECT_NE(cpp_cache.k, std::vector<int8_t>(cpp_cache.k.size(), 0)) << "nothing was appended";
    }
  Decode bad(false);
  tileattn_kv_cache_args c = to_c(bad.cpp_args());
  c.kv_quant = 5;
  EXPECT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("kv_quant"), std::string::npos) << tileattn_last_error();
}

TEST(CApiKvCache, AppendOnlyThenAttend) {
  Decode cpp(true), via_c(true);
  kv_cache_append(cpp.cpp_args());
  tileattn_kv_cache_args c = to_c(via_c.cpp_args());
  ASSERT_EQ(tileattn_kv_cache_append(&c), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(via_c.seqlens, cpp.seqlens);
  EXPECT_EQ(via_c.k_cache, cpp.k_cache);
  EXPECT_EQ(via_c.o, std::vector<float>(via_c.o.size(), 0.0f)) << "append must not write O";
  // Attend to what is cached, without appending.
  KvCacheArgs attend = cpp.cpp_args();
  attend.seqlen_new = 0;
  attention_with_kvcache(attend);
  c.seqlen_new = 0;
  ASSERT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(via_c.o, cpp.o);
}

TEST(CApiKvCache, OverflowLeavesTheCacheAsItWas) {
  Decode d(false);
  d.seqlens = {17, 39};  // 39 + 3 new rows > capacity 40
  const std::vector<float> k_before = d.k_cache;
  tileattn_kv_cache_args c = to_c(d.cpp_args());
  EXPECT_EQ(tileattn_attention_with_kvcache(&c), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("capacity"), std::string::npos) << tileattn_last_error();
  EXPECT_EQ(d.seqlens, (std::vector<int32_t>{17, 39}));
  EXPECT_EQ(d.k_cache, k_before);
  EXPECT_EQ(d.o, std::vector<float>(d.o.size(), 0.0f));
  c.reserved1 = 1;
  EXPECT_EQ(tileattn_kv_cache_append(&c), TILEATTN_INVALID_ARGUMENT);
  EXPECT_EQ(tileattn_kv_cache_append(nullptr), TILEATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error(), "tileattn_kv_cache_append: args is null");
}

}  // namespace
}  // namespace tileattn
