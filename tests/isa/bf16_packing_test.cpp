// The pair-layout packing of the bf16 product kernels (Bf16Packing in
// src/isa/avx512bf16/bf16_kernels.hpp) against scalar definitions of the
// layouts written from its comments: odd n and D, element strides 1 and 3,
// source rows ending at a guard page (no over-read), destinations checked
// whole (no write past the layout). Emulated everywhere, native where the CPU
// has AVX512-BF16 / AMX.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.hpp"
#include "isa/bf16_kernel_params.hpp"
#include "isa/bf16_kernel_sets.hpp"
#include "isa/guarded_buffer.hpp"

namespace tileattn::testing {
namespace {

constexpr uint16_t kSentinel = 0xdead;

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// n rows of d bf16 elements at element stride `stride`, the last one ending
// at a guard page; distinct values, so a misplaced element shows.
struct SourceRows {
  GuardedBuffer memory;
  std::vector<const void*> rows;
  int64_t stride;
  SourceRows(int64_t n, int64_t d, int64_t stride_)
      : memory(size_t(n * ((d - 1) * stride_ + 1) * 2 + 64)), stride(stride_) {
    const int64_t row_elems = (d - 1) * stride + 1;
    uint16_t* base = memory.at_end<uint16_t>(size_t(n * row_elems * 2));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t e = 0; e < row_elems; ++e) base[j * row_elems + e] = uint16_t(0x3f00 + (j * 131 + e) % 0x3fff);
      rows.push_back(base + j * row_elems);
    }
  }
  uint16_t at(int64_t j, int64_t c) const { return static_cast<const uint16_t*>(rows[size_t(j)])[c * stride]; }
};

class Bf16Packing : public ::testing::TestWithParam<Bf16KernelParam> {};

TEST_P(Bf16Packing, CopyRowZeroPadsToK) {
  TILEATTN_BF16_KERNELS(kernels);
  for (int64_t d : {1, 31, 32, 59, 111, 128})
    for (int64_t stride : {1, 3})
      for (int64_t k : {round_up(d, 32)}) {  // the main loop's bf16_k
        SourceRows src(1, d, stride);
        AlignedBuffer<uint16_t> dst(size_t(k + 32), kSentinel);
        kernels.copy_row(src.rows[0], d, stride, dst.get(), k);
        for (int64_t c = 0; c < k + 32; ++c)
          ASSERT_EQ(dst[size_t(c)], c < d ? src.at(0, c) : c < k ? 0 : kSentinel)
              << "d " << d << " stride " << stride << " k " << k << " element " << c;
      }
}

// Element (j, c) of K at (j / 16) * 16 * k + (c / 2) * 32 + (j % 16) * 2 + c % 2.
TEST_P(Bf16Packing, PackKMatchesPairLayout) {
  TILEATTN_BF16_KERNELS(kernels);
  for (int64_t n : {1, 15, 16, 17, 33, 64})
    for (int64_t d : {1, 40, 59, 64, 111})
      for (int64_t stride : {1, 3}) {
        const int64_t k = round_up(d, 32), n_pad = round_up(n, 16);
        SourceRows src(n, d, stride);
        AlignedBuffer<uint16_t> dst(size_t(n_pad * k + 64), kSentinel);
        kernels.pack_k(src.rows.data(), n, d, stride, dst.get(), k);
        std::vector<uint16_t> expected(size_t(n_pad * k + 64), kSentinel);
        for (int64_t j = 0; j < n_pad; ++j)
          for (int64_t c = 0; c < k; ++c)
            expected[size_t((j / 16) * 16 * k + (c / 2) * 32 + (j % 16) * 2 + c % 2)] =
                j < n && c < d ? src.at(j, c) : 0;
        for (size_t i = 0; i < expected.size(); ++i)
          ASSERT_EQ(dst[i], expected[i]) << "n " << n << " d " << d << " stride " << stride << " element " << i;
      }
}

// Element (j, c) of V at (c / 16) * 16 * kv_pad + (j / 2) * 32 + (c % 16) * 2 + j % 2.
TEST_P(Bf16Packing, PackVMatchesPairLayout) {
  TILEATTN_BF16_KERNELS(kernels);
  for (int64_t n : {1, 2, 17, 31, 64})
    for (int64_t d : {1, 16, 17, 40, 59, 111})
      for (int64_t stride : {1, 3}) {
        const int64_t kv_pad = round_up(n, 32), d_pad = round_up(d, 16);
        SourceRows src(n, d, stride);
        AlignedBuffer<uint16_t> dst(size_t(d_pad * kv_pad + 64), kSentinel);
        kernels.pack_v(src.rows.data(), n, d, stride, dst.get(), kv_pad);
        std::vector<uint16_t> expected(size_t(d_pad * kv_pad + 64), kSentinel);
        for (int64_t j = 0; j < kv_pad; ++j)
          for (int64_t c = 0; c < d_pad; ++c)
            expected[size_t((c / 16) * 16 * kv_pad + (j / 2) * 32 + (c % 16) * 2 + j % 2)] =
                j < n && c < d ? src.at(j, c) : 0;
        for (size_t i = 0; i < expected.size(); ++i)
          ASSERT_EQ(dst[i], expected[i]) << "n " << n << " d " << d << " stride " << stride << " element " << i;
      }
}

// bf16 nearest-even of a finite float, from the two candidates (not from the
// kernels' bias trick).
uint16_t nearest_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t down = u & 0xffff0000u, up = down + 0x10000u;
  float fd, fu;
  std::memcpy(&fd, &down, 4);
  std::memcpy(&fu, &up, 4);
  const double dd = std::fabs(double(x) - fd), du = std::fabs(double(x) - fu);
  if (dd < du || (dd == du && ((down >> 16) & 1) == 0)) return uint16_t(down >> 16);
  return uint16_t(up >> 16);
}
float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// P's m rows of n values at stride ldp, the rest of `memory` left NaN: small
// positive and negative values of many exponents, some exactly half way for
// hi's truncation, some zero.
float* fill_probabilities(std::vector<float>& memory, int64_t m, int64_t n, int64_t ldp, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  float* p = memory.data();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const int64_t i = r * ldp + c;
      float x = uniform(rng) * std::ldexp(1.0f, -int(rng() % 20));
      if (i % 7 == 3) {  // a tie for hi: the low 16 bits exactly half
        uint32_t u;
        std::memcpy(&u, &x, 4);
        u = (u & 0xffff0000u) | 0x8000u;
        std::memcpy(&x, &u, 4);
      }
      if (i % 11 == 5) x = 0.0f;
      if (i % 13 == 6) x = -x;
      p[i] = x;
    }
  return p;
}

// The split of one value: hi is x truncated to bf16 (its high word), lo = x -
// hi (exact) rounded to nearest even; alone (lo null) is x rounded to nearest
// even.
struct Split {
  uint16_t hi, lo, alone;
  explicit Split(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    hi = uint16_t(u >> 16);
    lo = nearest_bf16(x - widen(hi));
    alone = nearest_bf16(x);
  }
};

// P (m rows of n floats at stride ldp) into hi = bf16(P), lo = bf16(P - hi),
// zero-padded to k = round_up(n, 32) (the main loop's), rows at stride ld.
// P's rows are followed by NaN up to the next row and for k floats after the
// last, as stale scores can follow them in the score tile: columns n..k must
// still come out zero.
TEST_P(Bf16Packing, SplitRowsIntoTruncatedHiAndNearestLo) {
  TILEATTN_BF16_KERNELS(kernels);
  std::mt19937 rng(7);
  for (int64_t m : {1, 3, 16})
    for (int64_t n : {1, 15, 16, 17, 40, 64}) {
      const int64_t k = round_up(n, 32), ldp = n + 5, ld = k + 32;
      std::vector<float> memory(size_t(m * ldp + k), std::nanf(""));
      const float* p = fill_probabilities(memory, m, n, ldp, rng);
      AlignedBuffer<uint16_t> hi(size_t(m * ld), kSentinel), lo(size_t(m * ld), kSentinel);
      AlignedBuffer<uint16_t> hi_alone(size_t(m * ld), kSentinel);
      kernels.split_rows(p, ldp, m, n, k, hi.get(), lo.get(), ld);
      kernels.split_rows(p, ldp, m, n, k, hi_alone.get(), nullptr, ld);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < ld; ++c) {
          const size_t at = size_t(r * ld + c);
          const Split want(c < n ? p[r * ldp + c] : 0.0f);
          const bool written = c < k;
          ASSERT_EQ(hi[at], written ? want.hi : kSentinel) << "m " << m << " n " << n << " row " << r << " column " << c;
          ASSERT_EQ(lo[at], written ? want.lo : kSentinel) << "m " << m << " n " << n << " row " << r << " column " << c;
          ASSERT_EQ(hi_alone[at], written ? want.alone : kSentinel)
              << "m " << m << " n " << n << " row " << r << " column " << c;
        }
    }
}

// The backward's split of P^T and dS^T (bf16_split_transposed): hi/lo row c
// = column c of P (m rows of n), split as split_rows splits, zero from row m
// to k = round_up(m, 32); only rows < n and columns < k written. P's rows are
// followed by NaN, which must not be read.
TEST_P(Bf16Packing, SplitTransposedIsTheSplitOfTheTranspose) {
  TILEATTN_BF16_KERNELS(kernels);
  std::mt19937 rng(11);
  for (int64_t m : {1, 3, 16, 17, 33, 64})
    for (int64_t n : {1, 15, 16, 17, 40, 128}) {
      const int64_t k = round_up(m, 32), ldp = n + 5, ld = k + 32, out_rows = n + 2;
      std::vector<float> memory(size_t(m * ldp + n), std::nanf(""));
      const float* p = fill_probabilities(memory, m, n, ldp, rng);
      AlignedBuffer<uint16_t> hi(size_t(out_rows * ld), kSentinel), lo(size_t(out_rows * ld), kSentinel);
      AlignedBuffer<uint16_t> hi_alone(size_t(out_rows * ld), kSentinel);
      kernels.split_transposed(p, ldp, m, n, k, hi.get(), lo.get(), ld);
      kernels.split_transposed(p, ldp, m, n, k, hi_alone.get(), nullptr, ld);
      for (int64_t c = 0; c < out_rows; ++c)
        for (int64_t r = 0; r < ld; ++r) {
          const size_t at = size_t(c * ld + r);
          const Split want(c < n && r < m ? p[r * ldp + c] : 0.0f);
          const bool written = c < n && r < k;
          ASSERT_EQ(hi[at], written ? want.hi : kSentinel) << "m " << m << " n " << n << " row " << c << " column " << r;
          ASSERT_EQ(lo[at], written ? want.lo : kSentinel) << "m " << m << " n " << n << " row " << c << " column " << r;
          ASSERT_EQ(hi_alone[at], written ? want.alone : kSentinel)
              << "m " << m << " n " << n << " row " << c << " column " << r;
        }
    }
}

// The decode products' fp8 e4m3 keys and values as bf16 (byte permutes,
// isa/avx512/e4m3_permutes.hpp): every one of the 256 bytes, in each of the 64 byte
// positions, gives the bf16 of f8e4m3_to_float's value (every e4m3 value is
// a bf16 value: subnormals, +-0, +-448 and NaN's sign | 0x7ff00000 >> 16).
TEST(E4m3ToBf16, EveryByteInEveryPositionIsExact) {
  for (int rotation = 0; rotation < 256; rotation += 64) {
    uint8_t x[64];
    uint16_t out[64];
    for (int shift = 0; shift < 4; ++shift) {
      for (int i = 0; i < 64; ++i) x[i] = uint8_t(rotation + (i + 16 * shift) % 64);
      emulated_e4m3_to_bf16(x, out);
      for (int i = 0; i < 64; ++i) {
        const uint32_t expected = detail::float_to_bits(detail::f8e4m3_to_float(x[i])) >> 16;
        ASSERT_EQ(out[i], expected) << "byte 0x" << std::hex << int(x[i]) << " at " << std::dec << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16Packing, ::testing::ValuesIn(bf16_kernel_params()), bf16_kernel_param_name);

}  // namespace
}  // namespace tileattn::testing
