// Bad input to the KV cache that tests/inference/kv_bad_input_test.cpp does
// not cover (several found by fuzz/fuzz_kv_cache.cpp): cache strides, dtype,
// head counts, sizes near INT64_MAX, and outputs or queries placed on the
// cache. Each is refused with an Error naming the argument, and the cache,
// cache_seqlens, o and lse keep every byte.
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "inference/decode_fixture.hpp"

namespace tileattn::kvtest {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

struct Snapshot {
  std::vector<uint8_t> k, v, o;
  std::vector<int32_t> seqlens, table;
  std::vector<float> lse;
  explicit Snapshot(const DecodeRun& r)
      : k(r.k_cache.bytes()), v(r.v_cache.bytes()), o(r.o.bytes()), seqlens(r.seqlens), table(r.block_table),
        lse(r.lse) {}
  bool operator==(const Snapshot&) const = default;
};

// A prefilled run whose decode step, after `corrupt` edits its arguments,
// must be refused by attention_with_kvcache (and kv_cache_append unless
// `attention_only`) with a message containing every needle.
void expect_refused(const DecodeSpec& spec, const std::function<void(KvCacheArgs&, DecodeRun&)>& corrupt,
                    const std::vector<std::string>& needles, bool attention_only = false) {
  for (bool append_only : {false, true}) {
    if (append_only && attention_only) continue;
    DecodeRun run(spec);
    run.prefill();
    for (int64_t i = 0; i < run.o.elements(); ++i) run.o.set(i, 42.0f);  // a partial write would show
    std::fill(run.lse.begin(), run.lse.end(), 42.0f);
    KvCacheArgs a = run.args;
    a.seqlen_new = spec.new_tokens;
    a.k_new = {run.k_new.data(), run.new_stride};
    a.v_new = {run.v_new.data(), run.new_stride};
    corrupt(a, run);
    const Snapshot before(run);
    const char* entry = append_only ? "kv_cache_append" : "attention_with_kvcache";
    try {
      if (append_only) kv_cache_append(a);
      else attention_with_kvcache(a);
      ADD_FAILURE() << entry << " accepted; expected an error mentioning '" << needles.front() << "'";
    } catch (const Error& e) {
      for (const std::string& needle : needles)
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << entry << ": message '" << e.what() << "' lacks '" << needle << "'";
    }
    EXPECT_TRUE(Snapshot(run) == before) << entry << ": the cache, cache_seqlens, o or lse changed ("
                                         << needles.front() << ")";
  }
}

DecodeSpec contiguous_spec() {
  DecodeSpec s;
  s.cached = {5, 9};
  s.new_tokens = 2;
  s.head_dim = 16;
  return s;
}

DecodeSpec paged_spec() {
  DecodeSpec s = contiguous_spec();
  s.page_size = 4;
  return s;
}

TEST(KvCacheHostile, CacheStridesZeroNegativeOrOverlapping) {
  for (const DecodeSpec& spec : {contiguous_spec(), paged_spec()}) {
    // Zero: every row of a head is one row.
    expect_refused(spec, [](KvCacheArgs& a, DecodeRun&) { a.k_cache.stride[2] = 0; }, {"k_cache", "stride"});
    // Negative: rows written backwards from the pointer, below the buffer.
    expect_refused(spec, [](KvCacheArgs& a, DecodeRun&) { a.v_cache.stride[3] = -1; }, {"v_cache", "stride"});
    // Overlapping: rows of 16 elements, 8 apart.
    expect_refused(spec, [](KvCacheArgs& a, DecodeRun&) { a.k_cache.stride[2] = 8; }, {"k_cache", "overlap"});
  }
}

TEST(KvCacheHostile, DtypeAndHeadCounts) {
  const DecodeSpec spec = contiguous_spec();
  expect_refused(spec, [](KvCacheArgs& a, DecodeRun&) { a.dtype = static_cast<DType>(7); },
                 {"dtype", "fp32, fp16 or bf16"});
  expect_refused(spec, [](KvCacheArgs& a, DecodeRun&) { a.batch = -1; }, {"batch", ">= 0"});
  expect_refused(spec, [](KvCacheArgs& a, DecodeRun&) { a.kv_heads = 0; }, {"kv_heads", ">= 1"});
  expect_refused(spec, [](KvCacheArgs& a, DecodeRun&) { a.head_dim = 0; }, {"head_dim", "1..576"});
  expect_refused(spec, [](KvCacheArgs& a, DecodeRun&) { a.heads = 0; }, {"heads", ">= 1"}, true);
  expect_refused(spec, [](KvCacheArgs& a, DecodeRun&) { a.seqlen_new = -1; }, {"seqlen_new", ">= 0"});
}

// Sizes whose arithmetic would overflow int64 before the fixes in
// kv_validate.cpp (seqlen_new + cache_seqlens, pages for a page size near
// INT64_MAX) and the capacity's size product.
TEST(KvCacheHostile, SizesNearInt64Max) {
  expect_refused(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.seqlen_new = kInt64Max; },
                 {"appending", "overflows int32"});
  expect_refused(paged_spec(), [](KvCacheArgs& a, DecodeRun&) { a.seqlen_new = kInt64Max - 3; },
                 {"appending", "overflows int32"});
  expect_refused(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.capacity = int64_t{1} << 62; },
                 {"k_cache", "overflow"});
  expect_refused(paged_spec(), [](KvCacheArgs& a, DecodeRun&) { a.page_size = kInt64Max; }, {"k_cache", "overflow"});
  expect_refused(paged_spec(), [](KvCacheArgs& a, DecodeRun&) { a.num_pages = kInt64Max; }, {"k_cache", "overflow"});
}

// An empty cache: no key is read, so the forward's own overlap checks (which
// look at the keys it reads) pass; the cache's rows are still storage the
// append fills, and o, lse or (for an append) q on them is refused.
TEST(KvCacheHostile, OutputsOnTheUnusedRowsOfTheCache) {
  DecodeSpec spec = contiguous_spec();
  spec.cached = {0, 0};
  for (const DecodeSpec& s : {spec, [&] { DecodeSpec p = spec; p.page_size = 4; return p; }()}) {
    auto on_cache = [](DecodeRun& r, int64_t element) {
      return static_cast<char*>(r.k_cache.data()) + element * int64_t(dtype_size(r.spec.dtype));
    };
    expect_refused(s, [&](KvCacheArgs& a, DecodeRun& r) {
      a.seqlen_new = 0;  // nothing appended: no key to read
      a.o.data = on_cache(r, 0);
    }, {"o: output overlaps input k_cache"}, true);
    expect_refused(s, [&](KvCacheArgs& a, DecodeRun& r) {
      a.seqlen_new = 0;
      a.lse = reinterpret_cast<float*>(on_cache(r, 16));
    }, {"lse: output overlaps input k_cache"}, true);
    // With new tokens, q placed on the cache rows this call writes.
    expect_refused(s, [&](KvCacheArgs& a, DecodeRun& r) {
      a.q.data = on_cache(r, 0);
    }, {"q: overlaps k_cache, which this call appends to"}, true);
  }
}

// The new keys and values are inputs: o or lse on top of them is refused
// (and, as for every refusal here, nothing is written).
TEST(KvCacheHostile, OutputsOnTheNewKeysOrValues) {
  for (const DecodeSpec& s : {contiguous_spec(), [] { DecodeSpec p = contiguous_spec(); p.page_size = 4; return p; }()}) {
    expect_refused(s, [](KvCacheArgs& a, DecodeRun&) { a.o.data = const_cast<void*>(a.k_new.data); },
                   {"o: output overlaps input k_new"}, true);
    expect_refused(s, [](KvCacheArgs& a, DecodeRun&) {
      a.lse = static_cast<float*>(const_cast<void*>(a.v_new.data));
    }, {"lse: output overlaps input v_new"}, true);
  }
}

// dense_strides is the public helper callers size caches with: sizes whose
// strides overflow int64 are an Error, not a wrapped (undefined) product.
TEST(KvCacheHostile, DenseStridesOfImpossibleSizes) {
  for (Layout layout : {Layout::bhsd, Layout::bshd}) {
    try {
      dense_strides(layout, 1, int64_t{1} << 40, int64_t{1} << 40, 256);
      ADD_FAILURE() << "dense_strides accepted 2^40 x 2^40 x 256";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dense_strides"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("overflows int64"), std::string::npos) << e.what();
    }
  }
  const auto s = dense_strides(Layout::bshd, 2, 3, 5, 7);
  EXPECT_EQ(s, (std::array<int64_t, 4>{105, 7, 21, 1}));
}

}  // namespace
}  // namespace tileattn::kvtest
