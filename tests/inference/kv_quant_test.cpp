// Quantized KV caches (int8 with a scale per token and KV head, fp8 e4m3
// with a scale per KV head): the fp8 conversion's bits, the appended bytes
// and scales, every ISA's products converting each int8 / fp8 value exactly,
// and decode / prefill against the float64 reference over the dequantized
// cache (the tolerance rule), contiguous and paged (bitwise equal), GQA,
// split-KV, RoPE.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "decode_fixture.hpp"
#include "testing/tolerance.hpp"
#include "tileattn/machine.hpp"
#include "training/reference_backward.hpp"

namespace tileattn::kvtest {
namespace {

using detail::f8e4m3_to_float;
using detail::float_to_f8e4m3;

std::vector<Isa> isa_paths() {
  std::vector<Isa> paths;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    if (isa_available(isa)) paths.push_back(isa);
  return paths;
}

TEST(KvQuantFp8, DecodesTheE4m3Encoding) {
  EXPECT_EQ(f8e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(f8e4m3_to_float(0x80)));
  EXPECT_EQ(f8e4m3_to_float(0x01), std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(f8e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_float(0x08), std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_EQ(f8e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_float(0xb9), -1.125f);
  EXPECT_EQ(f8e4m3_to_float(0x7e), 448.0f);                 // largest finite
  EXPECT_EQ(f8e4m3_to_float(0x78), 256.0f);                 // no infinity: exponent 15 is finite
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(0xff)));
  // torch's NaN bits (c10::Float8_e4m3fn): sign | 0x7ff00000.
  uint32_t bits;
  const float nan = f8e4m3_to_float(0xff);
  std::memcpy(&bits, &nan, 4);
  EXPECT_EQ(bits, 0xfff00000u);
}

TEST(KvQuantFp8, EncodesLikeTorch) {
  // Every finite byte round-trips.
  for (int x = 0; x < 256; ++x) {
    if ((x & 0x7f) == 0x7f) continue;
    EXPECT_EQ(float_to_f8e4m3(f8e4m3_to_float(uint8_t(x))), x) << x;
  }
  // Ties go to the even neighbour, normals and subnormals.
  EXPECT_EQ(float_to_f8e4m3(1.0625f), 0x38);   // between 1 (0x38) and 1.125 (0x39)
  EXPECT_EQ(float_to_f8e4m3(1.1875f), 0x3a);   // between 1.125 and 1.25 (0x3a)
  EXPECT_EQ(float_to_f8e4m3(std::ldexp(1.0f, -10)), 0x00);      // half the smallest subnormal
  EXPECT_EQ(float_to_f8e4m3(3 * std::ldexp(1.0f, -10)), 0x02);  // 1.5 subnormal units
  EXPECT_EQ(float_to_f8e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(float_to_f8e4m3(464.0f), 0x7e);    // the tie above 448 goes down to even
  // No saturation (torch's conversion): 480 and beyond, inf and NaN are NaN.
  EXPECT_EQ(float_to_f8e4m3(std::nextafter(464.0f, 500.0f)), 0x7f);
  EXPECT_EQ(float_to_f8e4m3(480.0f), 0x7f);
  EXPECT_EQ(float_to_f8e4m3(-1e6f), 0xff);
  EXPECT_EQ(float_to_f8e4m3(INFINITY), 0x7f);
  EXPECT_EQ(float_to_f8e4m3(NAN), 0x7f);
  EXPECT_EQ(float_to_f8e4m3(-0.0f), 0x80);
}

// One key whose V row holds byte c at column c: O = the dequantized V row,
// exactly (P = 1, one product with the scale, rounded once). Every ISA's
// few-rows product (1 row) and packed product (9 unmasked query rows of one
// head: more than the few-rows limit), head dims with and without a tail.
TEST(KvQuant, EveryIsaConvertsEveryValueExactly) {
  for (Isa isa : isa_paths())
    for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3})
      for (int64_t d : {256, 200, 13})
        for (int64_t rows : {1, 9}) {
          SCOPED_TRACE(std::string(isa_name(isa)) + " " + kv_quant_name(quant) + " d " + std::to_string(d) +
                       " rows " + std::to_string(rows));
          std::vector<uint8_t> k(static_cast<size_t>(d), 0), v(static_cast<size_t>(d));
          for (int64_t c = 0; c < d; ++c) v[size_t(c)] = uint8_t(c);
          std::vector<float> q(size_t(rows * d), 0.5f), o(size_t(rows * d), -1.0f);
          const float k_scale = 0.25f, v_scale = 0.0078125f * 3.0f;
          ForwardArgs f;
          f.shape = {1, 1, 1, rows, 1, d};
          f.q = {q.data(), bhsd(1, 1, rows, d)};
          f.o = {o.data(), bhsd(1, 1, rows, d)};
          f.k = {k.data(), bhsd(1, 1, 1, d)};
          f.v = {v.data(), bhsd(1, 1, 1, d)};
          f.kv.quant = quant;
          f.kv.k_scale = &k_scale;
          f.kv.v_scale = &v_scale;
          f.kv.k_scale_stride = {0, 1, 0};
          f.kv.v_scale_stride = {0, 1, 0};
          f.isa = isa;
          f.threads = 1;
          attention_forward(f);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < d; ++c) {
              const float element = quant == KvQuant::int8 ? float(int8_t(v[size_t(c)])) : f8e4m3_to_float(v[size_t(c)]);
              const float want = element * v_scale, got = o[size_t(r * d + c)];
              if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << "column " << c;
              else EXPECT_EQ(got, want) << "row " << r << " column " << c;
            }
        }
}

// The decode step against float64 attention over the dequantized cache (the
// cache as stored, element x scale), O and LSE; a paged run bitwise equal to
// the contiguous one.
void expect_quantized_step_correct(DecodeSpec spec) {
  SCOPED_TRACE(spec.name());
  DecodeRun run(spec);
  run.prefill();
  run.decode();
  ForwardArgs f = kvcache_forward_args(run.args, run.seqlens.data());
  f.q = {run.q_expected.data(), bhsd(run.batch, spec.heads, spec.new_tokens, spec.head_dim)};
  Buffer unused(spec.dtype, run.o.elements());
  const auto o_stride = bhsd(run.batch, spec.heads, spec.new_tokens, spec.dv());
  f.o = {unused.data(), o_stride};
  f.lse = nullptr;
  const Check c = check_against_reference(f, run.o, o_stride, run.lse.data());
  EXPECT_TRUE(c.ok()) << c.describe();
  if (spec.page_size == 0) return;
  spec.page_size = 0;
  DecodeRun contiguous(spec);
  contiguous.prefill();
  contiguous.decode();
  EXPECT_EQ(run.o.bytes(), contiguous.o.bytes()) << "paged output differs from contiguous";
  EXPECT_EQ(run.lse, contiguous.lse);
}

TEST(KvQuant, DecodeMatchesTheReferenceOverTheDequantizedCache) {
  for (Isa isa : isa_paths())
    for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3})
      for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
        DecodeSpec s;
        s.isa = isa;
        s.kv_quant = quant;
        s.dtype = dtype;
        // Llama-like GQA group of 4, RoPE, 1100 cached keys: split-KV.
        s.heads = 8;
        s.kv_heads = 2;
        s.head_dim = 128;
        s.cached = {1100};
        s.rotary_dim = 128;
        expect_quantized_step_correct(s);
        s.page_size = 16;
        expect_quantized_step_correct(s);
        // Sequences of different lengths, a head dim with tails, odd pages.
        s.cached = {5, 40};
        s.head_dim = 36;
        s.rotary_dim = 16;
        s.page_size = 3;
        expect_quantized_step_correct(s);
      }
}

// KvCacheArgs::bf16_probabilities with a quantized cache (fp8 e4m3, int8)
// and bf16 queries: on avx512bf16 with VBMI the few-rows P V runs on
// vdpbf16ps with P (times each key's V scale) rounded to bf16
// (few_rows_dot.hpp: fp8 V through the byte permutes, int8 through fp32);
// on avx512, avx512bf16 and amx with VNNI an int8 cache's scores run on
// vpdpwssd with Q rounded to 16-bit integers (few_rows_vnni.hpp, an error
// ~2^-17 of the scores'), and on avx512 and avx512bf16 (amx keeps P at fp32)
// its P V with P rounded to 16-bit integers; elsewhere
// the flag changes nothing here. The output moves by
// at most 2^-8 max |V| (V dequantized: within 2^-4 of the bf16 values it
// came from for fp8, half a scale for int8) plus both outputs' bf16
// rounding; paged (pages of 3) equals contiguous bit for bit.
TEST(KvQuant, QuantizedBf16ProbabilitiesOnTheDotProducts) {
  for (KvQuant quant : {KvQuant::fp8_e4m3, KvQuant::int8})
    for (Isa isa : isa_paths()) {
      const bool dot = isa == Isa::avx512bf16 && cpu_features().avx512_vbmi;
      const bool vnni = quant == KvQuant::int8 &&
                        (isa == Isa::avx512 || isa == Isa::avx512bf16 || isa == Isa::amx) &&
                        cpu_features().avx512_vnni;
      for (const auto& [head_dim, cached] : std::vector<std::pair<int64_t, std::vector<int32_t>>>{
               {128, {1100}}, {40, {5, 99}}, {96, {333}}}) {
        DecodeSpec s;
        s.isa = isa;
        s.kv_quant = quant;
        s.dtype = DType::bf16;
        s.heads = 8;
        s.kv_heads = 2;
        s.head_dim = head_dim;
        s.cached = cached;
        s.page_size = head_dim == 40 ? 3 : 0;
        SCOPED_TRACE(s.name());
        DecodeRun exact(s), rounded(s);
        rounded.args.bf16_probabilities = true;
        for (DecodeRun* run : {&exact, &rounded}) {
          run->prefill();
          run->decode();
        }
        const RoundingEffect e = rounding_effect(exact, rounded);
        // The LSE (fp32, from the scores) moves with the VNNI scores only.
        double lse_diff = 0;
        for (size_t i = 0; i < exact.lse.size(); ++i)
          lse_diff = std::max(lse_diff, std::abs(double(rounded.lse[i]) - double(exact.lse[i])));
        if (dot) { EXPECT_GT(e.max_diff, 0.0) << isa_name(isa) << ": bf16_probabilities changed nothing in P V"; }
        if (vnni) { EXPECT_GT(lse_diff, 0.0) << isa_name(isa) << ": the int8 scores did not take VNNI"; }
        if (!dot && !vnni) { EXPECT_EQ(e.max_diff, 0.0) << isa_name(isa) << ": no dot-product P V or VNNI scores here"; }
        if (!vnni) { EXPECT_EQ(lse_diff, 0.0) << isa_name(isa) << ": the scores changed"; }
        EXPECT_LE(lse_diff, std::ldexp(1.0, -12)) << isa_name(isa);  // Q's rounding: ~2^-17 of a score
        EXPECT_LE(e.max_diff, std::ldexp(e.max_v * 1.0625, -8) + std::ldexp(e.max_o, -7)) << isa_name(isa);
        if (s.page_size == 0) continue;
        s.page_size = 0;
        DecodeRun contiguous(s);
        contiguous.args.bf16_probabilities = true;
        contiguous.prefill();
        contiguous.decode();
        EXPECT_EQ(rounded.o.bytes(), contiguous.o.bytes()) << "paged output differs from contiguous";
        EXPECT_EQ(rounded.lse, contiguous.lse);
      }
    }
}

// With VNNI both AVX-512 rungs take the same products for an int8 cache under
// bf16_probabilities (the VNNI scores and P V, few_rows_vnni.hpp; the
// avx512bf16 rung's vdpbf16ps P V was slower for int8 V on Zen 4,
// bf16_kernels.hpp), so their outputs agree bit for bit.
TEST(KvQuant, Int8Bf16ProbabilitiesTakeTheVnniProductsOnBothAvx512Rungs) {
  if (!isa_available(Isa::avx512bf16) || !cpu_features().avx512_vnni)
    GTEST_SKIP() << "this CPU has no avx512bf16 rung with AVX512-VNNI";
  for (const auto& [head_dim, cached] : std::vector<std::pair<int64_t, std::vector<int32_t>>>{
           {128, {1100}}, {40, {5, 99}}, {96, {333}}}) {
    std::vector<uint8_t> outputs[2];
    std::vector<float> lses[2];
    for (int i = 0; i < 2; ++i) {
      DecodeSpec s;
      s.isa = i == 0 ? Isa::avx512 : Isa::avx512bf16;
      s.kv_quant = KvQuant::int8;
      s.dtype = DType::bf16;
      s.heads = 8;
      s.kv_heads = 2;
      s.head_dim = head_dim;
      s.cached = cached;
      SCOPED_TRACE(s.name());
      DecodeRun run(s);
      run.args.bf16_probabilities = true;
      run.prefill();
      run.decode();
      outputs[i] = run.o.bytes();
      lses[i] = run.lse;
    }
    EXPECT_EQ(outputs[0], outputs[1]) << "head dim " << head_dim << ": the rungs' int8 P V differ";
    EXPECT_EQ(lses[0], lses[1]) << "head dim " << head_dim;
  }
}

// MLA's absorbed decode on a quantized cache: K 576 wide, V 512 (each row
// with its own scale), one KV head, 8 heads (few-rows products) and 16
// (packed tiles), contiguous and paged, 1100 keys (split-KV).
TEST(KvQuant, MlaHeadDims) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3})
    for (int64_t heads : {8, 16}) {
      DecodeSpec s;
      s.kv_quant = quant;
      s.dtype = DType::bf16;
      s.heads = heads;
      s.kv_heads = 1;
      s.head_dim = 576;
      s.v_head_dim = 512;
      s.cached = {1100};
      expect_quantized_step_correct(s);
      s.page_size = 16;
      expect_quantized_step_correct(s);
    }
  // The append quantizes all 512 columns of each V row: the stored row, times
  // its scale, is the row given within the rounding of int8 (half a scale) or
  // of e4m3 (2^-4 relative, 2^-9 of the scale near 0).
  for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3}) {
    DecodeSpec s;
    s.kv_quant = quant;
    s.dtype = DType::f32;
    s.heads = 8;
    s.kv_heads = 1;
    s.head_dim = 576;
    s.v_head_dim = 512;
    s.cached = {20};
    SCOPED_TRACE(s.name());
    DecodeRun run(s);
    run.prefill();
    run.decode();
    const auto& st = run.args.v_scale_stride;
    for (int64_t j = 0; j < run.max_len; ++j) {
      const float scale = quant == KvQuant::int8 ? run.v_scale[size_t(j * st[2])] : run.v_scale[0];
      for (int64_t c = 0; c < 512; ++c) {
        const float x = run.v_full.get(j * 512 + c), stored = run.cache_v(0, 0, j, c) * scale;
        const float bound = quant == KvQuant::int8 ? 0.5001f * scale
                                                   : std::max(std::fabs(x) * 0.0625f, scale * 0.002f);
        ASSERT_LE(std::fabs(stored - x), bound) << "row " << j << " column " << c;
      }
    }
  }
}

// Prefill against a quantized cache: 2 x 20 stacked rows take the packed
// tile products; a sliding window; MHA (1 row per item).
TEST(KvQuant, PrefillAndOtherShapes) {
  for (Isa isa : isa_paths())
    for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3}) {
      DecodeSpec s;
      s.isa = isa;
      s.kv_quant = quant;
      s.dtype = DType::bf16;
      s.cached = {30, 7};
      s.new_tokens = 20;
      s.head_dim = 64;
      s.rotary_dim = 64;
      expect_quantized_step_correct(s);
      s.page_size = 8;
      expect_quantized_step_correct(s);
      s.new_tokens = 1;
      s.window_left = 9;
      s.heads = s.kv_heads = 3;
      expect_quantized_step_correct(s);
    }
}

// An int8 cache whose per-token V scales spread over 2^+-12 (every tile's
// inside [2^-40, 2^40]: P V's lo on int8 products with its one scale per row
// over P x V scale, on the avx512bf16 rung at 20 x 8 = 160 rows per V tile),
// over 2^+-50 (tiles outside that range take the bf16 lo) and all near
// 2^-107 (V ~ 2^-100): the tolerance rule against float64 over the
// dequantized cache, contiguous and paged. Fails with every tile's V scale
// taken as its first key's. (The range gate itself does not show here: with
// it off the lo of the 2^-107 tiles falls below lo_int8.hpp's row floor and
// is dropped, an error of up to ~2^-9 of P |V| that passed against a bf16
// output's tolerance.)
TEST(KvQuant, Int8VScalesSpreadWidely) {
  for (Isa isa : isa_paths())
    for (auto [shift, spread] : {std::pair{0, 12}, std::pair{0, 50}, std::pair{-100, 4}}) {
      DecodeSpec s;
      s.isa = isa;
      s.kv_quant = KvQuant::int8;
      s.dtype = DType::bf16;
      s.heads = 8;
      s.kv_heads = 1;
      s.cached = {300, 70};
      s.new_tokens = 20;
      s.v_exponent_spread = spread;
      s.v_exponent_shift = shift;
      expect_quantized_step_correct(s);
      s.page_size = 16;
      expect_quantized_step_correct(s);
    }
}

// Dropout over a quantized cache (attention_forward with a quantized KvSource
// and dropout_p): prefill (2 x 20 stacked rows: the packed products; on the
// bf16 dot-product rungs dropout keeps P out of the operands' exponentials,
// so the V scales go on P in place) and a decode step (the few-rows
// products), contiguous and paged, against the float64 reference with the
// same mask over the dequantized cache, by the tolerance rule; the same
// check rejects O off by 1%.
TEST(KvQuant, DropoutOverTheDequantizedCache) {
  for (Isa isa : isa_paths())
    for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3})
      for (int64_t new_tokens : {20, 1})
        for (int64_t page_size : {0, 8}) {
          DecodeSpec s;
          s.isa = isa;
          s.kv_quant = quant;
          s.dtype = DType::bf16;
          s.cached = {300, 70};
          s.new_tokens = new_tokens;
          s.page_size = page_size;
          SCOPED_TRACE(s.name());
          DecodeRun run(s);
          run.prefill();
          run.decode();
          ForwardArgs f = kvcache_forward_args(run.args, run.seqlens.data());
          const auto o_stride = bhsd(run.batch, s.heads, s.new_tokens, s.dv());
          f.q = {run.q_expected.data(), bhsd(run.batch, s.heads, s.new_tokens, s.head_dim)};
          Buffer o(s.dtype, run.o.elements());
          f.o = {o.data(), o_stride};
          f.lse = nullptr;
          f.dropout_p = 0.25f;
          f.seed = 0x5eed;
          attention_forward(f);
          const training::BackwardReference ref = training::reference_forward_with_dropout(f);
          const training::BackwardReference naive = training::naive_forward_with_dropout(f);
          std::vector<double> got;
          for (int64_t e = 0; e < int64_t(o.elements()); ++e) got.push_back(o.get(e));
          const testing::RowCheck c = testing::check_output(got, ref.o, naive.o, s.dv(), s.dtype);
          EXPECT_TRUE(c.ok()) << isa_name(isa) << ": error " << c.error << " > tolerance " << c.tolerance;
          const testing::RowCheck off = testing::check_output(got, ref.o, naive.o, s.dv(), s.dtype, 1e-2);
          EXPECT_FALSE(off.ok()) << isa_name(isa) << ": O off by 1% passed";
        }
}

// The test's own quantization of one row (KvCacheArgs::kv_quant's rules).
void quantize_expected(KvQuant quant, const std::vector<float>& x, float fp8_scale, std::vector<uint8_t>& bytes,
                       float& scale) {
  bytes.assign(x.size(), 0);
  if (quant == KvQuant::fp8_e4m3) {
    scale = fp8_scale;
    for (size_t c = 0; c < x.size(); ++c) {
      const float y = x[c] / fp8_scale;  // clamped; a NaN stays NaN
      bytes[c] = float_to_f8e4m3(y > 448.0f ? 448.0f : y < -448.0f ? -448.0f : y);
    }
    return;
  }
  float amax = 0.0f;
  bool finite = true;
  for (float e : x) finite = finite && std::isfinite(e), amax = std::fmax(amax, std::fabs(e));
  scale = finite ? amax / 127.0f : NAN;
  if (!finite || amax == 0.0f) return;
  for (size_t c = 0; c < x.size(); ++c) {
    const float r = std::fmax(-127.0f, std::fmin(127.0f, std::nearbyint(x[c] / scale)));
    bytes[c] = uint8_t(int8_t(r));
  }
}

// The appended bytes and scales are the quantized rotated rows (what a
// `dtype` cache stores, quantized), including a row of zeros (int8 scale 0),
// a row with a NaN (int8: scale NaN; fp8: NaN byte) and an element past
// fp8's range (saturates to 448).
TEST(KvQuant, AppendStoresTheQuantizedRows) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3})
    for (DType dtype : {DType::f32, DType::bf16})
      for (int64_t page : {0, 5}) {
        DecodeSpec s;
        s.kv_quant = quant;
        s.dtype = dtype;
        s.cached = {12, 9};
        s.new_tokens = 2;
        s.head_dim = 24;
        s.rotary_dim = 24;
        s.page_size = page;
        SCOPED_TRACE(s.name());
        DecodeRun run(s);
        const int64_t d = s.head_dim, len = run.max_len;
        for (int64_t c = 0; c < d; ++c) {
          run.v_full.set(((0 * s.kv_heads + 1) * len + 3) * d + c, 0.0f);  // a row of zeros
        }
        run.v_full.set(((1 * s.kv_heads + 0) * len + 4) * d + 5, NAN);
        run.v_full.set(((1 * s.kv_heads + 0) * len + 6) * d + 2, 1e6f);
        run.prefill();
        run.decode();  // appends the last rows through attention_with_kvcache
        for (int64_t b = 0; b < run.batch; ++b)
          for (int64_t h = 0; h < s.kv_heads; ++h)
            for (int64_t j = 0; j < run.seqlens[size_t(b)]; ++j)
              for (bool is_k : {true, false}) {
                const Buffer& src = is_k ? run.k_expected : run.v_full;
                std::vector<float> x(static_cast<size_t>(d));
                for (int64_t c = 0; c < d; ++c) x[size_t(c)] = src.get(((b * s.kv_heads + h) * len + j) * d + c);
                const std::vector<float>& scales = is_k ? run.k_scale : run.v_scale;
                std::vector<uint8_t> want;
                float want_scale;
                quantize_expected(quant, x, scales[size_t(h)], want, want_scale);
                int64_t outer = b, row = j;
                if (page > 0) outer = run.block_table[size_t(b * run.args.block_table_stride + j / page)], row = j % page;
                const OutputView& view = is_k ? run.args.k_cache : run.args.v_cache;
                const auto* bytes = static_cast<const uint8_t*>(view.data);
                for (int64_t c = 0; c < d; ++c)
                  ASSERT_EQ(bytes[outer * view.stride[0] + h * view.stride[1] + row * view.stride[2] + c], want[size_t(c)])
                      << (is_k ? "k" : "v") << " b " << b << " h " << h << " j " << j << " c " << c;
                if (quant == KvQuant::int8) {
                  const auto& st = is_k ? run.args.k_scale_stride : run.args.v_scale_stride;
                  const float got = scales[size_t(outer * st[0] + h * st[1] + row * st[2])];
                  if (std::isnan(want_scale)) EXPECT_TRUE(std::isnan(got));
                  else EXPECT_EQ(got, want_scale) << (is_k ? "k" : "v") << " b " << b << " h " << h << " j " << j;
                }
              }
        // The special rows did what the rules say.
        if (quant == KvQuant::fp8_e4m3) {
          EXPECT_TRUE(std::isnan(run.cache_v(1, 0, 4, 5)));
          EXPECT_EQ(run.cache_v(1, 0, 6, 2), 448.0f);
        }
      }
}

}  // namespace
}  // namespace tileattn::kvtest
