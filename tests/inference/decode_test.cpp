// Decode with a contiguous KV cache equals the forward operator over the
// whole sequence: both are checked against the float64 reference with the
// bound set by the naive same-precision implementation.
#include <gtest/gtest.h>

#include <cmath>

#include "decode_fixture.hpp"
#include "support/thread_census.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::kvtest {
namespace {

// Runs prefill + one decode step and checks everything observable.
void expect_decode_matches_full_sequence(const DecodeSpec& spec) {
  SCOPED_TRACE(spec.name());
  DecodeRun run(spec);
  run.prefill();
  for (size_t b = 0; b < spec.cached.size(); ++b) ASSERT_EQ(run.seqlens[b], spec.cached[b]);
  run.decode();

  const int64_t d = spec.head_dim, dv = spec.dv();
  for (int64_t b = 0; b < run.batch; ++b) {
    const int64_t length = spec.cached[size_t(b)] + spec.new_tokens;
    ASSERT_EQ(run.seqlens[size_t(b)], length) << "cache_seqlens advanced by the new tokens";
    for (int64_t h = 0; h < spec.kv_heads; ++h)
      for (int64_t j = 0; j < length; ++j) {
        const int64_t row = (b * spec.kv_heads + h) * run.max_len + j;
        for (int64_t c = 0; c < d; ++c)
          ASSERT_EQ(run.cache_k(b, h, j, c), run.k_expected.get(row * d + c)) << "k b" << b << " h" << h << " j" << j;
        for (int64_t c = 0; c < dv; ++c)
          ASSERT_EQ(run.cache_v(b, h, j, c), run.v_full.get(row * dv + c)) << "v b" << b << " h" << h << " j" << j;
      }
  }

  Buffer forward_out;
  std::vector<int32_t> lengths;
  ForwardArgs full = run.full_sequence_args(forward_out, lengths);
  const auto o_stride = bhsd(run.batch, spec.heads, spec.new_tokens, dv);
  const Check decode = check_against_reference(full, run.o, o_stride, run.lse.data());
  EXPECT_TRUE(decode.ok()) << "decode: " << decode.describe();

  std::vector<float> forward_lse(run.lse.size());
  full.lse = forward_lse.data();
  full.lse_stride = run.args.lse_stride;
  attention_forward(full);
  const Check forward = check_against_reference(full, forward_out, o_stride, forward_lse.data());
  EXPECT_TRUE(forward.ok()) << "forward on the full sequence: " << forward.describe();
}

struct CacheAndNew {
  int32_t cached;
  int64_t new_tokens;
};

class DecodeSizes : public ::testing::TestWithParam<CacheAndNew> {};

TEST_P(DecodeSizes, EqualsForwardOnFullSequence) {
  DecodeSpec spec;
  spec.cached = {GetParam().cached};
  spec.new_tokens = GetParam().new_tokens;
  expect_decode_matches_full_sequence(spec);
}

std::vector<CacheAndNew> all_sizes() {
  std::vector<CacheAndNew> sizes;
  for (int32_t cached : {0, 1, 15, 16, 17, 1000})
    for (int64_t n : {1, 3, 17}) sizes.push_back({cached, n});
  return sizes;
}

INSTANTIATE_TEST_SUITE_P(CacheTimesNewTokens, DecodeSizes, ::testing::ValuesIn(all_sizes()),
                         [](const ::testing::TestParamInfo<CacheAndNew>& info) {
                           return "cached" + std::to_string(info.param.cached) + "_new" +
                                  std::to_string(info.param.new_tokens);
                         });

TEST(Decode, HalfPrecisionCaches) {
  for (DType dtype : {DType::f16, DType::bf16})
    for (int32_t cached : {0, 17, 1000}) {
      DecodeSpec spec;
      spec.dtype = dtype;
      spec.cached = {cached};
      spec.new_tokens = 3;
      expect_decode_matches_full_sequence(spec);
    }
}

TEST(Decode, SlidingWindows) {
  struct Window {
    bool causal;
    int64_t left, right;
  };
  for (Window w : {Window{true, 8, -1}, Window{true, 0, 0}, Window{false, 5, 3}, Window{false, 40, 0},
                   Window{false, 2, 30}})
    for (int32_t cached : {1, 16, 100}) {
      DecodeSpec spec;
      spec.causal = w.causal;
      spec.window_left = w.left;
      spec.window_right = w.right;
      spec.cached = {cached};
      spec.new_tokens = 17;
      expect_decode_matches_full_sequence(spec);
    }
}

// A soft cap of 0.3 on scores of standard deviation ~0.33 (inputs in [-1, 1],
// D = 64): contiguous and paged caches, GQA, one and several new tokens, a
// window, bf16 (whose products would defer the scale).
TEST(Decode, Softcap) {
  for (int64_t page : {0, 16})
    for (int64_t n : {1, 5}) {
      DecodeSpec spec;
      spec.heads = 8;
      spec.softcap = 0.3f;
      spec.cached = {40, 700};
      spec.new_tokens = n;
      spec.page_size = page;
      expect_decode_matches_full_sequence(spec);
      spec.dtype = DType::bf16;
      spec.window_left = 100;
      expect_decode_matches_full_sequence(spec);
    }
}

// ALiBi in decode: the bias's offset is each sequence's own cache length
// (sequences of 40 and 700 tokens), slopes per head and per (sequence, head);
// contiguous and paged, with a soft cap too.
TEST(Decode, Alibi) {
  for (int64_t page : {0, 16})
    for (bool per_sequence : {false, true}) {
      DecodeSpec spec;
      spec.heads = 8;
      spec.cached = {40, 700};
      spec.new_tokens = 3;
      spec.page_size = page;
      for (int64_t b = 0; b < (per_sequence ? 2 : 1); ++b)
        for (int64_t h = 0; h < spec.heads; ++h)
          spec.alibi_slopes.push_back(std::exp2(-float(h + 1)) * (1.0f + float(b)));
      expect_decode_matches_full_sequence(spec);
      spec.softcap = 0.3f;
      spec.dtype = DType::bf16;
      expect_decode_matches_full_sequence(spec);
    }
}

// Attention sinks in decode: one or several new tokens on sequences of 40
// and 3000 cached tokens (the long one takes the split-KV merge, which adds
// each row's sink once), contiguous and paged, GQA, a window, bf16 with a
// soft cap and ALiBi. Sinks in [-2, 8] straddle the rows' LSE (~log(keys)).
TEST(Decode, Sinks) {
  for (int64_t page : {0, 16})
    for (int64_t n : {1, 4}) {
      DecodeSpec spec;
      spec.heads = 8;
      spec.cached = {40, 3000};
      spec.new_tokens = n;
      spec.page_size = page;
      for (int64_t h = 0; h < spec.heads; ++h) spec.sinks.push_back(-2.0f + 1.4f * float(h));
      expect_decode_matches_full_sequence(spec);
      spec.window_left = 100;
      expect_decode_matches_full_sequence(spec);
      spec.window_left = -1;
      spec.dtype = DType::bf16;
      spec.softcap = 0.3f;
      for (int64_t h = 0; h < spec.heads; ++h) spec.alibi_slopes.push_back(std::exp2(-float(h + 1)));
      expect_decode_matches_full_sequence(spec);
    }
}

TEST(Decode, NotCausal) {
  DecodeSpec spec;
  spec.causal = false;
  spec.cached = {33};
  spec.new_tokens = 3;
  expect_decode_matches_full_sequence(spec);
}

TEST(Decode, GroupedAndMultiQueryHeads) {
  struct Heads {
    int64_t heads, kv_heads;
  };
  for (Heads hs : {Heads{8, 2}, Heads{6, 1}, Heads{3, 3}, Heads{32, 8}}) {
    DecodeSpec spec;
    spec.heads = hs.heads;
    spec.kv_heads = hs.kv_heads;
    spec.cached = {130};
    spec.new_tokens = 1;
    expect_decode_matches_full_sequence(spec);
  }
}

// DeepSeek MLA's absorbed decode: K 576 wide, V 512, one KV head shared by
// every query head; contiguous and paged caches (pages of 16 walk the KV
// heads, of 64 do not), 8 heads (the few-rows products) and 16 (packed
// tiles), caches long enough for split-KV, and 192 / 128 prefill-sized steps.
TEST(Decode, MlaHeadDimsContiguousAndPaged) {
  struct Mla {
    int64_t d, dv, heads, new_tokens, page_size;
    int32_t cached;
    DType dtype;
  };
  for (Mla m : {Mla{576, 512, 8, 1, 0, 1100, DType::bf16}, Mla{576, 512, 16, 1, 0, 1100, DType::f32},
                Mla{576, 512, 8, 1, 16, 1100, DType::bf16}, Mla{576, 512, 16, 2, 64, 700, DType::f16},
                Mla{192, 128, 4, 5, 16, 40, DType::f32}, Mla{64, 32, 4, 3, 0, 70, DType::bf16}}) {
    DecodeSpec spec;
    spec.head_dim = m.d;
    spec.v_head_dim = m.dv;
    spec.heads = m.heads;
    spec.kv_heads = m.d == 576 ? 1 : 2;
    spec.new_tokens = m.new_tokens;
    spec.page_size = m.page_size;
    spec.cached = {m.cached};
    spec.dtype = m.dtype;
    expect_decode_matches_full_sequence(spec);
  }
}

// MLA's absorbed decode with its whole group: 128 query heads on one KV head
// stack into one work item (the cache model's 128-row query tile) and, on the
// bf16 dot-product rung, wider key tiles (plan_forward); 4100 cached tokens
// split the keys 8 ways, and the merge of 128 heads x 512 columns x 8 splits
// runs on every thread. Against the float64 reference, and bit for bit
// between 1 and 2 threads (both threads take merge heads: the census hook
// deals items round-robin).
TEST(Decode, MlaWholeGroupSplitKeysMergedOnEveryThread) {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::avx512bf16, Isa::amx})
    if (isa_available(isa)) isas.push_back(isa);
  if (isas.empty()) isas.push_back(Isa::automatic);
  for (Isa isa : isas) {
    DecodeSpec spec;
    spec.head_dim = 576;
    spec.v_head_dim = 512;
    spec.heads = 128;
    spec.kv_heads = 1;
    spec.cached = {4100};
    spec.dtype = DType::bf16;
    spec.isa = isa;
    spec.threads = 1;
    expect_decode_matches_full_sequence(spec);
    DecodeRun one(spec), two(spec);
    two.args.threads = 2;
    one.prefill();
    two.prefill();
    one.decode();
    const detail::ThreadCensus census = tileattn::testing::run_on_every_thread([&] { two.decode(); });
    tileattn::testing::expect_threads_took_part(census, 2, spec.name());
    ASSERT_EQ(one.o.elements(), two.o.elements());
    for (int64_t i = 0; i < one.o.elements(); ++i)
      ASSERT_EQ(one.o.get(i), two.o.get(i)) << isa_name(isa) << " element " << i << ": 1 and 2 threads differ";
    for (size_t i = 0; i < one.lse.size(); ++i) ASSERT_EQ(one.lse[i], two.lse[i]) << isa_name(isa) << " lse " << i;
  }
}

// KvCacheArgs::bf16_probabilities on the bf16 rungs: the packed P V of a step
// stacking 64 query rows (16 heads of one KV head, 4 new tokens) rounds P to
// bf16, so the output moves, by at most 2^-8 (P |V|) <= 2^-8 max |V| from the
// exact result's own error, plus both outputs' bf16 rounding.
TEST(Decode, Bf16ProbabilitiesOnThePackedProducts) {
  int rungs = 0;
  for (Isa isa : {Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    ++rungs;
    DecodeSpec spec;
    spec.dtype = DType::bf16;
    spec.heads = 16;
    spec.kv_heads = 1;
    spec.new_tokens = 4;
    spec.cached = {300, 200};
    spec.isa = isa;
    DecodeRun exact(spec), rounded(spec);
    rounded.args.bf16_probabilities = true;
    for (DecodeRun* run : {&exact, &rounded}) {
      run->prefill();
      run->decode();
    }
    const RoundingEffect e = rounding_effect(exact, rounded);
    EXPECT_GT(e.max_diff, 0.0) << isa_name(isa) << ": bf16_probabilities changed nothing";
    EXPECT_LE(e.max_diff, std::ldexp(e.max_v, -8) + std::ldexp(e.max_o, -7)) << isa_name(isa);
  }
  if (rungs == 0) {
    // No bf16 dot-product rung: the flag must change nothing.
    DecodeSpec spec;
    spec.dtype = DType::bf16;
    spec.heads = 16;
    spec.kv_heads = 1;
    spec.new_tokens = 4;
    DecodeRun exact(spec), rounded(spec);
    rounded.args.bf16_probabilities = true;
    for (DecodeRun* run : {&exact, &rounded}) {
      run->prefill();
      run->decode();
    }
    for (int64_t i = 0; i < exact.o.elements(); ++i) ASSERT_EQ(rounded.o.get(i), exact.o.get(i));
  }
}

TEST(Decode, BatchOfDifferentLengthsAndOddHeadDim) {
  DecodeSpec spec;
  spec.cached = {0, 1, 63, 200};
  spec.head_dim = 59;
  spec.new_tokens = 3;
  expect_decode_matches_full_sequence(spec);
  spec.dtype = DType::bf16;
  spec.head_dim = 128;
  spec.threads = 1;
  expect_decode_matches_full_sequence(spec);
}

TEST(Decode, TokenMajorCacheLayoutAndForcedIsaPaths) {
  DecodeSpec spec;
  spec.cached = {3, 70};
  spec.new_tokens = 3;
  spec.cache_bshd = true;
  expect_decode_matches_full_sequence(spec);
  spec.cache_bshd = false;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    spec.isa = isa;
    expect_decode_matches_full_sequence(spec);
  }
}

// Many steps of one token each, as a generation loop does: after every step
// the output equals attention over the prefix so far.
TEST(Decode, StepByStepLoop) {
  DecodeSpec spec;
  spec.cached = {20};
  spec.new_tokens = 6;
  DecodeRun run(spec);
  run.prefill();
  const int64_t d = spec.head_dim;
  for (int64_t step = 0; step < spec.new_tokens; ++step) {
    KvCacheArgs a = run.args;
    a.seqlen_q = 1;
    a.seqlen_new = 1;
    a.k_new = {static_cast<char*>(run.k_new.data()) + step * run.new_stride[2] * 4, run.new_stride};
    a.v_new = {static_cast<char*>(run.v_new.data()) + step * run.new_stride[2] * 4, run.new_stride};
    a.q = {static_cast<char*>(run.q.data()) + step * d * 4, run.args.q.stride};
    a.o = {static_cast<char*>(run.o.data()) + step * d * 4, run.args.o.stride};
    a.lse = run.lse.data() + step;
    attention_with_kvcache(a);
    ASSERT_EQ(run.seqlens[0], 21 + step);
  }
  // Query t saw keys 0 .. 20 + t: exactly the causal forward with 6 queries.
  Buffer unused;
  std::vector<int32_t> lengths;
  const ForwardArgs full = run.full_sequence_args(unused, lengths);
  const Check c = check_against_reference(full, run.o, bhsd(1, spec.heads, spec.new_tokens, d), run.lse.data());
  EXPECT_TRUE(c.ok()) << c.describe();
}

// Attending without appending reads the cache as it is.
TEST(Decode, AttendWithoutAppend) {
  DecodeSpec spec;
  spec.cached = {40};
  spec.new_tokens = 2;
  DecodeRun run(spec);
  run.prefill();
  KvCacheArgs append = run.args;
  append.seqlen_new = spec.new_tokens;
  append.k_new = {run.k_new.data(), run.new_stride};
  append.v_new = {run.v_new.data(), run.new_stride};
  kv_cache_append(append);
  ASSERT_EQ(run.seqlens[0], 42);
  attention_with_kvcache(run.args);  // seqlen_new = 0
  ASSERT_EQ(run.seqlens[0], 42);
  Buffer unused;
  std::vector<int32_t> lengths;
  const ForwardArgs full = run.full_sequence_args(unused, lengths);
  const Check c = check_against_reference(full, run.o, bhsd(1, spec.heads, 2, spec.head_dim), run.lse.data());
  EXPECT_TRUE(c.ok()) << c.describe();
}

}  // namespace
}  // namespace tileattn::kvtest
