// The C API computes exactly what the C++ API computes: same inputs, same
// bits out, for every dtype, layout, mask kind, GQA and packed batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "capi/c_args.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/tileattn.h"

namespace tileattn {
namespace {

using testing::Case;
using testing::CaseData;
using testing::MaskCase;

std::vector<unsigned char> output_bytes(const CaseData& d) {
  const unsigned char* p = d.c.dtype == DType::f32 ? reinterpret_cast<const unsigned char*>(d.o32.data())
                                                   : reinterpret_cast<const unsigned char*>(d.o16.data());
  const size_t n = d.c.dtype == DType::f32 ? d.o32.size() * 4 : d.o16.size() * 2;
  return {p, p + n};
}

void clear_outputs(CaseData& d) {
  std::fill(d.o32.begin(), d.o32.end(), 0.0f);
  std::fill(d.o16.begin(), d.o16.end(), uint16_t(0));
  std::fill(d.lse.begin(), d.lse.end(), 0.0f);
}

class CApiForward : public ::testing::TestWithParam<Case> {};

TEST_P(CApiForward, BitwiseEqualToCpp) {
  CaseData data(GetParam());
  data.args.threads = 2;
  attention_forward(data.args);
  const std::vector<unsigned char> cpp_o = output_bytes(data);
  const std::vector<float> cpp_lse = data.lse;

  clear_outputs(data);
  const tileattn_forward_args c = capi_testing::to_c_args(data.args);
  ASSERT_EQ(tileattn_forward(&c), TILEATTN_OK) << tileattn_last_error();
  EXPECT_STREQ(tileattn_last_error(), "");
  EXPECT_TRUE(output_bytes(data) == cpp_o) << "O differs between the C and C++ APIs";
  ASSERT_EQ(data.lse.size(), cpp_lse.size());
  EXPECT_EQ(std::memcmp(data.lse.data(), cpp_lse.data(), cpp_lse.size() * 4), 0)
      << "LSE differs between the C and C++ APIs";
  // And the result is right, not merely the same.
  const testing::Comparison cmp = testing::compare_with_reference(data);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
}

std::vector<Case> cases() {
  std::vector<Case> out;
  Case base;
  base.batch = 2;
  base.heads = 4;
  base.kv_heads = 2;
  base.seqlen_q = 37;
  base.seqlen_k = 70;
  base.head_dim = 59;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (MaskCase mask : {MaskCase::none, MaskCase::causal, MaskCase::window, MaskCase::boolean,
                          MaskCase::additive, MaskCase::causal_boolean}) {
      Case c = base;
      c.dtype = dtype;
      c.mask = mask;
      out.push_back(c);
    }
  }
  Case bshd_strided = base;
  bshd_strided.layout = Layout::bshd;
  bshd_strided.strided = true;
  bshd_strided.mask = MaskCase::causal;
  bshd_strided.head_dim = 64;
  out.push_back(bshd_strided);
  Case mqa = base;
  mqa.kv_heads = 1;
  mqa.scale = 0.3f;
  out.push_back(mqa);
  for (DType dtype : {DType::f32, DType::bf16}) {
    Case capped = base;  // scores beyond the cap (testing/case_table.cpp)
    capped.dtype = dtype;
    capped.mask = MaskCase::causal;
    capped.softcap = 5.0f;
    capped.input_scale = 4.0f;
    out.push_back(capped);
    Case alibi = base;
    alibi.dtype = dtype;
    alibi.alibi = Case::Alibi::batch_heads;
    out.push_back(alibi);
    Case sinks = base;
    sinks.dtype = dtype;
    sinks.mask = MaskCase::causal;
    sinks.sinks = true;
    out.push_back(sinks);
  }
  Case varlen = base;
  varlen.varlen = true;
  varlen.varlen_q_lengths = {5, 0, 33};
  varlen.varlen_k_lengths = {9, 4, 40};
  varlen.mask = MaskCase::causal;
  out.push_back(varlen);
  // V's head dim apart from Q/K's (the appended v_head_dim field).
  for (auto [d, dv, dtype] : {std::tuple<int64_t, int64_t, DType>{192, 128, DType::f32}, {576, 512, DType::bf16}}) {
    Case mla = base;
    mla.head_dim = d;
    mla.v_head_dim = dv;
    mla.kv_heads = 1;
    mla.mask = MaskCase::causal;
    mla.dtype = dtype;
    out.push_back(mla);
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = std::to_string(info.index) + "_" + info.param.name();
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CApiForward, ::testing::ValuesIn(cases()), case_name);

TEST(CApiForward, ValidateOnlyWritesNothing) {
  CaseData data(Case{});
  const tileattn_forward_args c = capi_testing::to_c_args(data.args);
  ASSERT_EQ(tileattn_forward_validate(&c), TILEATTN_OK) << tileattn_last_error();
  for (float x : data.o32) ASSERT_EQ(x, 0.0f);
}

TEST(CApiForward, InitGivesTheCppDefaults) {
  tileattn_forward_args c;
  std::memset(&c, 0xAB, sizeof c);
  ASSERT_EQ(tileattn_forward_args_init(&c), TILEATTN_OK);
  const ForwardArgs defaults;
  EXPECT_EQ(c.struct_size, sizeof c);
  EXPECT_EQ(c.dtype, TILEATTN_F32);
  EXPECT_EQ(c.isa, TILEATTN_ISA_AUTO);
  EXPECT_TRUE(std::isnan(c.scale));
  EXPECT_EQ(c.window_left, defaults.mask.window_left);
  EXPECT_EQ(c.window_right, defaults.mask.window_right);
  EXPECT_EQ(c.causal, 0);
  EXPECT_EQ(c.mask_kind, TILEATTN_MASK_NONE);
  EXPECT_EQ(c.q.data, nullptr);
  EXPECT_EQ(c.lse, nullptr);
  EXPECT_EQ(c.lse_stride[2], 1);
  EXPECT_EQ(c.q.stride[3], 1);
  EXPECT_EQ(c.threads, 0);
  EXPECT_EQ(c.bf16_probabilities, 0);
  EXPECT_EQ(c.fp32_output, 0);
}

// bf16_probabilities reaches the kernel: on a bf16 rung the C call gives the
// C++ call's bits with the option on, which differ from the default's.
TEST(CApiForward, Bf16ProbabilitiesReachesTheKernel) {
  const Isa isa = isa_available(Isa::amx) ? Isa::amx : Isa::avx512bf16;
  if (!isa_available(isa)) GTEST_SKIP() << "no bf16 dot-product rung on this CPU";
  Case k;
  k.dtype = DType::bf16;
  k.seqlen_q = 64, k.seqlen_k = 300, k.head_dim = 64;
  CaseData data(k);
  data.args.isa = isa;
  attention_forward(data.args);
  const std::vector<unsigned char> exact = output_bytes(data);
  data.args.bf16_probabilities = true;
  attention_forward(data.args);
  const std::vector<unsigned char> rounded = output_bytes(data);
  EXPECT_TRUE(rounded != exact) << "bf16_probabilities changed nothing on " << isa_name(isa);
  clear_outputs(data);
  const tileattn_forward_args c = capi_testing::to_c_args(data.args);
  ASSERT_EQ(c.bf16_probabilities, 1);
  ASSERT_EQ(tileattn_forward(&c), TILEATTN_OK) << tileattn_last_error();
  EXPECT_TRUE(output_bytes(data) == rounded) << "O differs between the C and C++ APIs";
}

// fp32_output reaches the kernel: a bf16 call writes an fp32 O equal to the
// C++ call's bit for bit; a caller whose struct ends before the field gets O
// in bf16; the backward refuses the option as not supported.
TEST(CApiForward, Fp32OutputReachesTheKernel) {
  Case k;
  k.dtype = DType::bf16;
  k.seqlen_q = 40, k.seqlen_k = 300, k.head_dim = 64;
  CaseData data(k);
  std::vector<float> cpp_o(data.o16.size()), c_o(data.o16.size());
  ForwardArgs wide = data.args;
  wide.fp32_output = true;
  wide.o.data = cpp_o.data();
  attention_forward(wide);
  tileattn_forward_args c = capi_testing::to_c_args(wide);
  ASSERT_EQ(c.fp32_output, 1);
  c.o.data = c_o.data();
  ASSERT_EQ(tileattn_forward(&c), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(std::memcmp(c_o.data(), cpp_o.data(), c_o.size() * 4), 0) << "O differs between the C and C++ APIs";

  attention_forward(data.args);
  const std::vector<uint16_t> narrow = data.o16;
  std::fill(data.o16.begin(), data.o16.end(), uint16_t(0));
  tileattn_forward_args older = capi_testing::to_c_args(data.args);
  older.fp32_output = 1;  // beyond the caller's struct: not read
  older.struct_size = offsetof(tileattn_forward_args, fp32_output);
  ASSERT_EQ(tileattn_forward(&older), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(data.o16, narrow);

  tileattn_backward_args b;
  ASSERT_EQ(tileattn_backward_args_init(&b), TILEATTN_OK);
  c.o.data = data.o16.data();  // bf16 O and dO: the forward's dtype
  b.forward = &c;
  b.o = {data.o16.data(), {data.args.o.stride[0], data.args.o.stride[1], data.args.o.stride[2], data.args.o.stride[3]}};
  b.d_o = b.o;
  std::vector<float> lse(size_t(k.batch * k.heads * k.seqlen_q));
  b.lse = lse.data();
  b.lse_stride[0] = k.heads * k.seqlen_q, b.lse_stride[1] = k.seqlen_q, b.lse_stride[2] = 1;
  std::vector<uint16_t> dq(data.q16.size()), dk(data.k16.size()), dv(data.v16.size());
  b.dq = capi_testing::c_tensor(OutputView{dq.data(), data.args.q.stride});
  b.dk = capi_testing::c_tensor(OutputView{dk.data(), data.args.k.stride});
  b.dv = capi_testing::c_tensor(OutputView{dv.data(), data.args.v.stride});
  EXPECT_EQ(tileattn_backward(&b), TILEATTN_NOT_SUPPORTED);
  EXPECT_NE(std::string(tileattn_last_error()).find("fp32_output"), std::string::npos) << tileattn_last_error();
}

// The 4 bytes after fp32_output (the struct's padding to 8 bytes) are a
// reserved field: nonzero is refused, so that a later field placed there is
// never ignored silently.
TEST(CApiForward, ReservedFieldAfterFp32OutputMustBeZero) {
  CaseData data(Case{});
  tileattn_forward_args c = capi_testing::to_c_args(data.args);
  static_assert(offsetof(tileattn_forward_args, reserved1) + sizeof(int32_t) == sizeof(tileattn_forward_args));
  c.reserved1 = 7;
  EXPECT_EQ(tileattn_forward(&c), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("reserved1"), std::string::npos) << tileattn_last_error();
  for (float x : data.o32) ASSERT_EQ(x, 0.0f);
  c.reserved1 = 0;
  EXPECT_EQ(tileattn_forward(&c), TILEATTN_OK) << tileattn_last_error();
}

// A caller compiled against a newer header (a longer struct) is served when
// the fields this library does not know are zero, refused otherwise.
TEST(CApiForward, StructSizeVersioning) {
  CaseData data(Case{});
  attention_forward(data.args);
  const std::vector<float> expected = data.o32;

  struct Newer {
    tileattn_forward_args v1;
    int64_t field_from_the_future;
  } newer;
  newer.v1 = capi_testing::to_c_args(data.args);
  newer.v1.struct_size = sizeof newer;
  newer.field_from_the_future = 0;
  std::fill(data.o32.begin(), data.o32.end(), 0.0f);
  ASSERT_EQ(tileattn_forward(&newer.v1), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(data.o32, expected);

  newer.field_from_the_future = 1;
  std::fill(data.o32.begin(), data.o32.end(), 0.0f);
  EXPECT_EQ(tileattn_forward(&newer.v1), TILEATTN_NOT_SUPPORTED);
  EXPECT_NE(std::string(tileattn_last_error()).find("does not know"), std::string::npos)
      << tileattn_last_error();
  for (float x : data.o32) ASSERT_EQ(x, 0.0f);
}


// A caller compiled before softcap was appended (struct_size ends at
// block_kv) gets no cap whatever lies beyond its struct; a negative or NaN
// cap is refused by name.
TEST(CApiForward, SoftcapVersioningAndBadValues) {
  Case capped;
  capped.softcap = 5.0f;
  capped.input_scale = 4.0f;
  CaseData data(capped);
  ForwardArgs plain = data.args;
  plain.softcap = 0.0f;
  attention_forward(plain);
  const std::vector<float> uncapped = data.o32;
  attention_forward(data.args);
  const std::vector<float> with_cap = data.o32;
  ASSERT_NE(uncapped, with_cap);

  tileattn_forward_args c = capi_testing::to_c_args(data.args);
  c.struct_size = offsetof(tileattn_forward_args, block_kv) + sizeof c.block_kv;  // the first release
  std::fill(data.o32.begin(), data.o32.end(), 0.0f);
  ASSERT_EQ(tileattn_forward(&c), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(data.o32, uncapped);
  c.struct_size = sizeof c;
  ASSERT_EQ(tileattn_forward(&c), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(data.o32, with_cap);

  for (float bad : {-5.0f, std::numeric_limits<float>::quiet_NaN()}) {
    c.softcap = bad;
    std::fill(data.o32.begin(), data.o32.end(), 0.0f);
    EXPECT_EQ(tileattn_forward(&c), TILEATTN_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tileattn_last_error()).find("softcap"), std::string::npos) << tileattn_last_error();
    for (float x : data.o32) ASSERT_EQ(x, 0.0f);
  }
  c.softcap = 5.0f;
  c.reserved0 = 1;
  EXPECT_EQ(tileattn_forward(&c), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("reserved0"), std::string::npos) << tileattn_last_error();
}

// v_head_dim out of range is an invalid argument naming it; nothing is written.
TEST(CApiForward, BadValueHeadDim) {
  Case c;
  c.head_dim = 192;
  c.v_head_dim = 128;
  CaseData data(c);
  tileattn_forward_args args = capi_testing::to_c_args(data.args);
  for (int64_t bad : {int64_t{-1}, int64_t{513}}) {
    args.v_head_dim = bad;
    EXPECT_EQ(tileattn_forward(&args), TILEATTN_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tileattn_last_error()).find("v_head_dim must be in 1..512"), std::string::npos)
        << tileattn_last_error();
    for (float x : data.o32) ASSERT_EQ(x, 0.0f);
  }
}

// tileattn_merge_states: a NaN LSE against an empty side (-inf) gives NaN in
// both argument orders; an o_out that overlaps o_a in another view is refused.
TEST(CApiMerge, NaNAgainstAnEmptySideAndOverlappingOutput) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), minus_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> o_a(2 * 4, 1.0f), o_b(2 * 4, 2.0f), out(2 * 4, 0.0f), lse_out(2, 0.0f);
  for (bool nan_first : {true, false}) {
    std::vector<float> lse_a(2, nan_first ? nan : minus_inf), lse_b(2, nan_first ? minus_inf : nan);
    tileattn_merge_args m;
    ASSERT_EQ(tileattn_merge_args_init(&m), TILEATTN_OK);
    m.batch = 1;
    m.heads = 1;
    m.rows = 2;
    m.head_dim = 4;
    m.o_a = {o_a.data(), {8, 8, 4, 1}};
    m.o_b = {o_b.data(), {8, 8, 4, 1}};
    m.o_out = {out.data(), {8, 8, 4, 1}};
    m.lse_a = lse_a.data();
    m.lse_b = lse_b.data();
    m.lse_out = lse_out.data();
    m.lse_a_stride[1] = m.lse_b_stride[1] = m.lse_out_stride[1] = 2;
    ASSERT_EQ(tileattn_merge_states(&m), TILEATTN_OK) << tileattn_last_error();
    for (float x : out) EXPECT_TRUE(std::isnan(x)) << (nan_first ? "NaN first: " : "NaN second: ") << x;
    for (float l : lse_out) EXPECT_TRUE(std::isnan(l)) << (nan_first ? "NaN first: " : "NaN second: ") << l;
    if (nan_first) continue;

    // o_a's memory as [rows, head_dim] transposed: overlaps, not the same view.
    m.o_out = {o_a.data(), {8, 8, 1, 2}};
    EXPECT_EQ(tileattn_merge_states(&m), TILEATTN_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tileattn_last_error()).find("o_out: overlaps o_a"), std::string::npos)
        << tileattn_last_error();
    for (float x : o_a) ASSERT_EQ(x, 1.0f);
  }
}

}  // namespace
}  // namespace tileattn
