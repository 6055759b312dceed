// bf16_gemm of both bf16 product kernels (Bf16DotKernels: vdpbf16ps;
// AmxKernels: tiles) against a float64 reference: m = 1..40 (the AMX path's
// 32- and 16-row bands and its stack-block tail), n = 16, 48 and 64 (every
// column-panel width), k = 32 and 96, accumulate on and off, with and without
// A_lo. Rows of C past m and columns past n are sentinels that must survive;
// A's 16 slack rows past m (ForwardScratchLayout gives the A operands those)
// hold NaN, which must not reach C. Emulated everywhere, native where the CPU
// has AVX512-BF16 / AMX.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "isa/bf16_kernel_params.hpp"

namespace tileattn::testing {
namespace {

float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
uint16_t truncate_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t(u >> 16);
}

constexpr float kSentinel = -12345.5f;
constexpr uint16_t kNaNBf16 = 0x7fc1;

// One product's operands: A and A_lo (m + 16 slack rows, lda), B (k x n) in
// the pair layout (n / 16 panels of k / 2 pair rows x 16 x 2), C (m + 16 rows,
// ldc), with C's initial value kept for the reference.
struct GemmData {
  int64_t m, n, k, lda, ldc, b_panel;
  AlignedBuffer<uint16_t> a, a_lo, b;
  std::vector<float> b_logical;  // (k, n)
  AlignedBuffer<float> c;
  std::vector<float> c_initial;

  GemmData(int64_t m_, int64_t n_, int64_t k_, std::mt19937& rng)
      : m(m_), n(n_), k(k_), lda(k_ + 32), ldc(n_ + 8), b_panel(16 * k_),
        a(size_t((m_ + 16) * (k_ + 32)), kNaNBf16), a_lo(size_t((m_ + 16) * (k_ + 32)), kNaNBf16),
        b(size_t(n_ / 16 * 16 * k_), 0), b_logical(size_t(k_ * n_)), c(size_t((m_ + 16) * (n_ + 8)), kSentinel) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) {
        const float x = uniform(rng);
        a[size_t(i * lda + p)] = truncate_bf16(x);
        a_lo[size_t(i * lda + p)] = truncate_bf16(x * 0x1p-9f);  // P's lo part is about 2^-9 of hi
      }
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) {
        const uint16_t v = truncate_bf16(uniform(rng));
        b_logical[size_t(p * n + j)] = widen(v);
        b[size_t((j / 16) * b_panel + (p / 2) * 32 + (j % 16) * 2 + p % 2)] = v;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[size_t(i * ldc + j)] = uniform(rng) * 4.0f;
    c_initial.assign(c.get(), c.get() + c.count);
  }
};

class Bf16Gemm : public ::testing::TestWithParam<Bf16KernelParam> {};

// Within (2k + 4) fp32 roundings of the sum of |terms| (each step of either
// kernel rounds once; products are exact), and sentinels intact.
TEST_P(Bf16Gemm, MatchesFloat64Reference) {
  TILEATTN_BF16_KERNELS(kernels);
  std::mt19937 rng(11);
  for (int64_t m = 1; m <= 40; ++m)
    for (int64_t n : {16, 48, 64})
      for (int64_t k : {32, 96})
        for (bool accumulate : {false, true})
          for (bool with_lo : {false, true}) {
            GemmData g(m, n, k, rng);
            kernels.gemm(m, n, k, g.a.get(), with_lo ? g.a_lo.get() : nullptr, g.lda, g.b.get(), g.b_panel,
                         g.c.get(), g.ldc, accumulate);
            const double bound_per_term = double(2 * k + 4) * 0x1p-24;
            for (int64_t i = 0; i < m + 16; ++i)
              for (int64_t j = 0; j < g.ldc; ++j) {
                const float got = g.c[size_t(i * g.ldc + j)];
                if (i >= m || j >= n) {
                  ASSERT_EQ(got, kSentinel) << "m " << m << " n " << n << " k " << k << ": C(" << i << ", " << j
                                            << ") outside the product was written";
                  continue;
                }
                double sum = accumulate ? g.c_initial[size_t(i * g.ldc + j)] : 0.0, magnitude = std::fabs(sum);
                for (int64_t p = 0; p < k; ++p) {
                  const double bv = g.b_logical[size_t(p * n + j)];
                  const double hi = widen(g.a[size_t(i * g.lda + p)]) * bv;
                  const double lo = with_lo ? widen(g.a_lo[size_t(i * g.lda + p)]) * bv : 0.0;
                  sum += hi + lo;
                  magnitude += std::fabs(hi) + std::fabs(lo);
                }
                ASSERT_LE(std::fabs(got - sum), bound_per_term * magnitude)
                    << "m " << m << " n " << n << " k " << k << " accumulate " << accumulate << " a_lo " << with_lo
                    << ": C(" << i << ", " << j << ") = " << got << ", float64 " << sum;
              }
          }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16Gemm, ::testing::ValuesIn(bf16_kernel_params()), bf16_kernel_param_name);

}  // namespace
}  // namespace tileattn::testing
