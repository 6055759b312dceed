// Each AVX-512 kernel (run on the scalar emulation) against the portable
// kernels, on random data with every tail length, with the inputs ending at a
// guard page so that any access past the data crashes the test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "isa/emulated_avx512_kernels.hpp"
#include "isa/generic/kernels.hpp"
#include "isa/guarded_buffer.hpp"

namespace tileattn::testing {
namespace {

using Avx512 = detail::avx512_emulated::Kernels;
using Generic = detail::generic::Kernels;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};

int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// Bitwise equality, except that any NaN matches any NaN.
bool same_value(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b);
}

// Units in the last place between two finite floats of the same sign.
int64_t ulp_distance(float a, float b) {
  const int64_t x = int64_t(bits_of(a) & 0x7fffffffu), y = int64_t(bits_of(b) & 0x7fffffffu);
  return x > y ? x - y : y - x;
}

std::vector<float> uniform(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// n elements of `dtype` holding `values` (element stride `stride`), ending at a guard page.
void* store_elements(GuardedBuffer& buf, const std::vector<float>& values, DType dtype,
                     int64_t stride) {
  const int64_t n = int64_t(values.size());
  const int64_t esize = int64_t(dtype_size(dtype));
  const int64_t span = n == 0 ? 0 : (n - 1) * stride + 1;
  char* p = buf.at_end<char>(size_t(span * esize));
  std::memset(p, 0x7f, size_t(span * esize));  // gaps between strided elements: garbage
  for (int64_t j = 0; j < n; ++j) {
    const float x = values[size_t(j)];
    if (dtype == DType::f32) std::memcpy(p + j * stride * 4, &x, 4);
    if (dtype == DType::f16) {
      const uint16_t h = detail::float_to_f16(x);
      std::memcpy(p + j * stride * 2, &h, 2);
    }
    if (dtype == DType::bf16) {
      const uint16_t h = detail::float_to_bf16(x);
      std::memcpy(p + j * stride * 2, &h, 2);
    }
  }
  return p;
}

// The emulation itself: what the hardware would fault on, it faults on; what
// fault suppression allows (masked-off lanes past the end), it allows.
TEST(Avx512Emulation, AlignedAccessFaultsWhenMisaligned) {
  namespace emu = avx512_emulation;
  alignas(64) float storage[32] = {};
  EXPECT_DEATH(
      {
        volatile float sum = emu::_mm512_reduce_add_ps(emu::_mm512_load_ps(storage + 1));
        (void)sum;
      },
      "not 64-byte aligned");
  EXPECT_DEATH(emu::_mm512_store_ps(storage + 4, emu::_mm512_setzero_ps()), "not 64-byte aligned");
  EXPECT_EQ(emu::_mm512_reduce_add_ps(emu::_mm512_load_ps(storage)), 0.0f);
}

TEST(Avx512Emulation, MaskedOffLanesPastTheEndAreNotTouched) {
  namespace emu = avx512_emulation;
  GuardedBuffer buf(64);
  float* three = buf.at_end<float>(3 * 4);  // 3 floats, then the guard page
  three[0] = 1.0f;
  three[1] = 2.0f;
  three[2] = 4.0f;
  const emu::__m512 v = emu::_mm512_maskz_loadu_ps(0x7, three);
  EXPECT_EQ(emu::_mm512_reduce_add_ps(v), 7.0f);
  emu::_mm512_mask_storeu_ps(three, 0x7, emu::_mm512_add_ps(v, v));
  EXPECT_EQ(three[2], 8.0f);
  // An unmasked load past the end faults (its value is used so that it is not elided).
  EXPECT_DEATH(
      {
        volatile float sum = emu::_mm512_reduce_add_ps(emu::_mm512_loadu_ps(three));
        (void)sum;
      },
      "");
}

TEST(Avx512EmulatedKernels, RowMaxMatchesGenericForEveryTail) {
  std::mt19937 rng(1);
  GuardedBuffer buf(64 * 4);
  for (int64_t n = 0; n <= 33; ++n) {
    std::vector<float> x = uniform(rng, n, -50.0f, 50.0f);
    if (n > 2) x[size_t(n / 2)] = -kInf;
    float* p = buf.at_end<float>(size_t(n) * 4);
    std::copy(x.begin(), x.end(), p);
    EXPECT_TRUE(same_value(Avx512::row_max(p, n), Generic::row_max(p, n))) << "n " << n;
    // All -inf (a fully masked row) and the largest value in the last lane.
    std::fill(p, p + n, -kInf);
    EXPECT_EQ(Avx512::row_max(p, n), -kInf) << "n " << n;
    if (n > 0) {
      p[n - 1] = 3.0f;
      EXPECT_EQ(Avx512::row_max(p, n), 3.0f) << "n " << n;
    }
    // A NaN anywhere, including the tail lanes, makes the max NaN.
    for (int64_t at = 0; at < n; ++at) {
      std::copy(x.begin(), x.end(), p);
      p[at] = kNaN;
      EXPECT_TRUE(std::isnan(Avx512::row_max(p, n))) << "n " << n << " NaN at " << at;
    }
  }
}

TEST(Avx512EmulatedKernels, Exp2SumMatchesGenericForEveryTail) {
  std::mt19937 rng(2);
  GuardedBuffer buf(64 * 4);
  for (int64_t n = 0; n <= 33; ++n)
    for (float sub : {0.0f, 3.5f, -20.0f, kInf}) {  // +inf: the backward's rows that see no key
      // Arguments from far below exp2's flush point (-126) to above its clamp (127).
      std::vector<float> x = uniform(rng, n, -160.0f, 8.0f);
      if (n > 3) {
        x[0] = -kInf;
        x[1] = sub - 126.0f;  // exactly at the flush point: 2^-126, not 0
        x[2] = sub + 200.0f;  // clamped to 2^127 * 2^(0) by both paths
      }
      float* p = buf.at_end<float>(size_t(n) * 4);
      std::copy(x.begin(), x.end(), p);
      const float got_sum = Avx512::exp2_sum(p, n, sub);
      std::vector<float> want(x);
      const float want_sum = Generic::exp2_sum(want.data(), n, sub);
      for (int64_t j = 0; j < n; ++j) {
        const float got = p[j], w = want[size_t(j)];
        if (std::isnan(w)) {
          EXPECT_TRUE(std::isnan(got)) << "n " << n << " j " << j << " x " << x[size_t(j)];
        } else if (w == 0.0f || std::isinf(w)) {
          EXPECT_EQ(got, w) << "n " << n << " j " << j << " x " << x[size_t(j)];
        } else {
          // Fused vs separate multiply-adds in the polynomial: a few ulp.
          EXPECT_LE(ulp_distance(got, w), 4) << "n " << n << " j " << j << " x " << x[size_t(j)];
        }
      }
      if (std::isfinite(want_sum)) {
        EXPECT_NEAR(got_sum, want_sum, 1e-5 * std::fabs(want_sum)) << "n " << n;
      } else {
        EXPECT_TRUE(same_value(got_sum, want_sum)) << "n " << n << ": " << got_sum << " vs " << want_sum;
      }
    }
}

// The softmax passes over a tile (row_max_rows / exp2_sum_rows, four rows at
// a time plus the rest one by one) give every row bitwise what row_max /
// exp2_sum give it alone: tiles of 1..9 rows, every tail, rows with NaN,
// -inf and fully masked (all -inf), a padded row stride.
TEST(Avx512EmulatedKernels, TileSoftmaxPassesEqualTheRowByRowOnes) {
  std::mt19937 rng(4);
  for (int64_t rows = 1; rows <= 9; ++rows)
    for (int64_t n : {0, 1, 15, 16, 17, 33, 64, 65}) {
      const int64_t ld = pad16(n) + 16;
      std::vector<float> tile(size_t(rows * ld), 7.0f);  // padding must stay as it is
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float> x = uniform(rng, n, -40.0f, 10.0f);
        std::copy(x.begin(), x.end(), tile.begin() + r * ld);
        if (n > 0 && r % 4 == 1) tile[size_t(r * ld + (r * 7) % n)] = kNaN;
        if (n > 0 && r % 4 == 2) std::fill(tile.begin() + r * ld, tile.begin() + r * ld + n, -kInf);
        if (n > 1 && r % 4 == 3) tile[size_t(r * ld + n - 1)] = -kInf;
      }
      SCOPED_TRACE("rows " + std::to_string(rows) + " n " + std::to_string(n));
      std::vector<float> maxima(static_cast<size_t>(rows)), want_max(static_cast<size_t>(rows));
      Avx512::row_max_rows(tile.data(), ld, rows, n, maxima.data());
      for (int64_t r = 0; r < rows; ++r) {
        want_max[size_t(r)] = Avx512::row_max(tile.data() + r * ld, n);
        EXPECT_TRUE(same_value(maxima[size_t(r)], want_max[size_t(r)])) << "row " << r;
      }
      // Subtract finite maxima (a fully masked row subtracts 0, as the main loop does).
      std::vector<float> sub(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) sub[size_t(r)] = std::isfinite(want_max[size_t(r)]) ? want_max[size_t(r)] : 0.0f;
      std::vector<float> got = tile, want = tile, sums(static_cast<size_t>(rows));
      Avx512::exp2_sum_rows(got.data(), ld, rows, n, sub.data(), sums.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float want_sum = Avx512::exp2_sum(want.data() + r * ld, n, sub[size_t(r)]);
        EXPECT_TRUE(same_value(sums[size_t(r)], want_sum)) << "row " << r;
      }
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_TRUE(same_value(got[i], want[i])) << "element " << i << ": " << got[i] << " vs " << want[i];
    }
}

TEST(Avx512EmulatedKernels, Exp2SumPropagatesNaNAndNothingElse) {
  GuardedBuffer buf(64 * 4);
  for (int64_t n = 1; n <= 33; ++n)
    for (int64_t at = 0; at < n; ++at) {
      float* p = buf.at_end<float>(size_t(n) * 4);
      std::fill(p, p + n, -1.0f);
      p[at] = kNaN;
      const float sum = Avx512::exp2_sum(p, n, 0.0f);
      EXPECT_TRUE(std::isnan(sum));
      for (int64_t j = 0; j < n; ++j)
        EXPECT_EQ(std::isnan(p[j]), j == at) << "n " << n << " j " << j;
      for (int64_t j = 0; j < n; ++j) {
        if (j != at) {
          EXPECT_EQ(p[j], 0.5f);
        }
      }
    }
}

TEST(Avx512EmulatedKernels, ScaleMatchesGenericForEveryTail) {
  std::mt19937 rng(3);
  GuardedBuffer buf(64 * 4);
  for (int64_t n = 0; n <= 33; ++n) {
    const std::vector<float> x = uniform(rng, n, -10.0f, 10.0f);
    float* p = buf.at_end<float>(size_t(n) * 4);
    std::copy(x.begin(), x.end(), p);
    Avx512::scale(p, n, 0.37f);
    std::vector<float> want(x);
    Generic::scale(want.data(), n, 0.37f);
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(p[j], want[size_t(j)]) << "n " << n << " j " << j;
  }
}

TEST(Avx512EmulatedKernels, LoadRowMatchesGenericForEveryDtypeStrideAndTail) {
  std::mt19937 rng(4);
  GuardedBuffer src_buf(64 * 3 * 4), dst_buf(64 * 4);
  for (DType dtype : kDTypes)
    for (int64_t stride : {1, 3})
      for (int64_t n = 0; n <= 33; ++n) {
        std::vector<float> x = uniform(rng, n, -4.0f, 4.0f);
        if (n > 4) {
          x[1] = kInf;
          x[2] = 1e-6f;  // fp16 subnormal
        }
        const void* src = store_elements(src_buf, x, dtype, stride);
        // dst is padded to a multiple of 16: exactly that much before the guard.
        const int64_t n_pad = pad16(n);
        float* got = dst_buf.at_end<float>(size_t(n_pad) * 4);
        std::fill(got, got + n_pad, kNaN);
        Avx512::load_row(src, dtype, n, stride, 0.75f, got);
        std::vector<float> want(size_t(n_pad), kNaN);
        Generic::load_row(src, dtype, n, stride, 0.75f, want.data());
        for (int64_t j = 0; j < n_pad; ++j)
          EXPECT_TRUE(same_value(got[j], want[size_t(j)]))
              << dtype_name(dtype) << " stride " << stride << " n " << n << " j " << j << ": "
              << got[j] << " vs " << want[size_t(j)];
      }
}

TEST(Avx512EmulatedKernels, LoadRowConvertsNaNs) {
  GuardedBuffer buf(64 * 4), dst_buf(64 * 4);
  for (DType dtype : kDTypes)
    for (int64_t n = 1; n <= 17; ++n) {
      std::vector<float> x(size_t(n), 1.0f);
      x[size_t(n - 1)] = kNaN;
      const void* src = store_elements(buf, x, dtype, 1);
      float* dst = dst_buf.at_end<float>(size_t(pad16(n)) * 4);
      Avx512::load_row(src, dtype, n, 1, 2.0f, dst);
      for (int64_t j = 0; j < n; ++j) EXPECT_EQ(std::isnan(dst[j]), j == n - 1);
    }
}

TEST(Avx512EmulatedKernels, StoreRowMatchesGenericForEveryDtypeStrideAndTail) {
  std::mt19937 rng(5);
  GuardedBuffer src_buf(64 * 4), dst_buf(64 * 3 * 4);
  for (DType dtype : kDTypes)
    for (int64_t stride : {1, 3})
      for (int64_t n = 0; n <= 33; ++n) {
        std::vector<float> x = uniform(rng, n, -3.0f, 3.0f);
        if (n > 6) {  // x[1..6] exist
          x[1] = 70000.0f;    // overflows fp16 to inf
          x[2] = 3e-6f;       // fp16 subnormal after scaling
          x[3] = 1.00048828125f;  // an fp16 tie: rounds to even
          x[4] = kNaN;
          x[5] = 1.00390625f;     // a bf16 tie (1 + 2^-8): rounds to even, down
          x[6] = 1.01171875f;     // a bf16 tie (1 + 3 x 2^-8): rounds to even, up
        }
        float* src = src_buf.at_end<float>(size_t(n) * 4);
        std::copy(x.begin(), x.end(), src);
        const int64_t esize = int64_t(dtype_size(dtype));
        const int64_t span = n == 0 ? 0 : (n - 1) * stride + 1;
        char* got = dst_buf.at_end<char>(size_t(span * esize));
        std::vector<char> want(size_t(span * esize), 0x55);
        std::memset(got, 0x55, size_t(span * esize));  // gaps must stay as they were
        Avx512::store_row(src, 1.0f, n, dtype, got, stride);
        Generic::store_row(src, 1.0f, n, dtype, want.data(), stride);
        for (int64_t e = 0; e < span; ++e) {
          const bool is_nan_slot = n > 6 && e == 4 * stride;
          if (is_nan_slot && dtype != DType::bf16) {
            // The hardware keeps a NaN's payload; only NaN-ness is the contract
            // (bf16 is rounded with integer operations: the same bits as float_to_bf16).
            const float got_value = detail::load_element(got, int(dtype), e);
            EXPECT_TRUE(std::isnan(got_value));
            continue;
          }
          EXPECT_EQ(std::memcmp(got + e * esize, want.data() + e * esize, size_t(esize)), 0)
              << dtype_name(dtype) << " stride " << stride << " n " << n << " element " << e;
        }
      }
}

TEST(Avx512EmulatedKernels, StoreRowScales) {
  GuardedBuffer src_buf(64 * 4), dst_buf(64 * 4);
  for (DType dtype : kDTypes)
    for (int64_t n = 1; n <= 33; ++n) {
      float* src = src_buf.at_end<float>(size_t(n) * 4);
      for (int64_t j = 0; j < n; ++j) src[j] = float(j + 1);
      void* dst = dst_buf.at_end(size_t(n * int64_t(dtype_size(dtype))));
      Avx512::store_row(src, 0.5f, n, dtype, dst, 1);
      for (int64_t j = 0; j < n; ++j)
        EXPECT_EQ(detail::load_element(dst, int(dtype), j), 0.5f * float(j + 1)) << dtype_name(dtype);
    }
}

TEST(Avx512EmulatedKernels, PackTransposedMatchesGenericForEveryShape) {
  std::mt19937 rng(6);
  constexpr int64_t kMaxRows = 40, kMaxD = 40;
  std::vector<std::unique_ptr<GuardedBuffer>> row_bufs;
  for (int64_t r = 0; r < kMaxRows; ++r)
    row_bufs.push_back(std::make_unique<GuardedBuffer>(kMaxD * 3 * 4));
  for (DType dtype : kDTypes)
    for (int64_t stride : {1, 3})
      for (int64_t n_rows = 1; n_rows <= kMaxRows; ++n_rows)
        for (int64_t d = 1; d <= kMaxD; ++d) {
          std::vector<const void*> rows(static_cast<size_t>(n_rows));
          for (int64_t r = 0; r < n_rows; ++r)
            rows[size_t(r)] = store_elements(*row_bufs[size_t(r)], uniform(rng, d, -2.0f, 2.0f),
                                             dtype, stride);
          const int64_t ld = pad16(n_rows) + 16;  // wider than needed: the rest stays untouched
          std::vector<float, std::allocator<float>> got_storage(size_t(d * ld + 16), -7.0f);
          // 64-byte aligned destination, as the main loop's scratch is.
          float* got = got_storage.data();
          while (reinterpret_cast<uintptr_t>(got) % 64) ++got;
          std::vector<float> want(size_t(d * ld), -7.0f);
          Avx512::pack_transposed(rows.data(), n_rows, dtype, d, stride, got, ld);
          Generic::pack_transposed(rows.data(), n_rows, dtype, d, stride, want.data(), ld);
          for (int64_t e = 0; e < d * ld; ++e)
            if (!same_value(got[e], want[size_t(e)])) {
              ADD_FAILURE() << dtype_name(dtype) << " stride " << stride << " n_rows " << n_rows
                            << " d " << d << ": column " << e / ld << " row " << e % ld << ": "
                            << got[e] << " vs " << want[size_t(e)];
              break;
            }
        }
}

// Aligned fp32 storage for gemm's B and C (64-byte aligned, as the contract asks).
struct AlignedFloats {
  explicit AlignedFloats(size_t n, float fill) : storage(n + 16, fill) {
    data = storage.data();
    while (reinterpret_cast<uintptr_t>(data) % 64) ++data;
  }
  std::vector<float> storage;
  float* data;
};

TEST(Avx512EmulatedKernels, GemmMatchesFloat64ForEveryRowTailAndPanelWidth) {
  std::mt19937 rng(7);
  for (int64_t m = 1; m <= 13; ++m)
    for (int64_t n : {16, 32, 48})
      for (int64_t k : {1, 5, 64})
        for (bool accumulate : {false, true}) {
          const int64_t lda = k + 3, ldb = n + 16, ldc = n + 16;
          const std::vector<float> a = uniform(rng, m * lda, -1.0f, 1.0f);
          AlignedFloats b(size_t(k * ldb), 0.0f), c(size_t((m + 1) * ldc), -9.0f);
          const std::vector<float> b_values = uniform(rng, k * ldb, -1.0f, 1.0f);
          std::copy(b_values.begin(), b_values.end(), b.data);
          const std::vector<float> c0 = uniform(rng, m * ldc, -1.0f, 1.0f);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) c.data[i * ldc + j] = c0[size_t(i * ldc + j)];
          Avx512::gemm(m, n, k, a.data(), lda, b.data, ldb, c.data, ldc, accumulate);
          for (int64_t i = 0; i < m + 1; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              const float got = c.data[i * ldc + j];
              if (i == m || j >= n) {  // outside C(m, n): untouched
                ASSERT_EQ(got, -9.0f) << i << "," << j;
                continue;
              }
              double exact = accumulate ? double(c0[size_t(i * ldc + j)]) : 0.0;
              double magnitude = std::fabs(exact);
              for (int64_t p = 0; p < k; ++p) {
                const double term = double(a[size_t(i * lda + p)]) * double(b.data[p * ldb + j]);
                exact += term;
                magnitude += std::fabs(term);
              }
              // Recursive summation bound: (k + 1) u sum|terms|.
              const double bound = double(k + 1) * 0x1p-24 * magnitude + 1e-30;
              ASSERT_LE(std::fabs(double(got) - exact), bound)
                  << "m " << m << " n " << n << " k " << k << " acc " << accumulate << " at " << i
                  << "," << j;
            }
        }
}

}  // namespace
}  // namespace tileattn::testing
