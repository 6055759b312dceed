// Numerics at the edges: very large and very small scores, rows that see no
// key, NaN and Inf in the inputs (they reach only the rows they touch),
// denormals, empty batches and zero-length sequences. Accuracy is judged by
// the project's rule (float64 reference, 2 x naive error + floor).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "testing/problem_case.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::reliability {
namespace {

using testing::Case;
using testing::CaseData;
using testing::MaskCase;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Case edge_case(DType dtype = DType::f32) {
  Case c;
  c.batch = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.seqlen_q = 37;
  c.seqlen_k = 70;  // more than one key tile at small block_kv
  c.head_dim = 24;
  c.dtype = dtype;
  return c;
}

void run_and_compare(CaseData& data) {
  data.args.block_kv = 16;  // several key tiles: the online rescaling runs
  attention_forward(data.args);
  const testing::Comparison cmp = testing::compare_with_reference(data);
  EXPECT_TRUE(cmp.ok()) << data.c.name() << ": " << cmp.describe();
}

bool row_has_nan(const CaseData& data, int64_t b, int64_t h, int64_t i) {
  for (int64_t x = 0; x < data.c.head_dim; ++x)
    if (std::isnan(data.o_at(b, h, i, x))) return true;
  return false;
}

TEST(Numerics, VeryLargeScoresStayFiniteAndAccurate) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Case c = edge_case(dtype);
    c.input_scale = dtype == DType::f32 ? 3e3f : 1e3f;  // scores ~1e6: exp underflows for all but the max
    CaseData data(c);
    run_and_compare(data);
    for (float x : data.o32) ASSERT_TRUE(std::isfinite(x));
  }
  // A huge scale: scores of ~1e30 in log2 units, still finite in fp32.
  CaseData data(edge_case());
  data.args.scale = 1e28f;
  run_and_compare(data);
}

TEST(Numerics, VerySmallScoresGiveTheMeanOfV) {
  Case c = edge_case();
  c.input_scale = 1e-20f;  // scores ~1e-40: denormal products, softmax uniform
  CaseData data(c);
  run_and_compare(data);
  data.args.scale = 0.0f;  // exactly uniform
  run_and_compare(data);
}

TEST(Numerics, DenormalInputs) {
  Case c = edge_case();
  c.input_scale = 1e-38f;  // inputs straddle the denormal range of fp32
  CaseData data(c);
  run_and_compare(data);
  for (float x : data.o32) ASSERT_TRUE(std::isfinite(x));
}

TEST(Numerics, RowsThatSeeNoKeyAreZeroWithMinusInfLse) {
  for (MaskCase mask : {MaskCase::boolean, MaskCase::additive}) {
    Case c = edge_case();
    c.mask = mask;
    CaseData data(c);
    // Hide every key from query 3 of every sequence and head.
    const int64_t nk = c.seqlen_k;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t j = 0; j < nk; ++j) {
          const size_t at = size_t(((b * c.heads + h) * c.seqlen_q + 3) * nk + j);
          if (mask == MaskCase::boolean) data.bool_mask[at] = 0;
          else data.add_mask[at] = -kInf;
        }
    run_and_compare(data);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads; ++h) {
        for (int64_t x = 0; x < c.head_dim; ++x) ASSERT_EQ(data.o_at(b, h, 3, x), 0.0f);
        ASSERT_EQ(data.lse_at(b, h, 3), -kInf);
      }
  }
  // A window that excludes every key of early rows (seqlen_q > seqlen_k, causal).
  Case c = edge_case();
  c.seqlen_q = 90;
  c.mask = MaskCase::causal;
  CaseData data(c);
  run_and_compare(data);
  for (int64_t i = 0; i < c.seqlen_q - c.seqlen_k; ++i) {
    ASSERT_EQ(data.o_at(0, 0, i, 0), 0.0f);
    ASSERT_EQ(data.lse_at(0, 0, i), -kInf);
  }
}

TEST(Numerics, NanInAQueryRowStaysInThatRow) {
  CaseData data(edge_case());
  data.set_q(1, 0, 5, 7, kNaN);
  run_and_compare(data);  // NaN positions must match the reference exactly
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < data.c.seqlen_q; ++i)
        EXPECT_EQ(row_has_nan(data, b, h, i), b == 1 && h == 0 && i == 5) << b << " " << h << " " << i;
}

TEST(Numerics, NanOrInfInAKeyReachesOnlyTheRowsThatSeeIt) {
  for (float bad : {kNaN, kInf}) {
    Case c = edge_case();
    c.mask = MaskCase::causal;
    c.seqlen_q = c.seqlen_k = 40;
    CaseData data(c);
    data.set_k(0, 0, 20, 3, bad);  // key 20 of sequence 0
    run_and_compare(data);
    for (int64_t i = 0; i < c.seqlen_q; ++i) {
      // Rows that see key 20: NaN for a NaN key; for an infinite key, NaN
      // where the score is +inf (inf - inf), as the reference says above.
      if (i < 20 || std::isnan(bad)) {
        EXPECT_EQ(row_has_nan(data, 0, 0, i), i >= 20) << "row " << i;
      }
      EXPECT_FALSE(row_has_nan(data, 1, 0, i)) << "other sequence, row " << i;
    }
  }
}

TEST(Numerics, InfInTheScoresFromTheMaskOrScale) {
  // +inf additive bias: softmax of +inf is NaN in exact arithmetic as well.
  Case c = edge_case();
  c.mask = MaskCase::additive;
  CaseData data(c);
  data.add_mask[5] = kInf;
  run_and_compare(data);
  // Inf in a V row: rows whose tile holds that key (see docs/accuracy.md).
  CaseData v_inf(edge_case());
  v_inf.v32[3 * size_t(v_inf.c.head_dim) + 2] = kInf;
  run_and_compare(v_inf);
}

TEST(Numerics, EmptyBatchAndZeroLengthSequences) {
  {
    CaseData data(edge_case());
    data.args.shape.batch = 0;
    std::fill(data.o32.begin(), data.o32.end(), 7.0f);
    attention_forward(data.args);
    for (float x : data.o32) ASSERT_EQ(x, 7.0f) << "an empty batch wrote O";
  }
  // No keys at all: O = 0, LSE = -inf.
  Case c = edge_case();
  c.seqlen_k = 0;
  CaseData no_keys(c);
  std::fill(no_keys.o32.begin(), no_keys.o32.end(), 7.0f);
  attention_forward(no_keys.args);
  for (float x : no_keys.o32) ASSERT_EQ(x, 0.0f);
  for (float x : no_keys.lse) ASSERT_EQ(x, -kInf);
  // ... also under a mask with no element to read, whose data may be null (an empty
  // [Nq, 0] tensor's: PyTorch's top-left causal mask of Nk = 0).
  for (MaskSpec::Kind kind : {MaskSpec::Kind::boolean, MaskSpec::Kind::additive}) {
    std::fill(no_keys.o32.begin(), no_keys.o32.end(), 7.0f);
    ForwardArgs masked = no_keys.args;
    masked.mask.kind = kind;
    masked.mask.data = nullptr;
    attention_forward(masked);
    for (float x : no_keys.o32) ASSERT_EQ(x, 0.0f);
  }
  // No queries: nothing to write, success.
  c = edge_case();
  c.seqlen_q = 0;
  CaseData no_queries(c);
  attention_forward(no_queries.args);

  // Packed batch with zero-length sequences on either side.
  Case v = edge_case();
  v.varlen = true;
  v.batch = 4;
  v.varlen_q_lengths = {0, 5, 7, 3};
  v.varlen_k_lengths = {4, 0, 9, 6};
  v.mask = MaskCase::causal;
  CaseData packed(v);
  run_and_compare(packed);
  for (int64_t i = 0; i < 5; ++i) {  // sequence 1: queries but no keys
    EXPECT_EQ(packed.o_at(0, 0, i, 0), 0.0f);
    EXPECT_EQ(packed.lse_at(0, 0, i), -kInf);
  }
}

TEST(Numerics, SameResultForEveryIsaOnEdgeInputs) {
  // NaN / -inf handling is shared code, but each ISA's row_max and exp2 must agree.
  for (Isa isa : {Isa::generic, Isa::avx2}) {
    if (!isa_available(isa)) continue;
    Case c = edge_case();
    c.mask = MaskCase::additive;
    CaseData data(c);
    data.set_q(0, 1, 2, 0, kNaN);
    for (size_t j = 0; j < size_t(c.seqlen_k); ++j) data.add_mask[size_t(4 * c.seqlen_k) + j] = -kInf;
    data.args.isa = isa;
    run_and_compare(data);
  }
}

}  // namespace
}  // namespace tileattn::reliability
