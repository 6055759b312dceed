// Key tiles that a boolean mask hides from every row of a work item are
// skipped (mask_row.hpp, boolean_mask_hides_tile): the result is the float64
// reference's, which never reads a hidden key, so NaN keys and values in
// such tiles stay out of the output (in a tile the mask hides only in part,
// a NaN value still meets its P of 0, as in FlashAttention-2); a causal mask
// given as a tensor gives is_causal's result.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/small_values.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/reference.hpp"

namespace tileattn {
namespace {

// Keys 0 .. kHidden - 1 are hidden from every row: two whole tiles of kTile keys.
constexpr int64_t kHeads = 2, kN = 300, kDim = 32, kTile = 64, kHidden = 2 * kTile;

using testing_support::kernel_isas;
const auto values = testing_support::small_values;

struct MaskedProblem {
  std::vector<float> q = values(kHeads * kN * kDim, 1), k = values(kHeads * kN * kDim, 2),
                     v = values(kHeads * kN * kDim, 3), o = std::vector<float>(q.size());
  std::vector<uint8_t> mask = std::vector<uint8_t>(size_t(kN * kN));
  ForwardArgs args(Isa isa) {
    ForwardArgs a;
    a.shape = {1, kHeads, kHeads, kN, kN, kDim};
    const std::array<int64_t, 4> dense = {kHeads * kN * kDim, kN * kDim, kDim, 1};
    a.q = {q.data(), dense};
    a.k = {k.data(), dense};
    a.v = {v.data(), dense};
    a.o = {o.data(), dense};
    a.mask.kind = MaskSpec::Kind::boolean;
    a.mask.data = mask.data();
    a.mask.stride = {0, 0, kN, 1};  // [N, N], the same for every head
    a.isa = isa;
    a.threads = 1;
    a.block_kv = kTile;
    return a;
  }
};

TEST(BooleanMaskTiles, HiddenKeysAreNeverRead) {
  for (Isa isa : kernel_isas()) {
    SCOPED_TRACE(isa_name(isa));
    MaskedProblem r;
    for (int64_t i = 0; i < kN; ++i)
      for (int64_t j = kHidden; j < kN; ++j) r.mask[size_t(i * kN + j)] = 1;
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t j = 0; j < kHidden; ++j)
        for (int64_t c = 0; c < kDim; ++c) {
          r.k[size_t((h * kN + j) * kDim + c)] = NAN;
          r.v[size_t((h * kN + j) * kDim + c)] = NAN;
        }
    const ForwardArgs a = r.args(isa);
    attention_forward(a);
    const ReferenceOutput want = reference_forward(a);
    for (size_t i = 0; i < r.o.size(); ++i) {
      ASSERT_TRUE(std::isfinite(r.o[i])) << "element " << i;
      ASSERT_NEAR(r.o[i], want.o[i], 1e-5) << "element " << i;
    }
  }
}

TEST(BooleanMaskTiles, CausalTensorMaskIsIsCausal) {
  for (Isa isa : kernel_isas()) {
    SCOPED_TRACE(isa_name(isa));
    MaskedProblem r;
    for (int64_t i = 0; i < kN; ++i)
      for (int64_t j = 0; j <= i; ++j) r.mask[size_t(i * kN + j)] = 1;
    attention_forward(r.args(isa));
    const std::vector<float> with_mask = r.o;
    ForwardArgs causal = r.args(isa);
    causal.mask = MaskSpec{};
    causal.mask.causal = true;
    attention_forward(causal);
    for (size_t i = 0; i < r.o.size(); ++i) ASSERT_NEAR(with_mask[i], r.o[i], 1e-6) << "element " << i;
  }
}

}  // namespace
}  // namespace tileattn
