// The AMX tile model (amx_emulation.hpp): tdpbf16ps's order of operations on
// hand-picked elements (every machine, and natively where AMX is usable),
// random tiles of every shape bit for bit against the instruction, and the
// configuration rules the model enforces.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "isa/bf16_dot_semantics.hpp"
#include "isa/bf16_kernel_sets.hpp"
#include "isa/bf16_native_gate.hpp"

namespace tileattn::testing {
namespace {

using bf16_dot_semantics::bits;
using bf16_dot_semantics::from_bits;

uint16_t bf16_of(float x) { return uint16_t(bits(x) >> 16); }  // x exact in bf16

// One output element of a 1 x 1 x k_pairs product: C += A (1 x 2k) B (k x 2).
float one_element(void (*tile_dpbf16ps)(const TileProduct&), float c, const std::vector<uint16_t>& a_row,
                  const std::vector<std::pair<uint16_t, uint16_t>>& b_pairs) {
  alignas(64) float c_tile[16] = {c};
  alignas(64) uint16_t a[32] = {}, b[16][32] = {};
  std::memcpy(a, a_row.data(), a_row.size() * 2);
  for (size_t k = 0; k < b_pairs.size(); ++k) b[k][0] = b_pairs[k].first, b[k][1] = b_pairs[k].second;
  TileProduct t;
  t.m = 1, t.n = 1, t.k_pairs = int(b_pairs.size());
  t.c = c_tile, t.a = a, t.b = &b[0][0];
  tile_dpbf16ps(t);
  return c_tile[0];
}

void check_elements(void (*tile_dpbf16ps)(const TileProduct&), const char* path) {
  const uint16_t one = bf16_of(1.0f), big = bf16_of(0x1p60f), minus_big = bf16_of(-0x1p60f);
  // Even and odd products go to two chains that start at zero: +2^120 and
  // -2^120 cancel there, and C comes through untouched (accumulating into C
  // product by product would give 0).
  EXPECT_EQ(bits(one_element(tile_dpbf16ps, 3.0f, {big, minus_big}, {{big, big}})), bits(3.0f)) << path;
  // Each chain rounds per product: even chain 1 + 2^-24 (tie, stays 1) then
  // + 2^-24 again: 1; odd chain 0. C = 0 + 1.
  EXPECT_EQ(bits(one_element(tile_dpbf16ps, 0.0f, {one, 0, one, 0, one, 0},
                             {{bf16_of(1.0f), 0}, {bf16_of(0x1p-24f), 0}, {bf16_of(0x1p-24f), 0}})),
            bits(1.0f))
      << path;
  // The chains' sum is rounded before C is added: (2^24 + 1) rounds to 2^24,
  // then C = -2^24 gives 0 (one rounding of all three would give 1).
  EXPECT_EQ(bits(one_element(tile_dpbf16ps, -0x1p24f, {one, one}, {{bf16_of(0x1p24f), one}})), bits(0.0f)) << path;
  // NaNs: C's first, then the even chain's, then the odd chain's.
  EXPECT_EQ(bits(one_element(tile_dpbf16ps, from_bits(0x7f800003u), {0x7fc1, 0x7fc2}, {{one, one}})), 0x7fc00003u)
      << path;
  EXPECT_EQ(bits(one_element(tile_dpbf16ps, 1.0f, {0x7fc1, 0x7fc2}, {{one, one}})), 0x7fc10000u) << path;
  // An infinite even chain against an infinite odd one: inf - inf.
  EXPECT_EQ(bits(one_element(tile_dpbf16ps, 1.0f, {big, minus_big, big, minus_big},
                             {{big, big}, {bf16_of(0x1p100f), bf16_of(0x1p100f)}})),
            0xffc00000u)
      << path;
}

TEST(AmxTileModel, HandPickedElementsEmulated) { check_elements(emulated_tile_dpbf16ps, "emulated"); }

TEST(AmxTileModel, HandPickedElementsNative) {
  TILEATTN_REQUIRE_NATIVE(Isa::amx);
  check_elements(native_tile_dpbf16ps, "native tdpbf16ps");
}

uint16_t random_bf16(std::mt19937_64& rng, int kind, double special) {
  const uint16_t sign = rng() & 0x8000, mantissa = rng() & 0x7f;
  if (std::uniform_real_distribution<>(0, 1)(rng) < special) {
    switch (rng() % 4) {
      case 0: return sign | 0x7f80;
      case 1: return sign | 0x7f80 | (1 + rng() % 127);
      case 2: return sign | mantissa;
      default: return sign;
    }
  }
  static const int kExponentBase[] = {123, 60, 120, 180, 0, 1};
  static const int kExponentSpan[] = {9, 8, 16, 30, 4, 254};
  return uint16_t(sign | ((kExponentBase[kind] + int(rng() % kExponentSpan[kind])) << 7) | mantissa);
}

// Random shapes (m, n, k_pairs from 1 to 16, row strides past the row) and
// values (moderate, products near 2^-126 and past 2^128, denormals,
// infinities, NaNs, cancelling pairs); C's buffer is compared whole, so a
// store outside the configured rows and bytes shows too.
TEST(AmxTileModel, MatchesTdpbf16psOnRandomTiles) {
  TILEATTN_REQUIRE_NATIVE(Isa::amx);
  std::mt19937_64 rng(20261202);
  int64_t mismatches = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    TileProduct t;
    t.m = 1 + int(rng() % 16), t.n = 1 + int(rng() % 16), t.k_pairs = 1 + int(rng() % 16);
    if (trial % 2 == 0) t.m = t.n = t.k_pairs = 16;
    t.a_stride = 64 + 4 * int64_t(rng() % 3), t.b_stride = 64 + 4 * int64_t(rng() % 3);
    t.c_stride = 64 + 4 * int64_t(rng() % 3);
    std::vector<uint16_t> a(size_t(16 * t.a_stride / 2)), b(size_t(16 * t.b_stride / 2));
    const int ka = int(rng() % 6), kb = int(rng() % 6);
    const double special = std::vector<double>{0, 0, 0.0005, 0.003, 0.02, 0.1}[rng() % 6];
    for (auto& x : a) x = random_bf16(rng, ka, special);
    for (auto& x : b) x = random_bf16(rng, kb, special);
    if (rng() % 3 == 0)
      for (size_t i = 0; i + 1 < a.size(); i += 2) a[i] = a[i + 1] ^ 0x8000;
    if (rng() % 3 == 0)
      for (size_t i = 0; i + 1 < b.size(); i += 2) b[i] = b[i + 1];
    std::vector<float> c_native(size_t(16 * t.c_stride / 4));
    const int kc = int(rng() % 5);
    for (auto& x : c_native) {
      const uint32_t sign = rng() & 0x80000000u, mantissa = rng() & 0x7fffff;
      x = kc == 0 ? 0.0f
          : kc == 1 ? from_bits(sign | mantissa)
          : kc == 2 ? from_bits(sign | uint32_t(110 + rng() % 30) << 23 | mantissa)
          : kc == 3 ? from_bits(uint32_t(rng()))
                    : from_bits(sign | uint32_t(1 + rng() % 254) << 23 | mantissa);
    }
    std::vector<float> c_emulated = c_native;
    t.a = a.data(), t.b = b.data();
    t.c = c_native.data();
    native_tile_dpbf16ps(t);
    t.c = c_emulated.data();
    emulated_tile_dpbf16ps(t);
    for (size_t i = 0; i < c_native.size(); ++i)
      if (bits(c_native[i]) != bits(c_emulated[i]) && ++mismatches <= 10)
        ADD_FAILURE() << "m " << t.m << " n " << t.n << " k_pairs " << t.k_pairs << ", C float " << i << std::hex
                      << ": hardware 0x" << bits(c_native[i]) << ", model 0x" << bits(c_emulated[i]);
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace tileattn::testing
