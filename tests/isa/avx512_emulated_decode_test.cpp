// Decode on the AVX-512 path: a work item that stacks at most kFewRowsMax
// query rows (GQA group x new tokens) takes the few-rows tile products, which
// avx512::Kernels inherits from the AVX2 ones. Run here through the emulated
// AVX-512 main loop (emulated_avx512_forward.hpp; those products run natively)
// on AVX-512's own plan -- its key tiles, head-dim padding, key splits -- and
// checked against the float64 reference by the tolerance rule, paged K/V
// bitwise against contiguous, and 1 against 2 threads. The few-rows products
// count their calls, so each test also checks which path ran.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/forward_plan.hpp"
#include "core/half.hpp"
#include "isa/bf16_kernel_sets.hpp"
#include "isa/emulated_avx512_forward.hpp"
#include "isa/emulated_bf16_forward.hpp"
#include "isa/native_few_rows_kernels.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/reference.hpp"

namespace tileattn::testing {
namespace {

using detail::avx512_emulated_native::NativeFewRowsKernels;

// Stacked rows = (heads / kv_heads) x seqlen_q.
struct Stack {
  int64_t group, seqlen_q;
};
constexpr Stack kFewRowStacks[] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1},
                                   {8, 1}, {1, 2}, {2, 2}, {3, 2}, {4, 2}};
constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};

Case decode_case(const Stack& st, DType dtype, int64_t head_dim, int64_t seqlen_k) {
  Case c;
  c.batch = 2;
  c.kv_heads = 2;
  c.heads = 2 * st.group;
  c.seqlen_q = st.seqlen_q;
  c.seqlen_k = seqlen_k;
  c.head_dim = head_dim;
  c.dtype = dtype;
  c.mask = MaskCase::causal;  // bottom-right: with 2 new tokens the first sees one key less
  c.seed = uint64_t(st.group * 1000 + st.seqlen_q * 100 + head_dim + seqlen_k * 7);
  return c;
}

// K and V of a contiguous case copied into pages [num_pages, kv_heads,
// page_size, D], the pages of each sequence scattered in shuffled order (and a
// spare page nobody uses), with the ForwardArgs that read them.
struct PagedCopy {
  std::vector<char> k_pages, v_pages;
  std::vector<int32_t> block_table, seqlens;
  ForwardArgs args;

  PagedCopy(const CaseData& data, int64_t page_size) : args(data.args) {
    const ForwardArgs& a = data.args;
    const int64_t batch = a.shape.batch, kv_heads = a.shape.kv_heads, n = a.shape.seqlen_k;
    const int64_t d = a.shape.head_dim, esize = int64_t(dtype_size(a.dtype));
    const int64_t per_seq = (n + page_size - 1) / page_size, num_pages = batch * per_seq + 1;
    std::vector<int32_t> order(static_cast<size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(page_size * 31 + n)));
    block_table.assign(order.begin(), order.begin() + batch * per_seq);
    seqlens.assign(size_t(batch), int32_t(n));
    const std::array<int64_t, 4> page_stride{kv_heads * page_size * d, page_size * d, d, 1};
    const size_t bytes = size_t(num_pages * page_stride[0] * esize);
    k_pages.assign(bytes, char(0x7f));  // unused rows: garbage, never read
    v_pages.assign(bytes, char(0x7f));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < kv_heads; ++h)
        for (int64_t j = 0; j < n; ++j) {
          const int64_t page = block_table[size_t(b * per_seq + j / page_size)];
          const int64_t to = (page * page_stride[0] + h * page_stride[1] + j % page_size * d) * esize;
          const int64_t k_from = (b * a.k.stride[0] + h * a.k.stride[1] + j * a.k.stride[2]) * esize;
          const int64_t v_from = (b * a.v.stride[0] + h * a.v.stride[1] + j * a.v.stride[2]) * esize;
          std::memcpy(&k_pages[size_t(to)], static_cast<const char*>(a.k.data) + k_from, size_t(d * esize));
          std::memcpy(&v_pages[size_t(to)], static_cast<const char*>(a.v.data) + v_from, size_t(d * esize));
        }
    args.k = {k_pages.data(), page_stride};
    args.v = {v_pages.data(), page_stride};
    args.kv.block_table = block_table.data();
    args.kv.block_table_stride = per_seq;
    args.kv.page_size = page_size;
    args.kv.num_pages = num_pages;
    args.kv.seqlens = seqlens.data();
  }
};

// Outputs of one run, for bitwise comparisons.
struct Outputs {
  std::vector<float> o32, lse;
  std::vector<uint16_t> o16;
  explicit Outputs(const CaseData& data) : o32(data.o32), lse(data.lse), o16(data.o16) {}
  bool operator==(const Outputs& other) const {
    return o32 == other.o32 && o16 == other.o16 &&
           std::memcmp(lse.data(), other.lse.data(), lse.size() * 4) == 0;
  }
};

// NaN everywhere in the outputs, so that an output the next run fails to write shows.
void poison_outputs(CaseData& data) {
  std::fill(data.o32.begin(), data.o32.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(data.o16.begin(), data.o16.end(), uint16_t(0x7fff));
  std::fill(data.lse.begin(), data.lse.end(), std::numeric_limits<float>::quiet_NaN());
}

class Avx512EmulatedDecode : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!isa_available(Isa::avx2))
      GTEST_SKIP() << "the few-rows products run natively and need AVX2, FMA and F16C";
  }

  // Runs `args` (into data's outputs) on the emulated AVX-512 path, checks
  // that the few-rows products ran exactly when expected and that the result
  // matches the float64 reference (computed from data.args, contiguous).
  static void run_and_check(const CaseData& data, const ForwardArgs& args, bool few_rows,
                            const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(emulated_avx512_takes_few_rows_path(args), few_rows);
    const int64_t calls_before = NativeFewRowsKernels::calls();
    ASSERT_TRUE(emulated_avx512_forward(args));
    const int64_t calls = NativeFewRowsKernels::calls() - calls_before;
    if (few_rows) EXPECT_GT(calls, 0) << "the few-rows products were not called";
    else EXPECT_EQ(calls, 0) << "past kFewRowsMax rows the packed products must run";
    const Comparison cmp = compare_with_reference(data);
    EXPECT_TRUE(cmp.ok()) << cmp.describe();
  }
};

TEST_F(Avx512EmulatedDecode, EveryStackedRowCountDtypeAndHeadDimMatchesFloat64) {
  for (const Stack& st : kFewRowStacks)
    for (DType dtype : kDTypes)
      for (int64_t head_dim : {1, 7, 9, 16, 59, 64, 111, 128}) {
        // 100 keys: a full key tile and a partial one on every plan.
        CaseData data(decode_case(st, dtype, head_dim, 100));
        const std::string what = data.c.name();
        data.args.threads = 1;
        run_and_check(data, data.args, true, what + " 1 thread");
        const Outputs one(data);
        poison_outputs(data);
        data.args.threads = 2;
        run_and_check(data, data.args, true, what + " 2 threads");
        EXPECT_TRUE(Outputs(data) == one) << what << ": 1 and 2 threads differ";
      }
}

TEST_F(Avx512EmulatedDecode, PagedKeysAndValuesEqualContiguousBitwise) {
  const Stack stacks[] = {{1, 1}, {4, 1}, {8, 1}, {3, 2}, {4, 2}};
  for (const Stack& st : stacks)
    for (DType dtype : kDTypes)
      for (int64_t head_dim : {9, 64, 111})
        for (int64_t page_size : {1, 3, 16}) {
          CaseData data(decode_case(st, dtype, head_dim, 77));
          const std::string what = data.c.name() + " page " + std::to_string(page_size);
          run_and_check(data, data.args, true, what + " contiguous");
          const Outputs contiguous(data);
          const PagedCopy paged(data, page_size);
          poison_outputs(data);
          run_and_check(data, paged.args, true, what + " paged");
          EXPECT_TRUE(Outputs(data) == contiguous) << what << ": paged differs from contiguous";
        }
}

// Key counts around AVX-512's key tile (partial tiles, tiles of fewer than 8
// keys, one key) and long enough to be split into key ranges and merged.
TEST_F(Avx512EmulatedDecode, ShortSequencesPartialTilesAndKeySplits) {
  for (DType dtype : kDTypes)
    for (int64_t seqlen_k : {2, 7, 8, 63, 64, 65, 129, 1100, 2500})
      for (const Stack& st : {Stack{4, 1}, Stack{3, 2}}) {
        CaseData data(decode_case(st, dtype, 59, seqlen_k));
        const bool split = detail::plan_forward(data.args, Isa::avx512, 1).kv_splits > 1;
        EXPECT_EQ(split, seqlen_k >= 1100) << data.c.name();
        run_and_check(data, data.args, true, data.c.name());
        if (split) {
          const PagedCopy paged(data, 16);
          const Outputs contiguous(data);
          poison_outputs(data);
          run_and_check(data, paged.args, true, data.c.name() + " paged");
          EXPECT_TRUE(Outputs(data) == contiguous) << data.c.name() << ": paged differs";
        }
      }
}

// One stacked row past the limit (9, and 10 = 5 heads x 2 tokens): the packed
// products run, with the same accuracy.
TEST_F(Avx512EmulatedDecode, PastTheRowLimitThePackedProductsRun) {
  ASSERT_EQ(NativeFewRowsKernels::kFewRowsMax, 8);
  for (const Stack& st : {Stack{9, 1}, Stack{5, 2}})
    for (DType dtype : kDTypes) {
      CaseData data(decode_case(st, dtype, 59, 100));
      run_and_check(data, data.args, false, data.c.name());
    }
}

// K and V of a contiguous case quantized into int8 (a scale per key and KV
// head: max|x| / 127) or fp8 e4m3 (a scale per KV head), with the
// ForwardArgs that read them: the quantized-cache source of the main loop.
struct QuantizedCopy {
  std::vector<uint8_t> k, v;
  std::vector<float> k_scale, v_scale;
  ForwardArgs args;

  QuantizedCopy(const CaseData& data, KvQuant quant) : args(data.args) {
    const ForwardArgs& a = data.args;
    const int64_t batch = a.shape.batch, kv_heads = a.shape.kv_heads, n = a.shape.seqlen_k;
    const int64_t d = a.shape.head_dim;
    const std::array<int64_t, 4> stride{kv_heads * n * d, n * d, d, 1};
    k.resize(size_t(batch * stride[0]));
    v.resize(k.size());
    const bool int8 = quant == KvQuant::int8;
    k_scale.assign(size_t(int8 ? batch * kv_heads * n : kv_heads), 0.02f);
    v_scale.assign(k_scale.size(), 0.03f);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < kv_heads; ++h)
        for (int64_t j = 0; j < n; ++j)
          for (int which = 0; which < 2; ++which) {
            const InputView& src = which == 0 ? a.k : a.v;
            std::vector<uint8_t>& dst = which == 0 ? k : v;
            std::vector<float>& scales = which == 0 ? k_scale : v_scale;
            const int64_t from = b * src.stride[0] + h * src.stride[1] + j * src.stride[2];
            float amax = 0.0f;
            for (int64_t c = 0; c < d; ++c)
              amax = std::max(amax, std::fabs(detail::load_element(src.data, int(a.dtype), from + c)));
            float& scale = scales[size_t(int8 ? (b * kv_heads + h) * n + j : h)];
            if (int8) scale = amax > 0.0f ? amax / 127.0f : 1.0f;
            for (int64_t c = 0; c < d; ++c) {
              const float x = detail::load_element(src.data, int(a.dtype), from + c) / scale;
              dst[size_t(b * stride[0] + h * stride[1] + j * stride[2] + c)] =
                  int8 ? uint8_t(int8_t(std::nearbyint(x))) : detail::float_to_f8e4m3(x);
            }
          }
    args.k = {k.data(), stride};
    args.v = {v.data(), stride};
    args.kv.quant = quant;
    args.kv.k_scale = k_scale.data();
    args.kv.v_scale = v_scale.data();
    args.kv.k_scale_stride = int8 ? std::array<int64_t, 3>{kv_heads * n, n, 1} : std::array<int64_t, 3>{0, 1, 0};
    args.kv.v_scale_stride = args.kv.k_scale_stride;
  }
};

// The output of a run over `quantized` against float64 attention over the
// dequantized K/V, by the tolerance rule.
void expect_matches_float64(const QuantizedCopy& quantized, const CaseData& data) {
  const Comparison cmp = compare_outputs(quantized.args, reference_forward(quantized.args),
                                         naive_forward(quantized.args), dense_o(data), dense_lse(data));
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
}

// Quantized K/V on the emulated AVX-512 main loop: the few-rows products
// (with the scales applied per key) and, past the row limit, the packed ones
// (the emulated Kernels' int8 / fp8 loads), against the float64 reference
// over the dequantized K/V; split keys included.
TEST_F(Avx512EmulatedDecode, QuantizedKeysAndValuesMatchFloat64) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3})
    for (DType dtype : kDTypes)
      for (const Stack& st : {Stack{4, 1}, Stack{3, 2}, Stack{9, 1}})
        for (int64_t seqlen_k : {100, 1100}) {
          CaseData data(decode_case(st, dtype, 59, seqlen_k));
          const QuantizedCopy quantized(data, quant);
          const std::string what = data.c.name() + " " + kv_quant_name(quant);
          SCOPED_TRACE(what);
          const bool few_rows = st.group * st.seqlen_q <= 8;
          EXPECT_EQ(emulated_avx512_takes_few_rows_path(quantized.args), few_rows);
          ASSERT_TRUE(emulated_avx512_forward(quantized.args));
          expect_matches_float64(quantized, data);
        }
}

// An int8 cache on the emulated amx rung (its few-rows products on FMAs, as
// the avx512 rung's), against the float64 reference over the dequantized K/V,
// split keys included.
TEST_F(Avx512EmulatedDecode, Int8CacheOnTheEmulatedAmxRungMatchesFloat64) {
  for (DType dtype : kDTypes)
    for (const Stack& st : {Stack{4, 1}, Stack{3, 2}, Stack{8, 1}, Stack{1, 1}})
      for (int64_t head_dim : {60, 128, 59})
        for (int64_t seqlen_k : {100, 1100}) {
          CaseData data(decode_case(st, dtype, head_dim, seqlen_k));
          const QuantizedCopy quantized(data, KvQuant::int8);
          SCOPED_TRACE(data.c.name() + " int8 on the emulated amx rung");
          ASSERT_TRUE(emulated_bf16_forward(quantized.args, Isa::amx));
          expect_matches_float64(quantized, data);
        }
}

// An fp8 e4m3 cache on the emulated avx512bf16 and amx rungs (the amx rung
// takes the avx512bf16 rung's decode scores): with bf16 queries the few-rows
// scores run on vdpbf16ps with the keys turned into bf16 by byte permutes
// (few_rows_dot.hpp; head dims 59 and 96 end in a partial 64-element step),
// other query dtypes keep the FMA scores; P V on the FMA products either way.
// Against the float64 reference over the dequantized K/V, split keys
// included; the emulation's vpermt2b count shows which scores ran.
TEST_F(Avx512EmulatedDecode, Fp8CacheOnTheEmulatedDotScoresMatchesFloat64) {
  for (Isa isa : {Isa::avx512bf16, Isa::amx})
    for (DType dtype : kDTypes)
      for (const Stack& st : {Stack{4, 1}, Stack{3, 2}, Stack{8, 1}, Stack{1, 1}})
        for (int64_t head_dim : {59, 96, 128})
          for (int64_t seqlen_k : {100, 1100}) {
            CaseData data(decode_case(st, dtype, head_dim, seqlen_k));
            const QuantizedCopy quantized(data, KvQuant::fp8_e4m3);
            SCOPED_TRACE(data.c.name() + " fp8 on the emulated " + isa_name(isa) + " rung");
            const int64_t before = emulated_byte_permute_count();
            ASSERT_TRUE(emulated_bf16_forward(quantized.args, isa));
            EXPECT_EQ(emulated_byte_permute_count() > before, dtype == DType::bf16);
            expect_matches_float64(quantized, data);
          }
}

// bf16 queries against an int8 or fp8 e4m3 cache in steps past the few-rows
// limit (9 rows of one group, 4 heads x 4 tokens, 40 tokens: chunked prefill):
// the packed products of the emulated avx512bf16 and amx rungs run on bf16,
// the cache's bytes converted to bf16 rows (Bf16Operands::stage_rows), the K
// scales on each band's finished scores, P times the V scales written by the
// exponentials. With the plan's key tiles and with 128-key tiles, whose
// 32-row bands the amx rung queues (the scores finish after the next call).
// Against the float64 reference over the dequantized K/V, split keys
// included; on avx512bf16 the vdpbf16ps count shows the bf16 products ran,
// and the vpdpbusd count that P V's lo ran on int8 products where more than
// 32 rows share a V tile (40 tokens; Bf16Operands::begin_item), except where
// a tile's V scales leave [2^-40, 2^40] (V scales times 2^-45: the bf16 lo).
// The tiles pack from the cache's bytes with unit element stride
// (QuantizedRows; fp8 on the byte permutes, E4m3PermuteRows, whose count
// shows), through staged bf16 rows otherwise (stage_rows): a copy of the
// cache with element stride 2 gives the same output bit for bit, and so do
// fp8 rows through the fp32 loads (CPUs without VBMI).
TEST_F(Avx512EmulatedDecode, QuantizedCachePrefillOnTheEmulatedBf16Products) {
  for (Isa isa : {Isa::avx512bf16, Isa::amx})
    for (KvQuant quant : {KvQuant::int8, KvQuant::fp8_e4m3})
      for (const Stack& st : {Stack{9, 1}, Stack{4, 4}, Stack{1, 40}})
        for (int64_t head_dim : {59, 128})
          for (int64_t seqlen_k : {100, 1100})
            for (int block_kv : {0, 128})
              for (bool tiny_v_scales : {false, true}) {
                if (tiny_v_scales && (head_dim != 128 || block_kv != 0)) continue;
                CaseData data(decode_case(st, DType::bf16, head_dim, seqlen_k));
                QuantizedCopy quantized(data, quant);
                quantized.args.block_kv = block_kv;
                if (tiny_v_scales)
                  for (float& scale : quantized.v_scale) scale *= 0x1p-45f;
                SCOPED_TRACE(data.c.name() + " " + kv_quant_name(quant) + " on the emulated " + isa_name(isa) +
                             " rung, block_kv " + std::to_string(block_kv) + (tiny_v_scales ? ", tiny V scales" : ""));
                const int64_t dots = emulated_bf16_dot_count(), int8_dots = emulated_int8_dot_count();
                const int64_t permutes = emulated_byte_permute_count();
                ASSERT_TRUE(emulated_bf16_forward(quantized.args, isa));
                EXPECT_EQ(emulated_byte_permute_count() > permutes, quant == KvQuant::fp8_e4m3);
                if (isa == Isa::avx512bf16) {
                  EXPECT_GT(emulated_bf16_dot_count(), dots);
                  EXPECT_EQ(emulated_int8_dot_count() > int8_dots, st.group * st.seqlen_q > 32 && !tiny_v_scales);
                }
                expect_matches_float64(quantized, data);
                if (head_dim != 59 || block_kv != 0 || tiny_v_scales) continue;
                const Outputs unit_stride(data);
                poison_outputs(data);
                std::vector<uint8_t> k2(2 * quantized.k.size()), v2(2 * quantized.v.size());
                for (size_t i = 0; i < quantized.k.size(); ++i) k2[2 * i] = quantized.k[i], v2[2 * i] = quantized.v[i];
                ForwardArgs strided = quantized.args;
                for (int i = 0; i < 4; ++i) strided.k.stride[i] *= 2, strided.v.stride[i] *= 2;
                strided.k.data = k2.data();
                strided.v.data = v2.data();
                ASSERT_TRUE(emulated_bf16_forward(strided, isa));
                EXPECT_TRUE(Outputs(data) == unit_stride) << "element stride 2 differs from unit stride";
                if (quant != KvQuant::fp8_e4m3) continue;
                poison_outputs(data);
                emulated_fp8_rows_on_fp32(true);
                const int64_t before = emulated_byte_permute_count();
                const bool ran = emulated_bf16_forward(quantized.args, isa);
                emulated_fp8_rows_on_fp32(false);
                ASSERT_TRUE(ran);
                EXPECT_EQ(emulated_byte_permute_count(), before) << "fp8 rows on the fp32 loads ran permutes";
                EXPECT_TRUE(Outputs(data) == unit_stride) << "fp8 rows on the fp32 loads differ";
              }
}

// A bf16 cache on the emulated avx512bf16 and amx rungs: the decode scores
// run on vdpbf16ps on avx512bf16 and on FMAs on amx (where one vdpbf16ps
// holds both FMA ports for two cycles, amx_kernels.hpp); P V on FMAs on both.
// The emulation's vdpbf16ps count shows which scores ran; both against the
// float64 reference, split keys included.
TEST_F(Avx512EmulatedDecode, Bf16CacheScoresOnDotProductsExceptOnTheAmxRung) {
  for (Isa isa : {Isa::avx512bf16, Isa::amx})
    for (const Stack& st : {Stack{4, 1}, Stack{3, 2}, Stack{8, 1}, Stack{1, 1}})
      for (int64_t head_dim : {59, 128})
        for (int64_t seqlen_k : {100, 1100}) {
          CaseData data(decode_case(st, DType::bf16, head_dim, seqlen_k));
          SCOPED_TRACE(data.c.name() + " bf16 cache on the emulated " + isa_name(isa) + " rung");
          const int64_t before = emulated_bf16_dot_count();
          ASSERT_TRUE(emulated_bf16_forward(data.args, isa));
          EXPECT_EQ(emulated_bf16_dot_count() > before, isa == Isa::avx512bf16);
          const Comparison cmp = compare_with_reference(data);
          EXPECT_TRUE(cmp.ok()) << cmp.describe();
        }
}

// bf16_probabilities on the emulated avx512bf16 rung: the few-rows P V of a
// bf16 cache runs on vdpbf16ps with P rounded to bf16
// (few_rows_dot::accumulate_bf16_probabilities; head dims 40, 48 and 59 end
// in a masked 32-column group of 8, 16 and 27 columns, 96 and 128 in whole
// groups; odd key counts pair the last key with zeros, 1100 keys split).
// Within the rule plus bf16_probabilities' bound (2^-8 of each row's largest
// P |V|, tests/core's Bf16Probabilities), and different from the default's
// output, where P keeps fp32 precision: the flag changes only P V, so a
// difference shows that the rounded products ran. Paged K/V (pages of 3,
// shuffled: key pairs straddle pages) give the contiguous result bit for bit.
TEST_F(Avx512EmulatedDecode, Bf16ProbabilitiesOnTheEmulatedDotProducts) {
  for (const Stack& st : {Stack{4, 1}, Stack{3, 2}, Stack{8, 1}, Stack{1, 1}})
    for (int64_t head_dim : {40, 48, 59, 96, 128})
      for (int64_t seqlen_k : {99, 1100}) {
        CaseData exact(decode_case(st, DType::bf16, head_dim, seqlen_k));
        CaseData rounded(exact.c);
        rounded.args.bf16_probabilities = true;
        SCOPED_TRACE(exact.c.name() + " with bf16_probabilities on the emulated avx512bf16 rung");
        ASSERT_TRUE(emulated_bf16_forward(exact.args, Isa::avx512bf16));
        ASSERT_TRUE(emulated_bf16_forward(rounded.args, Isa::avx512bf16));
        EXPECT_NE(rounded.o16, exact.o16) << "bf16_probabilities changed nothing";
        const Comparison cmp =
            compare_outputs(rounded.args, reference_forward(rounded.args), naive_forward(rounded.args),
                            dense_o(rounded), dense_lse(rounded), 0, p_abs_v_allowance(rounded.c));
        EXPECT_TRUE(cmp.ok()) << cmp.describe();
        if (head_dim != 59) continue;
        const Outputs contiguous(rounded);
        poison_outputs(rounded);
        const PagedCopy paged(rounded, 3);
        ASSERT_TRUE(emulated_bf16_forward(paged.args, Isa::avx512bf16));
        EXPECT_TRUE(Outputs(rounded) == contiguous) << "paged differs from contiguous";
      }
}

// bf16_probabilities with a quantized cache on the emulated avx512bf16 rung:
// P V of bf16 queries runs on vdpbf16ps too, V turned into bf16 of the same
// values (fp8 e4m3 by the byte permutes, 64 columns per conversion in whole
// 64-column passes, else 32; int8 widened through fp32, 32 columns at a
// time; head dims 40, 59 and 96 end in masked or 32-column groups), P times
// each key's V scale rounded to bf16. Within the rule plus 2^-8 of each
// row's largest P |V| (float64 over the dequantized |V|: e4m3's sign bit
// cleared, int8's magnitudes) and different from the default's output.
// Some int8 V elements are -128, which the cache reads though an append
// never writes it (its |V| is taken as 127 in the allowance: 1/128 of one
// key's share of a column).
TEST_F(Avx512EmulatedDecode, QuantizedCacheBf16ProbabilitiesOnTheEmulatedDotProducts) {
  for (KvQuant quant : {KvQuant::fp8_e4m3, KvQuant::int8})
    for (const Stack& st : {Stack{4, 1}, Stack{3, 2}, Stack{8, 1}, Stack{1, 1}})
      for (int64_t head_dim : {40, 59, 96, 128})
        for (int64_t seqlen_k : {99, 1100}) {
          const bool int8 = quant == KvQuant::int8;
          CaseData data(decode_case(st, DType::bf16, head_dim, seqlen_k));
          QuantizedCopy exact(data, quant);
          if (int8)
            for (size_t e = 7; e < exact.v.size(); e += 101) exact.v[e] = 0x80;
          QuantizedCopy rounded(data, quant);
          std::copy(exact.v.begin(), exact.v.end(), rounded.v.begin());
          rounded.args.bf16_probabilities = true;
          SCOPED_TRACE(data.c.name() + (int8 ? " int8" : " fp8") +
                       " with bf16_probabilities on the emulated avx512bf16 rung");
          ASSERT_TRUE(emulated_bf16_forward(exact.args, Isa::avx512bf16));
          const std::vector<uint16_t> exact_o = data.o16;
          ASSERT_TRUE(emulated_bf16_forward(rounded.args, Isa::avx512bf16));
          EXPECT_NE(data.o16, exact_o) << "bf16_probabilities changed nothing";
          QuantizedCopy abs_v(data, quant);
          for (size_t e = 0; e < abs_v.v.size(); ++e)
            abs_v.v[e] = int8 ? uint8_t(std::min(std::abs(int(int8_t(exact.v[e]))), 127)) : uint8_t(exact.v[e] & 0x7f);
          const ReferenceOutput pv = reference_forward(abs_v.args);
          const size_t dv = size_t(head_dim);
          std::vector<double> allowance(pv.o.size() / dv, 0.0);
          for (size_t row = 0; row < allowance.size(); ++row)
            for (size_t e = row * dv; e < (row + 1) * dv; ++e)
              allowance[row] = std::max(allowance[row], std::ldexp(pv.o[e], -8));
          const Comparison cmp = compare_outputs(rounded.args, reference_forward(rounded.args),
                                                 naive_forward(rounded.args), dense_o(data), dense_lse(data), 0,
                                                 allowance);
          EXPECT_TRUE(cmp.ok()) << cmp.describe();
        }
}

}  // namespace
}  // namespace tileattn::testing
