// The backward skips (query tile, key tile) pairs that a boolean mask hides
// whole, as the forward does (tests/core/mask_tiles_test.cpp): NaN keys and
// values in hidden tiles stay out of dQ, dK and dV (the float64 reference
// never reads them), and a causal mask given as a tensor gives is_causal's
// gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/small_values.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/machine.hpp"

namespace tileattn {
namespace {

// Keys 0 .. kHidden - 1 hidden from every row: two whole tiles of kTile keys.
constexpr int64_t kHeads = 2, kN = 200, kDim = 16, kTile = 32, kHidden = 2 * kTile;

using testing_support::kernel_isas;
const auto values = testing_support::small_values;

struct Gradients {
  std::vector<float> dq, dk, dv;
};

// Forward then backward of one [1, kHeads, kN, kDim] problem on `isa`.
Gradients gradients(Isa isa, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<uint8_t>* mask, bool causal) {
  const std::array<int64_t, 4> dense = {kHeads * kN * kDim, kN * kDim, kDim, 1};
  std::vector<float> o(q.size()), lse(size_t(kHeads * kN));
  const std::vector<float> d_o = values(int64_t(q.size()), 9);
  ForwardArgs f;
  f.shape = {1, kHeads, kHeads, kN, kN, kDim};
  f.q = {q.data(), dense};
  f.k = {k.data(), dense};
  f.v = {v.data(), dense};
  f.o = {o.data(), dense};
  f.lse = lse.data();
  f.lse_stride = {kHeads * kN, kN, 1};
  if (mask) {
    f.mask.kind = MaskSpec::Kind::boolean;
    f.mask.data = mask->data();
    f.mask.stride = {0, 0, kN, 1};
  }
  f.mask.causal = causal;
  f.isa = isa;
  f.threads = 1;
  f.block_q = kTile;
  f.block_kv = kTile;
  attention_forward(f);
  Gradients g{std::vector<float>(q.size()), std::vector<float>(k.size()), std::vector<float>(v.size())};
  BackwardArgs b;
  b.forward = f;
  b.o = {o.data(), dense};
  b.d_o = {d_o.data(), dense};
  b.lse = lse.data();
  b.lse_stride = f.lse_stride;
  b.dq = {g.dq.data(), dense};
  b.dk = {g.dk.data(), dense};
  b.dv = {g.dv.data(), dense};
  attention_backward(b);
  return g;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, const char* name) {
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << name << " element " << i;
    ASSERT_NEAR(got[i], want[i], 1e-4) << name << " element " << i;
  }
}

TEST(BooleanMaskTilesBackward, HiddenKeysAreNeverRead) {
  std::vector<float> q = values(kHeads * kN * kDim, 1), k = values(kHeads * kN * kDim, 2),
                     v = values(kHeads * kN * kDim, 3);
  std::vector<uint8_t> mask(size_t(kN * kN), 0);
  for (int64_t i = 0; i < kN; ++i)
    for (int64_t j = kHidden; j < kN; ++j) mask[size_t(i * kN + j)] = 1;
  // The reference on finite keys, then the paths on NaN ones where they are hidden.
  const Gradients want = gradients(Isa::reference, q, k, v, &mask, false);
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t j = 0; j < kHidden; ++j)
      for (int64_t c = 0; c < kDim; ++c) k[size_t((h * kN + j) * kDim + c)] = v[size_t((h * kN + j) * kDim + c)] = NAN;
  for (Isa isa : kernel_isas()) {
    SCOPED_TRACE(isa_name(isa));
    const Gradients got = gradients(isa, q, k, v, &mask, false);
    expect_near(got.dq, want.dq, "dq");
    expect_near(got.dk, want.dk, "dk");
    expect_near(got.dv, want.dv, "dv");
  }
}

TEST(BooleanMaskTilesBackward, CausalTensorMaskIsIsCausal) {
  const std::vector<float> q = values(kHeads * kN * kDim, 4), k = values(kHeads * kN * kDim, 5),
                           v = values(kHeads * kN * kDim, 6);
  std::vector<uint8_t> mask(size_t(kN * kN), 0);
  for (int64_t i = 0; i < kN; ++i)
    for (int64_t j = 0; j <= i; ++j) mask[size_t(i * kN + j)] = 1;
  for (Isa isa : kernel_isas()) {
    SCOPED_TRACE(isa_name(isa));
    const Gradients with_mask = gradients(isa, q, k, v, &mask, false), causal = gradients(isa, q, k, v, nullptr, true);
    expect_near(with_mask.dq, causal.dq, "dq");
    expect_near(with_mask.dk, causal.dk, "dk");
    expect_near(with_mask.dv, causal.dv, "dv");
  }
}

}  // namespace
}  // namespace tileattn
