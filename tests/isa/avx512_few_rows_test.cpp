// The AVX-512 few-rows products called directly, on AVX-512 CPUs only (the
// test is skipped, and says so, elsewhere; the main loop's decode tests cover
// the AVX2 and portable products on every CPU). Every K/V row ends at a guard
// page in half the cases, so a read past a row's last element crashes; int8
// and fp8 e4m3 rows hold every byte value but fp8's NaNs, and fp8 runs
// through both its routes (byte permutes where the CPU has VBMI, fp16); the
// score and accumulator tiles carry sentinels around the written block. Scores
// and accumulators are checked against a float64 sum with an fp32 summation
// bound, |error| <= 128 * 2^-24 * sum |terms|: a score goes through ~20
// roundings (16 FMAs per lane, a 4-level tree), an accumulator through one
// FMA per key (n <= 70), and a wrong element, lane or row is off by a whole
// term.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "core/half.hpp"
#include "isa/guarded_buffer.hpp"
#include "isa/native_avx512_few_rows.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

constexpr float kSentinel = -12345.0f;

// n rows of d elements of `dtype`, each its own allocation: against a guard
// page (guarded) or at a random element offset in a plain buffer.
struct Rows {
  std::vector<std::unique_ptr<GuardedBuffer>> guards;
  std::vector<char> plain;
  std::vector<const void*> pointers;
  std::vector<std::vector<double>> values;  // as the kernels read them

  Rows(int64_t n, int64_t d, DType dtype, bool guarded, std::mt19937_64& rng) {
    const size_t esize = dtype_size(dtype), bytes = size_t(d) * esize;
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    plain.resize(size_t(n) * (bytes + 64) + 64);
    for (int64_t r = 0; r < n; ++r) {
      char* row;
      if (guarded) {
        guards.push_back(std::make_unique<GuardedBuffer>(bytes));
        row = guards.back()->at_end<char>(bytes);
      } else {
        row = plain.data() + size_t(r) * (bytes + 64) + esize * (rng() % 8);
      }
      std::vector<double> v(static_cast<size_t>(d));
      for (int64_t t = 0; t < d; ++t) {
        const float x = value(rng);
        if (dtype == DType::f32) {
          std::memcpy(row + t * 4, &x, 4);
          v[size_t(t)] = x;
        } else if (dtype == DType::i8) {
          // Every int8, -128 included (the kernels see the raw element; scales are the caller's).
          const int8_t b = int8_t(rng() % 256);
          std::memcpy(row + t, &b, 1);
          v[size_t(t)] = b;
        } else if (dtype == DType::f8_e4m3) {
          // Every finite e4m3 byte, denormals and both zeros included (0x7f / 0xff are NaN).
          uint8_t b = uint8_t(rng() % 256);
          if ((b & 0x7f) == 0x7f) b ^= 1u;
          std::memcpy(row + t, &b, 1);
          v[size_t(t)] = detail::f8e4m3_to_float(b);
        } else {
          const uint16_t h = dtype == DType::f16 ? detail::float_to_f16(x) : detail::float_to_bf16(x);
          std::memcpy(row + t * 2, &h, 2);
          v[size_t(t)] = dtype == DType::f16 ? detail::f16_to_float(h) : detail::bf16_to_float(h);
        }
      }
      pointers.push_back(row);
      values.push_back(std::move(v));
    }
  }
};

// tile[r * ld + c] for r <= rows, c < ld: inside [0, rows) x [0, width)
// within the fp32 summation bound of exact(r, c) = {float64 sum, sum of
// |terms|}; outside (the padding and the sentinel row after the block)
// equal to `before`, the tile as it was before the call.
template <class Exact>
::testing::AssertionResult tile_matches(const char* name, const std::vector<float>& tile,
                                        const std::vector<float>& before, int64_t rows, int64_t width,
                                        int64_t ld, Exact exact) {
  for (int64_t r = 0; r <= rows; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      const float got = tile[size_t(r * ld + c)];
      if (r == rows || c >= width) {
        if (got != before[size_t(r * ld + c)])
          return ::testing::AssertionFailure() << name << " written outside the block at " << r << ", " << c;
        continue;
      }
      const auto [sum, abs_sum] = exact(r, c);
      if (std::fabs(got - sum) > 128.0 * 0x1p-24 * abs_sum)
        return ::testing::AssertionFailure() << name << "[" << r << ", " << c << "] = " << got << ", float64 " << sum;
    }
  return ::testing::AssertionSuccess();
}

TEST(Avx512FewRowsNative, ScoresAndAccumulateMatchFloat64AndStayInBounds) {
  if (!isa_available(Isa::avx512)) GTEST_SKIP() << "this CPU has no AVX-512 (F/BW/DQ/VL)";
  std::mt19937_64 rng(2026'12'01);
  const int64_t dims[] = {1, 7, 15, 16, 17, 31, 32, 33, 48, 64, 80, 100, 128, 129, 200, 255, 256};
  int cases = 0;
  // fp8 twice: as FewRows16Kernels converts it here (byte permutes where
  // CPUID has VBMI) and through fp16, as CPUs without VBMI do. Without VBMI
  // both runs take the fp16 route, and the test says so.
  if (!cpu_features().avx512_vbmi)
    std::printf("note: no AVX512-VBMI here: the fp8 byte-permute route is not run, only the fp16 route\n");
  const std::pair<DType, bool> types[] = {{DType::f32, false}, {DType::f16, false},     {DType::bf16, false},
                                          {DType::i8, false},  {DType::f8_e4m3, false}, {DType::f8_e4m3, true}};
  for (const auto& [dtype, fp16_route] : types)
    for (int64_t m = 1; m <= 8; ++m)
      for (int64_t d : dims) {
        const int64_t n = 1 + int64_t(rng() % 70);
        const bool guarded = (cases++ % 2) == 0;
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (fp16_route ? " (fp16 route)" : "") + " m=" +
                     std::to_string(m) + " n=" + std::to_string(n) + " d=" + std::to_string(d) +
                     (guarded ? " guarded" : ""));
        const Rows keys(n, d, dtype, guarded, rng), values(n, d, dtype, guarded, rng);
        std::uniform_real_distribution<float> value(-1.0f, 1.0f);
        const int64_t ldq = d + int64_t(rng() % 5), lds = n + int64_t(rng() % 5), ldacc = d + int64_t(rng() % 5);
        std::vector<float> q(size_t(m * ldq)), p(size_t(m * lds));
        for (float& x : q) x = value(rng);
        for (float& x : p) x = value(rng) * 0.5f + 0.5f;
        // Tiles with one sentinel row after the block: writes stay in [0, m) x [0, n or d).
        std::vector<float> s(size_t((m + 1) * lds), kSentinel), acc(size_t((m + 1) * ldacc), kSentinel);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t t = 0; t < d; ++t) acc[size_t(r * ldacc + t)] = value(rng);
        const std::vector<float> s_before = s, acc_before = acc;

        native_avx512::few_rows_scores(m, n, d, q.data(), ldq, keys.pointers.data(), dtype, s.data(), lds,
                                       fp16_route);
        native_avx512::few_rows_accumulate(m, n, d, p.data(), lds, values.pointers.data(), dtype, acc.data(),
                                           ldacc, fp16_route);

        ASSERT_TRUE(tile_matches("s", s, s_before, m, n, lds, [&](int64_t r, int64_t c) {
          double sum = 0.0, abs_sum = 0.0;
          for (int64_t t = 0; t < d; ++t) {
            const double term = double(q[size_t(r * ldq + t)]) * keys.values[size_t(c)][size_t(t)];
            sum += term;
            abs_sum += std::fabs(term);
          }
          return std::pair{sum, abs_sum};
        }));
        ASSERT_TRUE(tile_matches("acc", acc, acc_before, m, d, ldacc, [&](int64_t r, int64_t t) {
          double sum = acc_before[size_t(r * ldacc + t)], abs_sum = std::fabs(sum);
          for (int64_t c = 0; c < n; ++c) {
            const double term = double(p[size_t(r * lds + c)]) * values.values[size_t(c)][size_t(t)];
            sum += term;
            abs_sum += std::fabs(term);
          }
          return std::pair{sum, abs_sum};
        }));
      }
}

}  // namespace
}  // namespace tileattn::testing
