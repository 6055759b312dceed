// Fused RoPE (keys rotated as they are appended, queries rotated per call)
// equals rotating first in float64 and then attending.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "decode_fixture.hpp"

namespace tileattn::kvtest {
namespace {

TEST(RopeTables, MatchFloat64Angles) {
  const RopeTables t = rope_tables(10000.0, 300, 64);
  ASSERT_EQ(t.positions, 300);
  ASSERT_EQ(t.cos.size(), size_t(300 * 32));
  for (int64_t p : {0, 1, 17, 299})
    for (int64_t i : {0, 1, 15, 31}) {
      const double angle = double(p) * std::pow(10000.0, -2.0 * double(i) / 64.0);
      EXPECT_EQ(t.cos[size_t(p * 32 + i)], float(std::cos(angle))) << p << " " << i;
      EXPECT_EQ(t.sin[size_t(p * 32 + i)], float(std::sin(angle))) << p << " " << i;
    }
  const RopeTables picked = rope_tables(500000.0, std::vector<int64_t>{7, 3, 7}, 8);
  const RopeTables dense = rope_tables(500000.0, 8, 8);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(picked.cos[size_t(0 * 4 + i)], dense.cos[size_t(7 * 4 + i)]);
    EXPECT_EQ(picked.sin[size_t(1 * 4 + i)], dense.sin[size_t(3 * 4 + i)]);
    EXPECT_EQ(picked.sin[size_t(2 * 4 + i)], dense.sin[size_t(7 * 4 + i)]);
  }
}

TEST(RopeTables, RejectBadArguments) {
  EXPECT_THROW(rope_tables(0.0, 4, 8), Error);
  EXPECT_THROW(rope_tables(10000.0, 4, 7), Error);
  EXPECT_THROW(rope_tables(10000.0, -1, 8), Error);
  EXPECT_THROW(rope_tables(10000.0, std::vector<int64_t>{1, -2}, 8), Error);
}

// Tables too large for memory are an Error naming the sizes, not signed
// overflow or std::length_error from the vector.
TEST(RopeTables, RejectSizesThatDoNotFit) {
  const auto expect_rejected = [](const std::function<void()>& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const int64_t huge = int64_t(1) << 62;
  expect_rejected([&] { rope_tables(10000.0, 5, huge); }, "rotary_dim");  // 5 x 2^61 overflows int64
  expect_rejected([&] { rope_tables(10000.0, huge, 2); }, "max_positions");
  expect_rejected([&] { rope_tables(10000.0, std::numeric_limits<int64_t>::max(), 4); }, "max_positions");
  expect_rejected([&] { rope_tables(10000.0, std::vector<int64_t>{0, 1, 2}, huge); }, "rotary_dim");
  EXPECT_EQ(rope_tables(10000.0, 0, huge).cos.size(), 0u);  // no rows: nothing to allocate
}

// Checks cache keys (rotated at append) bit for bit against the float64
// rotation, and the attention against the reference on pre-rotated inputs.
void expect_fused_rope_matches(const DecodeSpec& spec) {
  SCOPED_TRACE(spec.name());
  DecodeRun run(spec);
  run.prefill();
  run.decode();
  for (int64_t b = 0; b < run.batch; ++b)
    for (int64_t h = 0; h < spec.kv_heads; ++h)
      for (int64_t j = 0; j < run.seqlens[size_t(b)]; ++j)
        for (int64_t c = 0; c < spec.head_dim; ++c) {
          const int64_t full = ((b * spec.kv_heads + h) * run.max_len + j) * spec.head_dim + c;
          ASSERT_EQ(run.cache_k(b, h, j, c), run.k_expected.get(full)) << "b" << b << " j" << j << " c" << c;
          ASSERT_EQ(run.cache_v(b, h, j, c), run.v_full.get(full)) << "values are never rotated";
        }
  Buffer unused;
  std::vector<int32_t> lengths;
  const ForwardArgs full = run.full_sequence_args(unused, lengths);
  const Check c = check_against_reference(
      full, run.o, bhsd(run.batch, spec.heads, spec.new_tokens, spec.head_dim), run.lse.data());
  EXPECT_TRUE(c.ok()) << c.describe();
}

TEST(FusedRope, BothConventionsFullAndPartialRotaryDims) {
  struct Dims {
    int64_t head_dim, rotary_dim;
  };
  for (bool interleaved : {false, true})
    for (Dims dims : {Dims{64, 64}, Dims{64, 32}, Dims{80, 64}, Dims{59, 2}})
      for (int32_t cached : {0, 17}) {
        DecodeSpec spec;
        spec.head_dim = dims.head_dim;
        spec.rotary_dim = dims.rotary_dim;
        spec.rotary_interleaved = interleaved;
        spec.cached = {cached};
        spec.new_tokens = 3;
        expect_fused_rope_matches(spec);
      }
}

TEST(FusedRope, PagedBatchAndHalfPrecision) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    DecodeSpec spec;
    spec.dtype = dtype;
    spec.rotary_dim = 128;
    spec.head_dim = 128;
    spec.heads = 8;
    spec.kv_heads = 2;
    spec.page_size = 16;
    spec.cached = {3, 40};
    spec.new_tokens = 1;
    expect_fused_rope_matches(spec);
    spec.rotary_interleaved = true;
    expect_fused_rope_matches(spec);
  }
}

// An appended key is the float64 rotation rounded once to fp16 / bf16. The
// tables make x0 cos - x1 sin = 1 + half an ulp + 2^-30: rounding it through
// fp32 first lands exactly on the tie and goes to even (1); rounding once
// goes up. The second element (1 + half an ulp - 2^-30) goes down either way.
TEST(FusedRope, KeysAreRoundedOnceToHalfPrecision) {
  for (DType dtype : {DType::f16, DType::bf16})
    for (float sign : {1.0f, -1.0f}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (sign > 0 ? " +" : " -"));
      const double half_ulp = dtype == DType::f16 ? 0x1p-11 : 0x1p-8;  // of 1.0
      const float cos_row[1] = {float(1.0 + half_ulp)}, sin_row[1] = {-0x1p-30f};
      Buffer k_new(dtype, 2), v_new(dtype, 2), k_cache(dtype, 2), v_cache(dtype, 2);
      k_new.set(0, sign);
      k_new.set(1, sign);
      int32_t seqlen = 0;
      KvCacheArgs a;
      a.batch = a.heads = a.kv_heads = 1;
      a.head_dim = 2;
      a.dtype = dtype;
      a.k_cache = {k_cache.data(), {2, 2, 2, 1}};
      a.v_cache = {v_cache.data(), {2, 2, 2, 1}};
      a.capacity = 1;
      a.cache_seqlens = &seqlen;
      a.seqlen_new = 1;
      a.k_new = {k_new.data(), {2, 2, 2, 1}};
      a.v_new = {v_new.data(), {2, 2, 2, 1}};
      a.rotary_cos = cos_row;
      a.rotary_sin = sin_row;
      a.rotary_dim = 2;
      a.rotary_positions = 1;
      kv_cache_append(a);
      EXPECT_EQ(k_cache.get(0), sign * float(1.0 + 2.0 * half_ulp));
      EXPECT_EQ(k_cache.get(1), sign * 1.0f);
      const double x = sign;
      EXPECT_EQ(k_cache.get(0), round_once(x * cos_row[0] - x * sin_row[0], dtype));
      EXPECT_EQ(k_cache.get(1), round_once(x * sin_row[0] + x * cos_row[0], dtype));
    }
}

// The rotation must not change the caller's queries or new keys.
TEST(FusedRope, InputsAreNotModified) {
  DecodeSpec spec;
  spec.rotary_dim = 32;
  spec.cached = {9};
  spec.new_tokens = 2;
  DecodeRun run(spec);
  run.prefill();
  const auto q = run.q.bytes(), k = run.k_new.bytes();
  run.decode();
  EXPECT_EQ(run.q.bytes(), q);
  EXPECT_EQ(run.k_new.bytes(), k);
}

}  // namespace
}  // namespace tileattn::kvtest
