// cache_batch_idx and cache_leftpad (FlashAttention-2's): a decode step on a
// cache whose rows are permuted and left-padded gives exactly the result of
// the same step on a plain cache, appends into the named rows after the pad,
// and bad indices are refused before anything is written.
#include <gtest/gtest.h>

#include <functional>

#include "decode_fixture.hpp"

namespace tileattn::kvtest {
namespace {

// The plain run's prefilled cache re-laid: sequence b in cache row row_of[b]
// of a cache with `rows` rows, its tokens starting at row pad[b]; every other
// element holds 1e3 (a value that would show if it were read).
struct PermutedCache {
  Buffer k, v;
  std::vector<int32_t> seqlens;  // pad[b] + plain length: FlashAttention-2's end rows
  std::array<int64_t, 4> stride{};
  PermutedCache(const DecodeRun& plain, int64_t rows, const std::vector<int32_t>& row_of,
                const std::vector<int32_t>& pad) {
    const DecodeSpec& s = plain.spec;
    const int64_t capacity = plain.capacity + 16;
    k = Buffer(s.dtype, rows * s.kv_heads * capacity * s.head_dim);
    v = Buffer(s.dtype, k.elements());
    for (int64_t i = 0; i < k.elements(); ++i) k.set(i, 1e3f), v.set(i, 1e3f);
    stride = bhsd(rows, s.kv_heads, capacity, s.head_dim);
    for (int64_t b = 0; b < plain.batch; ++b) {
      seqlens.push_back(pad[size_t(b)] + plain.seqlens[size_t(b)]);
      for (int64_t h = 0; h < s.kv_heads; ++h)
        for (int64_t j = 0; j < plain.seqlens[size_t(b)]; ++j)
          for (int64_t c = 0; c < s.head_dim; ++c) {
            const int64_t at = row_of[size_t(b)] * stride[0] + h * stride[1] + (pad[size_t(b)] + j) * stride[2] + c;
            k.set(at, plain.cache_k(b, h, j, c));
            v.set(at, plain.cache_v(b, h, j, c));
          }
    }
  }
};

struct Case {
  DecodeSpec spec;
  std::vector<int32_t> row_of, pad;
  int64_t rows = 0;
};

void expect_same_as_plain(const Case& c) {
  SCOPED_TRACE(c.spec.name());
  DecodeRun plain(c.spec);
  plain.prefill();
  PermutedCache permuted(plain, c.rows, c.row_of, c.pad);
  plain.decode();

  Buffer o(c.spec.dtype, plain.o.elements());
  std::vector<float> lse(plain.lse.size());
  KvCacheArgs a = plain.args;
  a.o = {o.data(), a.o.stride};
  a.lse = lse.data();
  a.k_cache = {permuted.k.data(), permuted.stride};
  a.v_cache = {permuted.v.data(), permuted.stride};
  a.capacity = permuted.stride[1] / c.spec.head_dim;
  a.cache_seqlens = permuted.seqlens.data();
  a.cache_batch_idx = c.row_of.data();
  a.cache_batch = c.rows;
  a.cache_leftpad = c.pad.data();
  a.seqlen_new = c.spec.new_tokens;
  a.k_new = {plain.k_new.data(), plain.new_stride};
  a.v_new = {plain.v_new.data(), plain.v_new_stride};
  const std::vector<int32_t> before = permuted.seqlens;
  attention_with_kvcache(a);

  // The same tiles relative to each sequence's first key: the same operations, bit for bit.
  for (int64_t i = 0; i < o.elements(); ++i) ASSERT_EQ(o.get(i), plain.o.get(i)) << "o element " << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_EQ(lse[i], plain.lse[i]) << "lse element " << i;
  for (int64_t b = 0; b < plain.batch; ++b) {
    ASSERT_EQ(permuted.seqlens[size_t(b)], before[size_t(b)] + c.spec.new_tokens);
    for (int64_t h = 0; h < c.spec.kv_heads; ++h)
      for (int64_t t = 0; t < plain.seqlens[size_t(b)]; ++t)
        for (int64_t e = 0; e < c.spec.head_dim; ++e) {
          const int64_t at = c.row_of[size_t(b)] * permuted.stride[0] + h * permuted.stride[1] +
                             (c.pad[size_t(b)] + t) * permuted.stride[2] + e;
          ASSERT_EQ(permuted.k.get(at), plain.cache_k(b, h, t, e)) << "k b" << b << " row " << t;
          ASSERT_EQ(permuted.v.get(at), plain.cache_v(b, h, t, e)) << "v b" << b << " row " << t;
        }
  }
}

TEST(CacheBatchIndex, PermutedRowsAndLeftPaddingEqualThePlainCache) {
  Case c;
  c.spec.cached = {10, 37, 4};
  c.spec.new_tokens = 2;
  c.row_of = {3, 0, 1};
  c.pad = {5, 0, 11};
  c.rows = 5;
  expect_same_as_plain(c);
  c.spec.window_left = 6;  // windows and ALiBi align to the sequence without its pad
  c.spec.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  expect_same_as_plain(c);
  c.spec.window_left = -1;
  c.spec.alibi_slopes.clear();
  c.spec.causal = false;
  c.spec.dtype = DType::bf16;
  c.spec.cached = {600, 3, 1100};  // long enough for split-KV decode
  c.spec.new_tokens = 1;
  expect_same_as_plain(c);
}

using Edit = std::function<void(KvCacheArgs&, std::vector<int32_t>&, std::vector<int32_t>&)>;

// A failed call leaves the cache and cache_seqlens as they were.
void expect_refused(const Edit& edit, const std::string& needle, bool is_not_supported = false) {
  DecodeSpec spec;
  spec.cached = {10, 20};
  spec.new_tokens = 3;
  DecodeRun run(spec);
  run.prefill();
  std::vector<int32_t> rows{1, 0}, pad{0, 0};
  KvCacheArgs a = run.args;
  a.seqlen_new = spec.new_tokens;
  a.k_new = {run.k_new.data(), run.new_stride};
  a.v_new = {run.v_new.data(), run.v_new_stride};
  a.cache_batch_idx = rows.data();
  a.cache_leftpad = pad.data();
  edit(a, rows, pad);
  const auto k = run.k_cache.bytes(), v = run.v_cache.bytes();
  const auto lengths = run.seqlens;
  try {
    attention_with_kvcache(a);
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const NotSupported& e) {
    EXPECT_TRUE(is_not_supported) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  } catch (const Error& e) {
    EXPECT_FALSE(is_not_supported) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_TRUE(run.k_cache.bytes() == k && run.v_cache.bytes() == v) << "the cache changed (" << needle << ")";
  EXPECT_EQ(run.seqlens, lengths);
}

TEST(CacheBatchIndex, BadInputIsRefusedAndNothingIsWritten) {
  expect_refused([](KvCacheArgs&, std::vector<int32_t>& rows, std::vector<int32_t>&) { rows[0] = 2; },
                 "cache_batch_idx[0] = 2 is out of range 0..1");
  expect_refused([](KvCacheArgs&, std::vector<int32_t>& rows, std::vector<int32_t>&) { rows[1] = -1; },
                 "cache_batch_idx[1] = -1");
  expect_refused([](KvCacheArgs&, std::vector<int32_t>& rows, std::vector<int32_t>&) { rows = {1, 1}; },
                 "sequences 0 and 1 both append to cache row 1");
  expect_refused([](KvCacheArgs&, std::vector<int32_t>&, std::vector<int32_t>& pad) { pad[1] = 21; },
                 "cache_leftpad[1] = 21 must be in 0..cache_seqlens[1] (20)");
  expect_refused([](KvCacheArgs&, std::vector<int32_t>&, std::vector<int32_t>& pad) { pad[0] = -3; },
                 "cache_leftpad[0] = -3");
  expect_refused([](KvCacheArgs& a, std::vector<int32_t>&, std::vector<int32_t>&) { a.cache_batch = -1; },
                 "cache_batch must be >= 0");
  static int32_t table[2] = {0, 1};
  expect_refused([](KvCacheArgs& a, std::vector<int32_t>&, std::vector<int32_t>&) {
    a.block_table = table;
    a.block_table_stride = 1;
    a.page_size = a.capacity;
    a.num_pages = 2;
  }, "not supported with block_table", true);
}

// Attending without appending may share a cache row between sequences.
TEST(CacheBatchIndex, SharedRowsAreFineWithoutAnAppend) {
  DecodeSpec spec;
  spec.cached = {10, 20};
  DecodeRun run(spec);
  run.prefill();
  std::vector<int32_t> rows{1, 1};
  KvCacheArgs a = run.args;
  a.cache_batch_idx = rows.data();
  std::vector<int32_t> lengths{20, 20};
  a.cache_seqlens = lengths.data();
  EXPECT_NO_THROW(attention_with_kvcache(a));
  EXPECT_EQ(lengths, (std::vector<int32_t>{20, 20}));
}

}  // namespace
}  // namespace tileattn::kvtest
