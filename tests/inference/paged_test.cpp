// A paged cache (pages in random order, any page size) gives the same cache
// contents and the same attention as a contiguous one.
#include <gtest/gtest.h>

#include "decode_fixture.hpp"

namespace tileattn::kvtest {
namespace {

// Same spec contiguous and paged: outputs bitwise equal (the forward reads
// the same keys in the same order; only the address computation differs),
// paged cache rows equal the tokens, and the paged result passes the
// reference check on its own.
void expect_paged_equals_contiguous(DecodeSpec spec) {
  SCOPED_TRACE(spec.name());
  const int64_t page_size = spec.page_size;
  spec.page_size = 0;
  DecodeRun contiguous(spec);
  contiguous.prefill();
  contiguous.decode();
  spec.page_size = page_size;
  DecodeRun paged(spec);
  paged.prefill();
  paged.decode();

  EXPECT_EQ(paged.seqlens, contiguous.seqlens);
  EXPECT_EQ(paged.o.bytes(), contiguous.o.bytes()) << "paged output differs from contiguous";
  EXPECT_EQ(paged.lse, contiguous.lse);
  for (int64_t b = 0; b < paged.batch; ++b)
    for (int64_t h = 0; h < spec.kv_heads; ++h)
      for (int64_t j = 0; j < paged.seqlens[size_t(b)]; ++j)
        for (int64_t c = 0; c < spec.head_dim; ++c) {
          ASSERT_EQ(paged.cache_k(b, h, j, c), contiguous.cache_k(b, h, j, c)) << "b" << b << " j" << j;
          ASSERT_EQ(paged.cache_v(b, h, j, c), contiguous.cache_v(b, h, j, c)) << "b" << b << " j" << j;
        }
  Buffer unused;
  std::vector<int32_t> lengths;
  const ForwardArgs full = paged.full_sequence_args(unused, lengths);
  const Check c = check_against_reference(
      full, paged.o, bhsd(paged.batch, spec.heads, spec.new_tokens, spec.head_dim), paged.lse.data());
  EXPECT_TRUE(c.ok()) << c.describe();
}

TEST(PagedCache, PageSizesAndBoundaryCrossingAppends) {
  for (int64_t page_size : {1, 16, 64})
    for (int32_t cached : {0, 15, 16, 17, 63, 130})
      for (int64_t n : {1, 3, 17}) {
        DecodeSpec spec;
        spec.page_size = page_size;
        spec.cached = {cached};
        spec.new_tokens = n;
        spec.seed = uint64_t(page_size * 1000 + cached * 10 + n);
        expect_paged_equals_contiguous(spec);
      }
}

TEST(PagedCache, BatchGqaWindowAndHalfPrecision) {
  DecodeSpec spec;
  spec.page_size = 16;
  spec.cached = {5, 31, 0, 64};
  spec.new_tokens = 3;
  spec.heads = 8;
  spec.kv_heads = 2;
  expect_paged_equals_contiguous(spec);
  spec.window_left = 20;
  spec.dtype = DType::bf16;
  expect_paged_equals_contiguous(spec);
  spec.dtype = DType::f16;
  spec.page_size = 7;
  expect_paged_equals_contiguous(spec);
}

// Decode on small pages walks several KV heads per work item, a key tile at
// a time (plan_forward): batches of few sequences, long caches split across
// items, GQA groups and a multi-token step of up to 8 stacked rows, on the
// AVX2 and portable paths.
TEST(PagedCache, DecodeWalkingEveryKvHeadOfAPage) {
  for (Isa isa : {Isa::automatic, Isa::generic}) {
    DecodeSpec spec;
    spec.isa = isa;
    spec.page_size = 16;
    spec.heads = 32;
    spec.kv_heads = 8;
    spec.cached = {5, 40, 0, 100};  // 4 items of 4 KV heads
    expect_paged_equals_contiguous(spec);
    spec.new_tokens = 2;  // 8 stacked rows per KV head
    spec.dtype = DType::f16;
    spec.page_size = 7;
    expect_paged_equals_contiguous(spec);
    spec.new_tokens = 1;
    spec.heads = 8;
    spec.kv_heads = 4;
    spec.cached = {4100};  // 8 key splits of all 4 KV heads
    spec.dtype = DType::bf16;
    spec.page_size = 16;
    expect_paged_equals_contiguous(spec);
  }
}

// A generation loop: many appends of different sizes that start and end at
// every offset within a page.
TEST(PagedCache, RepeatedAppendsAcrossPages) {
  for (int64_t page_size : {1, 5, 16}) {
    DecodeSpec spec;
    spec.page_size = page_size;
    spec.cached = {0, 0};
    spec.new_tokens = 40;
    DecodeRun run(spec);
    const int64_t chunks[] = {1, 3, 17, 2, 1, 16};
    int64_t done = 0;
    for (int64_t chunk : chunks) {
      KvCacheArgs a = run.args;
      a.seqlen_new = chunk;
      a.k_new = {static_cast<char*>(run.k_new.data()) + done * run.new_stride[2] * 4, run.new_stride};
      a.v_new = {static_cast<char*>(run.v_new.data()) + done * run.new_stride[2] * 4, run.new_stride};
      kv_cache_append(a);
      done += chunk;
      ASSERT_EQ(run.seqlens[0], done);
      ASSERT_EQ(run.seqlens[1], done);
    }
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < spec.kv_heads; ++h)
        for (int64_t j = 0; j < done; ++j)
          for (int64_t c = 0; c < spec.head_dim; ++c) {
            const int64_t full = ((b * spec.kv_heads + h) * run.max_len + j) * spec.head_dim + c;
            ASSERT_EQ(run.cache_k(b, h, j, c), run.k_full.get(full)) << "page " << page_size << " j" << j;
            ASSERT_EQ(run.cache_v(b, h, j, c), run.v_full.get(full)) << "page " << page_size << " j" << j;
          }
    // Attend the 40 queries to the 40 cached tokens (no append).
    attention_with_kvcache(run.args);
    Buffer unused;
    std::vector<int32_t> lengths;
    const ForwardArgs full = run.full_sequence_args(unused, lengths);
    const Check c = check_against_reference(full, run.o, bhsd(2, spec.heads, 40, spec.head_dim), run.lse.data());
    EXPECT_TRUE(c.ok()) << "page " << page_size << ": " << c.describe();
  }
}

// Sequences may share read-only prefix pages (prefix caching) as long as no
// append writes into a shared page.
TEST(PagedCache, SharedPrefixPagesAreReadable) {
  DecodeSpec spec;
  spec.page_size = 16;
  spec.cached = {32, 32};
  spec.new_tokens = 1;
  DecodeRun run(spec);
  run.prefill();
  // Point sequence 1's first two pages at sequence 0's: both now read
  // sequence 0's 32-token prefix, and each appends to its own third page.
  run.block_table[size_t(run.args.block_table_stride) + 0] = run.block_table[0];
  run.block_table[size_t(run.args.block_table_stride) + 1] = run.block_table[1];
  run.decode();
  EXPECT_EQ(run.seqlens[0], 33);
  EXPECT_EQ(run.seqlens[1], 33);
  for (int64_t c = 0; c < spec.head_dim; ++c) EXPECT_EQ(run.cache_k(1, 0, 5, c), run.cache_k(0, 0, 5, c));
}

}  // namespace
}  // namespace tileattn::kvtest
