// ForwardArgs::fp32_output: 16-bit inputs with O written in fp32. On every
// path (forced), over the whole case table in fp16 and in bf16:
// - rounding the fp32 O to the inputs' dtype gives the ordinary call's O bit
//   for bit (the only difference is the final rounding), the LSE equal;
// - the fp32 O meets the fp32 accuracy rule against float64 over the same
//   (widened) inputs, with the naive fp32 implementation as the yardstick:
//   the paths compute in fp32, so nothing of the 16-bit storage is left in O.
//   The bf16 rungs' P V takes P as bf16 hi + lo, 2^-16 of P's precision
//   (docs/accuracy.md), so there each row is allowed 2^-16 x its largest
//   (P |V|) on top; on avx512bf16, whose lo products round V to 8 bits of
//   its tile column's largest |V| (isa/avx512bf16/lo_int8.hpp; |lo| <=
//   2^-8 P), also 2^-16 x the largest |V|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "core/half.hpp"
#include "testing/case_table.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

std::vector<Case> fp32_output_table() {
  std::vector<Case> cases;
  std::set<std::string> names;
  for (DType dtype : {DType::f16, DType::bf16})
    for (Case c : correctness_cases()) {
      c.dtype = dtype;
      if (names.insert(c.name()).second) cases.push_back(c);
    }
  return cases;
}

float widen(uint16_t bits, DType dtype) {
  return dtype == DType::f16 ? detail::f16_to_float(bits) : detail::bf16_to_float(bits);
}
uint16_t narrow(float value, DType dtype) {
  return dtype == DType::f16 ? detail::float_to_f16(value) : detail::float_to_bf16(value);
}

// The fp32 O of `args` (its dtype 16-bit) in a buffer of O's element count
// (O's strides are dense in the case table), and its LSE.
struct WideRun {
  std::vector<float> o, lse;
};

WideRun run_wide(const CaseData& data, Isa isa, size_t o_elements) {
  WideRun run;
  run.o.assign(o_elements, -7.0f);
  run.lse.assign(data.lse.size(), 0.0f);
  ForwardArgs wide = data.args;
  wide.isa = isa;
  wide.fp32_output = true;
  wide.o.data = run.o.data();
  if (wide.lse) wide.lse = run.lse.data();
  attention_forward(wide);
  return run;
}

class Fp32Output : public ::testing::TestWithParam<Case> {};

TEST_P(Fp32Output, RoundsToTheOrdinaryOutputAndMeetsTheFp32Rule) {
  const Case c = GetParam();
  // The fp32 twin: the same case (same draws: masks, lengths) in fp32, its
  // inputs replaced by the 16-bit inputs widened.
  Case c32 = c;
  c32.dtype = DType::f32;
  const CaseData inputs(c);
  const auto widened = [&] {
    auto data = std::make_unique<CaseData>(c32);
    for (size_t i = 0; i < inputs.q16.size(); ++i) data->q32[i] = widen(inputs.q16[i], c.dtype);
    for (size_t i = 0; i < inputs.k16.size(); ++i) data->k32[i] = widen(inputs.k16[i], c.dtype);
    for (size_t i = 0; i < inputs.v16.size(); ++i) data->v32[i] = widen(inputs.v16[i], c.dtype);
    return data;
  };
  const std::unique_ptr<CaseData> twin_data = widened();
  CaseData& twin = *twin_data;
  const ReferenceOutput ref = reference_forward(twin.args), naive = naive_forward(twin.args);
  const bool bf16_products = c.dtype == DType::bf16;
  std::vector<double> hi_lo_allowance, lo_int8_allowance;
  double largest_v = 0.0;
  for (uint16_t bits : inputs.v16)
    if (std::isfinite(widen(bits, c.dtype))) largest_v = std::max(largest_v, double(std::fabs(widen(bits, c.dtype))));
  std::vector<Isa> paths;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx, Isa::reference})
    if (isa == Isa::reference || isa_available(isa)) paths.push_back(isa);
  // Under the sanitizers one path per case, in turn (ForwardCases runs every
  // path there): the seed numbers the table's cases, each in fp16 and bf16.
  const int64_t case_index = 2 * int64_t(c.seed) + (c.dtype == DType::bf16);
  for (size_t path = 0; path < paths.size(); ++path) {
    if (!in_quick_share(case_index, int64_t(path), int64_t(paths.size()))) continue;
    const Isa isa = paths[path];
    SCOPED_TRACE(c.name() + " on " + isa_name(isa));
    CaseData data(c);
    data.args.isa = isa;
    attention_forward(data.args);
    const WideRun wide = run_wide(data, isa, data.o16.size());
    // Accuracy: the fp32 O as the twin's output (O's elements only: strided
    // cases leave gaps between rows).
    for (size_t i = 0; i < wide.o.size(); ++i) twin.o32[i] = wide.o[i];
    if (twin.args.lse) std::memcpy(twin.lse.data(), wide.lse.data(), wide.lse.size() * sizeof(float));
    const std::vector<double> o = dense_o(twin), lse = dense_lse(twin), ordinary = dense_o(data);
    for (size_t i = 0; i < o.size(); ++i) {
      const uint16_t rounded = narrow(float(o[i]), c.dtype), written = narrow(float(ordinary[i]), c.dtype);
      if (rounded != written && !(std::isnan(o[i]) && std::isnan(ordinary[i]))) {
        ADD_FAILURE() << "O element " << i << ": fp32 " << o[i] << " rounds to bits " << rounded
                      << ", the ordinary call wrote " << written;
        break;
      }
    }
    EXPECT_EQ(std::memcmp(wide.lse.data(), data.lse.data(), data.lse.size() * sizeof(float)), 0)
        << "the LSE differs from the ordinary call's";
    const bool hi_lo = bf16_products && (isa == Isa::avx512bf16 || isa == Isa::amx);
    if (hi_lo && hi_lo_allowance.empty()) {
      hi_lo_allowance = p_abs_v_allowance(c);  // 2^-8 (P |V|) per row
      for (double& a : hi_lo_allowance) a = std::ldexp(a, -8);
    }
    if (hi_lo && isa == Isa::avx512bf16 && lo_int8_allowance.empty()) {
      lo_int8_allowance = hi_lo_allowance;
      for (double& a : lo_int8_allowance) a += std::ldexp(largest_v, -16);
    }
    const std::vector<double>& allowance =
        !hi_lo ? std::vector<double>{} : isa == Isa::avx512bf16 ? lo_int8_allowance : hi_lo_allowance;
    // The yardstick: the naive fp32 implementation, or where the fp32 path
    // itself breaks the rule on these values (large scores, docs/accuracy.md
    // "Where the rule does not hold": ALiBi rows at |S| ~ 50 on generic), the
    // fp32 forward of the same values on the same path: fp32_output adds no
    // error of its own.
    const Comparison cmp = compare_outputs(twin.args, ref, naive, o, lse, 0, allowance);
    const std::unique_ptr<CaseData> own = widened();
    own->args.isa = isa;
    attention_forward(own->args);
    ReferenceOutput own_fp32;
    own_fp32.o = dense_o(*own);
    own_fp32.lse = own->args.lse ? dense_lse(*own) : naive.lse;
    const Comparison against_own = compare_outputs(twin.args, ref, own_fp32, o, lse, 0, allowance);
    EXPECT_TRUE(cmp.ok() || against_own.ok()) << "against naive: " << cmp.describe()
                                              << "; against the fp32 forward: " << against_own.describe();
    // The checks bite: outputs moved by 1e-4 (1e-3 on top of the hi + lo
    // allowance), beyond any fp32 result and below 16-bit rounding, fail both.
    const double perturb = hi_lo ? 1e-3 : 1e-4;
    EXPECT_FALSE(compare_outputs(twin.args, ref, naive, o, lse, perturb, allowance).ok())
        << "perturbed outputs passed against naive";
    EXPECT_FALSE(compare_outputs(twin.args, ref, own_fp32, o, lse, perturb, allowance).ok())
        << "perturbed outputs passed against the fp32 forward";
  }
}

std::string fp32_output_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.name();
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Table, Fp32Output, ::testing::ValuesIn(fp32_output_table()), fp32_output_name);

TEST(Fp32OutputArgs, BackwardRefusesIt) {
  Case c = correctness_cases().front();
  c.dtype = DType::bf16;
  CaseData data(c);
  std::vector<uint16_t> grads(data.q16.size() + 2 * data.k16.size() + data.v16.size());
  BackwardArgs b;
  b.forward = data.args;
  b.forward.fp32_output = true;
  b.o = {data.o16.data(), data.args.o.stride};
  b.d_o = {data.o16.data(), data.args.o.stride};
  std::vector<float> lse(data.lse.size() + size_t(c.heads * c.seqlen_q * c.batch), 0.0f);
  b.lse = lse.data();
  b.lse_stride = {c.heads * c.seqlen_q, c.seqlen_q, 1};
  b.dq = {grads.data(), data.args.q.stride};
  b.dk = {grads.data() + data.q16.size(), data.args.k.stride};
  b.dv = {grads.data() + data.q16.size() + data.k16.size(), data.args.v.stride};
  EXPECT_THROW(attention_backward(b), NotSupported);
}

// The overlap checks size O's elements as 4 bytes: an fp32 O whose last
// element's upper half is q's first bf16 element (2-byte elements would end
// before q) is refused, by the forward and by the KV-cache call (there
// against the cache).
TEST(Fp32OutputArgs, OverlapChecksTakeFourByteElements) {
  constexpr int64_t d = 16;
  alignas(64) static uint16_t memory[4096];
  float* o = reinterpret_cast<float*>(memory);  // d floats: bytes [0, 4d)
  uint16_t* after_o = memory + 2 * d - 1;       // bytes [4d - 2, ...): o's last element's upper half
  std::vector<uint16_t> k(4 * d, 0x3f80), v(4 * d, 0x3f80);
  ForwardArgs f;
  f.shape = {1, 1, 1, 1, 4, d};
  f.dtype = DType::bf16;
  f.fp32_output = true;
  f.q = {after_o, dense_strides(Layout::bhsd, 1, 1, 1, d)};
  f.k = {k.data(), dense_strides(Layout::bhsd, 1, 1, 4, d)};
  f.v = {v.data(), f.k.stride};
  f.o = {o, f.q.stride};
  try {
    validate(f);
    ADD_FAILURE() << "an fp32 O overlapping q's first element was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlaps"), std::string::npos) << e.what();
  }
  f.q.data = after_o + 1;  // just past o's last byte
  EXPECT_NO_THROW(validate(f));

  std::vector<uint16_t> q(d, 0x3f80);
  std::vector<int32_t> lengths{2};
  KvCacheArgs a;
  a.batch = a.heads = a.kv_heads = 1;
  a.head_dim = d;
  a.dtype = DType::bf16;
  a.seqlen_q = 1;
  a.q = {q.data(), dense_strides(Layout::bhsd, 1, 1, 1, d)};
  a.o = {o, a.q.stride};
  a.fp32_output = true;
  a.k_cache = {after_o, dense_strides(Layout::bhsd, 1, 1, 4, d)};
  a.v_cache = {k.data(), a.k_cache.stride};
  a.capacity = 4;
  a.cache_seqlens = lengths.data();
  try {
    attention_with_kvcache(a);
    ADD_FAILURE() << "an fp32 O overlapping the K cache's first element was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_cache"), std::string::npos) << e.what();
  }
  a.k_cache.data = after_o + 1;
  EXPECT_NO_THROW(attention_with_kvcache(a));
}

}  // namespace
}  // namespace tileattn::testing
