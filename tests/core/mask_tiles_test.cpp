// Key tiles that a boolean mask hides from every row of a work item are
// skipped (mask_row.hpp, boolean_mask_tile), and tiles it keeps whole take no
// mask step: the result is the float64 reference's, which never reads a
// hidden key, so NaN keys and values in such tiles stay out of the output
// (in a tile the mask hides only in part, a NaN value still meets its P of 0,
// as in FlashAttention-2); a causal mask given as a tensor gives is_causal's
// result; masks per head, GQA, bf16 and keep bytes other than 1 agree with
// the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "support/small_values.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/reference.hpp"

namespace tileattn {
namespace {

using testing_support::kernel_isas;
const auto values = testing_support::small_values;

// Keys 0 .. kHidden - 1 are hidden from every row: two whole tiles of kTile keys.
constexpr int64_t kN = 300, kDim = 32, kTile = 64, kHidden = 2 * kTile;

uint16_t bf16_bits(float x) {  // the values are k / 1000: truncation keeps them in range
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return uint16_t(bits >> 16);
}

// A [1, heads, kN, kDim] problem (kv_heads K/V heads) under a boolean mask
// [heads or 1, kN, kN], in fp32 or bf16.
struct MaskedProblem {
  int64_t heads, kv_heads;
  DType dtype;
  std::vector<float> q, k, v;
  std::vector<uint8_t> mask;
  bool mask_per_head;
  std::vector<uint16_t> q16, k16, v16, o16;
  std::vector<float> o;
  MaskedProblem(int64_t h, int64_t hkv, DType t, bool per_head)
      : heads(h), kv_heads(hkv), dtype(t), q(values(h * kN * kDim, 1)), k(values(hkv * kN * kDim, 2)),
        v(values(hkv * kN * kDim, 3)), mask(size_t((per_head ? h : 1) * kN * kN), 0), mask_per_head(per_head) {}
  uint8_t& keep(int64_t h, int64_t i, int64_t j) { return mask[size_t(((mask_per_head ? h : 0) * kN + i) * kN + j)]; }
  ForwardArgs args(Isa isa) {
    ForwardArgs a;
    a.shape = {1, heads, kv_heads, kN, kN, kDim};
    a.dtype = dtype;
    const std::array<int64_t, 4> q_dense = {heads * kN * kDim, kN * kDim, kDim, 1};
    const std::array<int64_t, 4> kv_dense = {kv_heads * kN * kDim, kN * kDim, kDim, 1};
    if (dtype == DType::bf16) {
      const auto narrow = [](const std::vector<float>& x) {
        std::vector<uint16_t> out(x.size());
        for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_bits(x[i]);
        return out;
      };
      q16 = narrow(q), k16 = narrow(k), v16 = narrow(v);
      o16.assign(q.size(), 0);
      a.q = {q16.data(), q_dense};
      a.k = {k16.data(), kv_dense};
      a.v = {v16.data(), kv_dense};
      a.o = {o16.data(), q_dense};
    } else {
      o.assign(q.size(), 0.0f);
      a.q = {q.data(), q_dense};
      a.k = {k.data(), kv_dense};
      a.v = {v.data(), kv_dense};
      a.o = {o.data(), q_dense};
    }
    a.mask.kind = MaskSpec::Kind::boolean;
    a.mask.data = mask.data();
    a.mask.stride = {0, mask_per_head ? kN * kN : 0, kN, 1};
    a.isa = isa;
    a.threads = 1;
    a.block_kv = kTile;
    return a;
  }
  float out(size_t i) const {
    if (dtype == DType::f32) return o[i];
    const uint32_t bits = uint32_t(o16[i]) << 16;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  }
};

// O against the float64 reference: within 2^-8 of O's largest element for
// bf16 (its rounding), 1e-5 for fp32; every element finite.
void expect_reference(MaskedProblem& r, Isa isa) {
  const ForwardArgs a = r.args(isa);
  attention_forward(a);
  const ReferenceOutput want = reference_forward(a);
  double largest = 0;
  for (double x : want.o) largest = std::max(largest, std::fabs(x));
  const double tolerance = r.dtype == DType::bf16 ? largest / 256 : 1e-5;
  for (size_t i = 0; i < want.o.size(); ++i) {
    ASSERT_TRUE(std::isfinite(r.out(i))) << "element " << i;
    ASSERT_NEAR(r.out(i), want.o[i], tolerance) << "element " << i;
  }
}

TEST(BooleanMaskTiles, HiddenKeysAreNeverRead) {
  for (DType dtype : {DType::f32, DType::bf16})
    for (Isa isa : kernel_isas()) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + dtype_name(dtype));
      MaskedProblem r(2, 2, dtype, false);
      for (int64_t i = 0; i < kN; ++i)
        for (int64_t j = kHidden; j < kN; ++j) r.keep(0, i, j) = 1;
      // NaN keys and values where the mask hides them: the reference reads none.
      for (int64_t h = 0; h < r.kv_heads; ++h)
        for (int64_t j = 0; j < kHidden; ++j)
          for (int64_t c = 0; c < kDim; ++c) r.k[size_t((h * kN + j) * kDim + c)] = r.v[size_t((h * kN + j) * kDim + c)] = NAN;
      expect_reference(r, isa);
    }
}

TEST(BooleanMaskTiles, CausalTensorMaskIsIsCausal) {
  for (Isa isa : kernel_isas()) {
    SCOPED_TRACE(isa_name(isa));
    MaskedProblem r(2, 2, DType::f32, false);
    for (int64_t i = 0; i < kN; ++i)
      for (int64_t j = 0; j <= i; ++j) r.keep(0, i, j) = 1;
    attention_forward(r.args(isa));
    const std::vector<float> with_mask = r.o;
    ForwardArgs causal = r.args(isa);
    causal.mask = MaskSpec{};
    causal.mask.causal = true;
    attention_forward(causal);
    for (size_t i = 0; i < r.o.size(); ++i) ASSERT_NEAR(with_mask[i], r.o[i], 1e-6) << "element " << i;
  }
}

// A mask per head (causal heads, and heads that also hide the first kHidden
// keys), GQA (4 query heads on 2 KV heads), keep bytes 0x01, 0x02 and 0xff.
TEST(BooleanMaskTiles, PerHeadMasksGqaBf16AndAnyKeepByte) {
  for (DType dtype : {DType::f32, DType::bf16})
    for (Isa isa : kernel_isas()) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + dtype_name(dtype));
      MaskedProblem r(4, 2, dtype, true);
      const uint8_t keep_bytes[3] = {0x01, 0x02, 0xff};
      for (int64_t h = 0; h < r.heads; ++h)
        for (int64_t i = 0; i < kN; ++i)
          for (int64_t j = h % 2 ? kHidden : 0; j <= i; ++j) r.keep(h, i, j) = keep_bytes[(h + i + j) % 3];
      expect_reference(r, isa);
    }
}

}  // namespace
}  // namespace tileattn
