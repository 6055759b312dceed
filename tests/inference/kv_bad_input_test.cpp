// Bad input to the KV cache: a clear Error naming the argument, and the
// cache, cache_seqlens and outputs exactly as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

#include "decode_fixture.hpp"

namespace tileattn::kvtest {
namespace {

// Everything a failed call must leave alone.
struct Snapshot {
  std::vector<uint8_t> k, v, o, scales;  // scales: the bytes of a quantized cache's k_scale, v_scale
  std::vector<int32_t> seqlens;
  std::vector<float> lse;
  explicit Snapshot(const DecodeRun& r)
      : k(r.k_cache.bytes()), v(r.v_cache.bytes()), o(r.o.bytes()), seqlens(r.seqlens), lse(r.lse) {
    for (const std::vector<float>* s : {&r.k_scale, &r.v_scale}) {
      const auto* p = reinterpret_cast<const uint8_t*>(s->data());
      scales.insert(scales.end(), p, p + s->size() * sizeof(float));
    }
  }
  bool operator==(const Snapshot&) const = default;
};

// A prefilled run whose decode step (through `call`, after `corrupt`
// edits the arguments) must throw an Error whose message contains `needle`.
void expect_rejected(DecodeSpec spec, const std::function<void(KvCacheArgs&, DecodeRun&)>& corrupt,
                     const std::string& needle, bool append_only = false) {
  DecodeRun run(spec);
  run.prefill();
  // Fill the outputs with a pattern so that a partial write would show.
  for (int64_t i = 0; i < run.o.elements(); ++i) run.o.set(i, 42.0f);
  KvCacheArgs a = run.args;
  a.seqlen_new = spec.new_tokens;
  a.k_new = {run.k_new.data(), run.new_stride};
  a.v_new = {run.v_new.data(), run.v_new_stride};
  corrupt(a, run);
  const Snapshot before(run);  // after `corrupt`, which may edit cache_seqlens or the table
  try {
    if (append_only) kv_cache_append(a);
    else attention_with_kvcache(a);
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  }
  EXPECT_TRUE(Snapshot(run) == before) << "the cache, cache_seqlens or outputs changed (" << needle << ")";
}

DecodeSpec contiguous_spec() {
  DecodeSpec s;
  s.cached = {10, 20};
  s.new_tokens = 3;
  return s;
}

DecodeSpec paged_spec() {
  DecodeSpec s = contiguous_spec();
  s.page_size = 4;
  return s;
}

TEST(KvCacheBadInput, AppendPastCapacity) {
  for (bool append_only : {false, true}) {
    expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.capacity = 22; },
                    "overflows the cache capacity", append_only);
  }
  // cache_seqlens already past capacity.
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun& r) { r.seqlens[1] = int32_t(a.capacity) + 1; },
                  "cache_seqlens[1]");
}

TEST(KvCacheBadInput, AppendPastThePagesOfTheBlockTable) {
  for (bool append_only : {false, true})
    expect_rejected(paged_spec(), [](KvCacheArgs& a, DecodeRun&) { a.block_table_stride = 5; },  // 20 tokens
                    "block_table: sequence 1 needs 6 pages", append_only);
}

TEST(KvCacheBadInput, PageIndexOutOfRange) {
  // Entry 5 of sequence 1 is the page the append writes into.
  expect_rejected(paged_spec(), [](KvCacheArgs& a, DecodeRun& r) {
    r.block_table[size_t(a.block_table_stride + 5)] = int32_t(a.num_pages);
  }, "block_table[1, 5]");
  expect_rejected(paged_spec(), [](KvCacheArgs& a, DecodeRun& r) {
    r.block_table[size_t(a.block_table_stride + 0)] = -3;
  }, "block_table[1, 0] = -3 is out of range");
  expect_rejected(paged_spec(), [](KvCacheArgs& a, DecodeRun&) { a.num_pages = 3; }, "out of range");
}

TEST(KvCacheBadInput, AppendIntoAPageAnotherSequenceUses) {
  // Sequence 0 (10 tokens) writes into its entry 2; make sequence 1 read it too.
  expect_rejected(paged_spec(), [](KvCacheArgs& a, DecodeRun& r) {
    r.block_table[size_t(a.block_table_stride + 1)] = r.block_table[2];
  }, "receives new tokens of sequence 0");
  // The same page twice in one sequence's table, once as a written entry.
  expect_rejected(paged_spec(), [](KvCacheArgs& a, DecodeRun& r) {
    r.block_table[size_t(a.block_table_stride + 5)] = r.block_table[size_t(a.block_table_stride + 0)];
  }, "receives new tokens of sequence 1");
}

TEST(KvCacheBadInput, NewTokenArguments) {
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.k_new.data = nullptr; }, "k_new");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.v_new.data = nullptr; }, "v_new");
  static const int32_t too_many[2] = {1, 4};
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.new_counts = too_many; }, "new_counts[1]");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.k_new = {a.k_cache.data, a.k_cache.stride}; },
                  "k_new: overlaps k_cache");
}

TEST(KvCacheBadInput, CacheDescription) {
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.cache_seqlens = nullptr; }, "cache_seqlens");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun& r) { r.seqlens[0] = -1; (void)a; },
                  "cache_seqlens[0] must be >= 0");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.v_cache = a.k_cache; }, "v_cache: overlaps k_cache");
  expect_rejected(paged_spec(), [](KvCacheArgs& a, DecodeRun&) { a.page_size = 0; }, "page_size");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.head_dim = 600; }, "head_dim must be in 1..576");
}

// V's head dim out of range, or left at 0 (V as wide as K) with a 576-wide
// K; and a V cache or new V laid out for another width than v_head_dim.
TEST(KvCacheBadInput, ValueHeadDim) {
  DecodeSpec mla = contiguous_spec();
  mla.head_dim = 576;
  mla.v_head_dim = 512;
  mla.kv_heads = 1;
  for (DecodeSpec spec : {mla, paged_spec()}) {
    expect_rejected(spec, [](KvCacheArgs& a, DecodeRun&) { a.v_head_dim = 513; }, "v_head_dim must be in 1..512");
    expect_rejected(spec, [](KvCacheArgs& a, DecodeRun&) { a.v_head_dim = -2; }, "v_head_dim must be in 1..512");
  }
  expect_rejected(mla, [](KvCacheArgs& a, DecodeRun&) { a.v_head_dim = 0; }, "v_head_dim: V's head dim is head_dim (576)");
  expect_rejected(mla, [](KvCacheArgs& a, DecodeRun&) { a.v_head_dim = 0; }, "v_head_dim: V's head dim", true);
  // A V cache laid out with rows 32 wide, described as 48 wide: its rows overlap.
  DecodeSpec narrow_v = contiguous_spec();
  narrow_v.v_head_dim = 32;
  expect_rejected(narrow_v, [](KvCacheArgs& a, DecodeRun&) { a.v_head_dim = 48; }, "v_cache: output strides overlap");
}

// A non-finite sink: an error naming it, and neither the append nor the
// attention happens (the cache, cache_seqlens and outputs stay as they were).
TEST(KvCacheBadInput, NonFiniteSink) {
  for (DecodeSpec spec : {contiguous_spec(), paged_spec()}) {
    spec.sinks.assign(size_t(spec.heads), 1.0f);
    spec.sinks[3] = std::numeric_limits<float>::infinity();
    expect_rejected(spec, [](KvCacheArgs&, DecodeRun&) {}, "sinks[3] must be finite");
  }
}

TEST(KvCacheBadInput, RotaryTables) {
  DecodeSpec spec = contiguous_spec();
  spec.rotary_dim = 16;
  expect_rejected(spec, [](KvCacheArgs& a, DecodeRun&) { a.rotary_positions = 22; },
                  "rotary_cos: new keys of sequence 1 reach position 22");
  expect_rejected(spec, [](KvCacheArgs& a, DecodeRun&) { a.rotary_dim = 15; }, "rotary_dim");
  expect_rejected(spec, [](KvCacheArgs& a, DecodeRun&) { a.rotary_dim = 66; }, "rotary_dim");
  expect_rejected(spec, [](KvCacheArgs& a, DecodeRun&) { a.rotary_sin = nullptr; }, "rotary_sin");
  // A rotary size without either table would rotate nothing, silently: refused by the attention and by
  // the append alone.
  for (bool append_only : {false, true})
    expect_rejected(spec, [](KvCacheArgs& a, DecodeRun&) { a.rotary_cos = a.rotary_sin = nullptr; },
                    "rotary_dim / rotary_positions: set (16, ", append_only);
  // More queries than tokens: the first query would sit before position 0.
  expect_rejected(spec, [](KvCacheArgs& a, DecodeRun& r) {
    a.seqlen_q = 2;
    a.seqlen_new = 0;
    r.seqlens[0] = 1;
  }, "query position must be >= 0");
}

// Failures found only by the attention's own validation still happen before
// the append writes anything.
TEST(KvCacheBadInput, AttentionArgumentsCheckedBeforeTheAppend) {
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.q.data = nullptr; }, "q: data is null");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.heads = 3; }, "kv_heads (2) must divide heads (3)");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.o = {a.k_cache.data, a.o.stride}; },
                  "o: output overlaps input k_cache");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.lse = static_cast<float*>(a.v_cache.data); },
                  "lse: output overlaps input v_cache");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.window_left = -7; }, "window_left");
  expect_rejected(contiguous_spec(), [](KvCacheArgs& a, DecodeRun&) { a.scale = INFINITY; }, "scale");
}

// cache_seqlens, which the call writes after O and LSE, and the index arrays
// the attention reads as it runs (block_table here) may not lie under O or LSE.
TEST(KvCacheBadInput, IndexArraysUnderTheOutputs) {
  expect_rejected(contiguous_spec(),
                  [](KvCacheArgs& a, DecodeRun& r) {
                    auto* inside = static_cast<int32_t*>(a.o.data) + 4;
                    std::memcpy(inside, r.seqlens.data(), r.seqlens.size() * sizeof(int32_t));
                    a.cache_seqlens = inside;
                  },
                  "o: output overlaps cache_seqlens, which this call also writes");
  expect_rejected(contiguous_spec(),
                  [](KvCacheArgs& a, DecodeRun& r) {
                    auto* inside = reinterpret_cast<int32_t*>(a.lse) + 1;
                    std::memcpy(inside, r.seqlens.data(), r.seqlens.size() * sizeof(int32_t));
                    a.cache_seqlens = inside;
                  },
                  "lse: output overlaps cache_seqlens, which this call also writes");
  expect_rejected(paged_spec(),
                  [](KvCacheArgs& a, DecodeRun& r) {
                    ASSERT_LE(r.block_table.size() + 1, r.lse.size());
                    auto* inside = reinterpret_cast<int32_t*>(a.lse) + 1;
                    std::memcpy(inside, r.block_table.data(), r.block_table.size() * sizeof(int32_t));
                    a.block_table = inside;
                  },
                  "lse: overlaps input block_table");
}

// What an appending call reads or advances besides the new rows may not lie
// in the cache it writes: the append would change it before it is read
// (sinks, ALiBi slopes, rotary tables) or the final write of cache_seqlens
// would land in the cache.
TEST(KvCacheBadInput, ArgumentsInsideTheCacheTheCallWrites) {
  for (int64_t page : {int64_t{0}, int64_t{4}})
    for (bool append_only : {false, true}) {
      DecodeSpec spec = contiguous_spec();
      spec.page_size = page;
      if (!append_only)  // kv_cache_append does not read sinks
        expect_rejected(spec, [](KvCacheArgs& a, DecodeRun&) { a.sinks = static_cast<const float*>(a.k_cache.data); },
                        "sinks: overlaps k_cache, which this call writes");
      expect_rejected(spec,
                      [](KvCacheArgs& a, DecodeRun& r) {
                        auto* inside = static_cast<int32_t*>(a.v_cache.data) + 8;
                        std::memcpy(inside, r.seqlens.data(), r.seqlens.size() * sizeof(int32_t));
                        a.cache_seqlens = inside;
                      },
                      "cache_seqlens: overlaps v_cache, which this call writes", append_only);
    }
}

// Quantized caches (int8, fp8 e4m3): wrong or missing scales, a scale of 0,
// NaN, inf or < 0 (fp8's per-head scales), scales that overlap the cache or
// an output, and scales given to an unquantized cache.
DecodeSpec quantized_spec(KvQuant quant, int64_t page_size = 0) {
  DecodeSpec s = contiguous_spec();
  s.kv_quant = quant;
  s.page_size = page_size;
  return s;
}

TEST(KvCacheBadInput, QuantizedCacheScales) {
  for (int64_t page : {0, 4})
    for (bool append_only : {false, true}) {
      expect_rejected(quantized_spec(KvQuant::int8, page), [](KvCacheArgs& a, DecodeRun&) { a.k_scale = nullptr; },
                      "k_scale: data is null (the cache is int8)", append_only);
      expect_rejected(quantized_spec(KvQuant::fp8_e4m3, page), [](KvCacheArgs& a, DecodeRun&) { a.v_scale = nullptr; },
                      "v_scale: data is null (the cache is fp8_e4m3)", append_only);
      // Every token of a head writing the same scale slot.
      expect_rejected(quantized_spec(KvQuant::int8, page), [](KvCacheArgs& a, DecodeRun&) { a.v_scale_stride[2] = 0; },
                      "v_scale: output strides", append_only);
      expect_rejected(quantized_spec(KvQuant::int8, page),
                      [](KvCacheArgs& a, DecodeRun&) { a.k_scale = static_cast<float*>(a.k_cache.data); },
                      "k_scale: overlaps k_cache", append_only);
      expect_rejected(quantized_spec(KvQuant::int8, page), [](KvCacheArgs& a, DecodeRun&) { a.k_scale = a.v_scale; },
                      "k_scale: overlaps v_scale", append_only);
      for (float bad : {0.0f, -0.5f, NAN, INFINITY}) {
        expect_rejected(quantized_spec(KvQuant::fp8_e4m3, page), [bad](KvCacheArgs&, DecodeRun& r) { r.k_scale[1] = bad; },
                        "k_scale[1] must be finite and > 0", append_only);
        expect_rejected(quantized_spec(KvQuant::fp8_e4m3, page), [bad](KvCacheArgs&, DecodeRun& r) { r.v_scale[0] = bad; },
                        "v_scale[0] must be finite and > 0", append_only);
      }
      // A scale for a cache that holds dtype elements (an fp32 k_cache given scales).
      std::vector<float> scales(64, 1.0f);
      expect_rejected(quantized_spec(KvQuant::none, page),
                      [&scales](KvCacheArgs& a, DecodeRun&) { a.k_scale = scales.data(); },
                      "k_scale: given, but kv_quant is none (the cache holds fp32)", append_only);
      expect_rejected(quantized_spec(KvQuant::int8, page), [](KvCacheArgs& a, DecodeRun&) { a.kv_quant = KvQuant(7); },
                      "kv_quant: expected none, int8 or fp8_e4m3", append_only);
    }
  // fp8 scales (valid values) inside the row an append writes: refused
  // before anything is written, since the append would change the scales
  // the attention then reads.
  for (bool append_only : {false, true})
    expect_rejected(quantized_spec(KvQuant::fp8_e4m3),
                    [](KvCacheArgs& a, DecodeRun&) {
                      char* row = static_cast<char*>(a.k_cache.data) + a.cache_seqlens[0] * a.k_cache.stride[2];
                      for (int64_t h = 0; h < a.kv_heads; ++h) {
                        const float scale = 0.004f;
                        std::memcpy(row + h * sizeof(float), &scale, sizeof(float));
                      }
                      a.k_scale = reinterpret_cast<float*>(row);
                    },
                    "k_scale: overlaps k_cache", append_only);
  // The outputs, the queries and the new rows must not alias a scale the call writes.
  expect_rejected(quantized_spec(KvQuant::int8), [](KvCacheArgs& a, DecodeRun&) { a.lse = a.v_scale; },
                  "lse: output overlaps input v_scale");
  // o laid over k_scale alone: both in one buffer of their own, longer than
  // o's whole extent. (o from k_scale's own start spans past the scales into
  // whatever the allocator put next, once the v_cache: the check then named
  // that first.)
  expect_rejected(quantized_spec(KvQuant::int8),
                  [](KvCacheArgs& a, DecodeRun& r) {
                    static std::vector<float> scales_and_o;
                    scales_and_o.assign(r.k_scale.size() + 2 * size_t(r.o.elements()), 0.0f);
                    std::copy(r.k_scale.begin(), r.k_scale.end(), scales_and_o.begin());
                    a.k_scale = scales_and_o.data();
                    a.o = {scales_and_o.data(), a.o.stride};
                  },
                  "o: output overlaps input k_scale");
  // k_new laid over v_scale spans past its end: which scale the check names
  // first depends on where the allocator put k_scale (next to v_scale under
  // ASan), so the test asks for the refusal, not the name.
  expect_rejected(quantized_spec(KvQuant::int8), [](KvCacheArgs& a, DecodeRun&) { a.k_new = {a.v_scale, a.k_new.stride}; },
                  "k_new: overlaps ", true);
}

// The forward operator's own view of a quantized source: an fp8 cache with
// a scale per token is refused.
TEST(KvCacheBadInput, ForwardQuantizedSource) {
  DecodeRun run(quantized_spec(KvQuant::fp8_e4m3));
  run.prefill();
  ForwardArgs f = kvcache_forward_args(run.args, run.seqlens.data());
  f.kv.k_scale_stride = {0, 1, 1};
  EXPECT_THROW(
      {
        try {
          validate(f);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("k_scale: an fp8_e4m3 cache takes one scale per KV head"),
                    std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace tileattn::kvtest
