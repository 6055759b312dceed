// Dropout mask from a counter-based generator: Philox-4x32 with 10 rounds
// (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011), written here from the paper's description.
//
// The keep/drop decision of element (batch b, query head h, query i, key j)
// is a pure function of (seed, b, h, i, j): the forward, the backward and
// attention_probabilities regenerate the same mask whatever the tiling, the
// schedule or the number of threads. Positions are relative to the sequence
// (varlen: not the packed row), and must be below 2^32 (keys: 2^34).
//
// One Philox call yields four 32-bit words; they serve four consecutive keys:
// counter = (i, j / 4, h, b), key = seed, word j % 4. An element is kept when
// its word is >= threshold = round(p * 2^32), so it is kept with probability
// 1 - threshold / 2^32 ~= 1 - p, and a kept element is scaled by 1 / (1 - p).
//
// Functions are `static inline` so each ISA translation unit compiles its own
// copy with its own flags (see problem.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tileattn::detail {

struct DropoutSpec {
  bool active = false;      // p > 0
  uint32_t key0 = 0, key1 = 0;  // the seed, as Philox's two key words
  uint32_t threshold = 0;   // drop when the word is below this
  float keep_scale = 1.0f;  // 1 / (1 - p)
};

static inline DropoutSpec make_dropout(float p, uint64_t seed) {
  DropoutSpec d;
  if (!(p > 0.0f)) return d;
  d.active = true;
  d.key0 = uint32_t(seed);
  d.key1 = uint32_t(seed >> 32);
  // p < 1, so p * 2^32 < 2^32 and the threshold fits 32 bits.
  d.threshold = uint32_t(std::min(4294967295.0, std::nearbyint(double(p) * 4294967296.0)));
  d.keep_scale = float(1.0 / (1.0 - double(p)));
  return d;
}

struct PhiloxWords {
  uint32_t w[4];
};

// Philox-4x32-10. Each round multiplies two counter words by fixed odd
// constants, keeps both halves of the 64-bit products, and mixes the high
// halves with the other two words and the round key; the key is bumped by
// Weyl constants (the golden ratio and sqrt(3) - 1, as 32-bit fractions).
static inline PhiloxWords philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                        uint32_t k0, uint32_t k1) {
  constexpr uint64_t kMultiplier0 = 0xD2511F53u;
  constexpr uint64_t kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = kMultiplier0 * c0;
    const uint64_t product1 = kMultiplier1 * c2;
    const uint32_t hi0 = uint32_t(product0 >> 32), lo0 = uint32_t(product0);
    const uint32_t hi1 = uint32_t(product1 >> 32), lo1 = uint32_t(product1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

// The keep factor of one element: keep_scale when kept, 0 when dropped.
static inline float dropout_factor(const DropoutSpec& d, int64_t b, int64_t h, int64_t i,
                                   int64_t j) {
  const PhiloxWords r = philox4x32_10(uint32_t(i), uint32_t(j >> 2), uint32_t(h), uint32_t(b),
                                      d.key0, d.key1);
  return r.w[j & 3] >= d.threshold ? d.keep_scale : 0.0f;
}

// x[c] *= factor of key j0 + c, for c in [0, n): one Philox call per four keys.
static inline void apply_dropout_row(const DropoutSpec& d, int64_t b, int64_t h, int64_t i,
                                     int64_t j0, float* x, int64_t n) {
  int64_t c = 0;
  while (c < n) {
    const int64_t j = j0 + c;
    const PhiloxWords r = philox4x32_10(uint32_t(i), uint32_t(j >> 2), uint32_t(h), uint32_t(b),
                                        d.key0, d.key1);
    for (int lane = int(j & 3); lane < 4 && c < n; ++lane, ++c)
      x[c] = r.w[lane] >= d.threshold ? x[c] * d.keep_scale : 0.0f;
  }
}

}  // namespace tileattn::detail
