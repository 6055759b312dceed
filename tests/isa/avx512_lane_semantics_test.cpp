// The emulation's per-lane semantics checked against real hardware: for every
// AVX-512 instruction the kernels use that has an AVX/AVX2/FMA/F16C
// counterpart with the same lane operation (MAXPS, ROUNDPS = VRNDSCALEPS with
// scale 0, CMPPS predicates, VFMADD, VCVTPH2PS, VCVTPS2PH), the two must agree
// bit for bit, NaN payloads included. VSCALEFPS has no such counterpart and is
// checked against the SDM's table, VREDUCEPS against itself where the CPU
// has it. Only the checking functions are compiled
// for AVX2 (target attributes), so the binary still starts on older CPUs,
// where these tests are skipped, not passed.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "isa/avx512_lane_semantics.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

namespace lane = avx512_emulation::lane;

// The library's own detection (CPUID and the OS's saved ymm state), not
// __builtin_cpu_supports: clang 14 does not know "f16c" there.
bool cpu_has_avx2_fma_f16c() { return isa_available(Isa::avx2); }
#define REQUIRE_AVX2()                                                           \
  if (!cpu_has_avx2_fma_f16c()) GTEST_SKIP() << "needs AVX2, FMA and F16C to compare with"

uint32_t bits(float x) { return lane::bits(x); }

// Values where x86 semantics differ from IEEE or C++: NaNs (quiet, signalling,
// negative, with payload), signed zeros, infinities, subnormals, ties.
std::vector<float> special_values() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f,
                          3.5f, -127.4f, 126.6f, 1e-40f, -1e-40f, 3.4e38f, -3.4e38f,
                          8388607.5f, 8388608.0f, -8388609.0f, 65504.0f, 65520.0f, 65519.99f,
                          5.96e-8f, 2.98e-8f, 2.99e-8f};
  v.push_back(std::numeric_limits<float>::infinity());
  v.push_back(-std::numeric_limits<float>::infinity());
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fc0abcdu})
    v.push_back(lane::from_bits(nan));
  return v;
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = rng();
    // Half random bit patterns (every exponent, NaNs), half moderate values.
    v.push_back(i % 2 ? lane::from_bits(r) : float(int32_t(r) % 20000) / 64.0f);
  }
  return v;
}

// Runs op8(a[8], b[8], out[8]) on the hardware and compares with lane_op per element.
template <class Hardware, class Emulated>
void compare_pairs(const std::vector<float>& xs, const std::vector<float>& ys, Hardware hardware,
                   Emulated emulated, const char* what) {
  std::vector<float> a, b;
  for (float x : xs)
    for (float y : ys) {
      a.push_back(x);
      b.push_back(y);
    }
  while (a.size() % 8) {
    a.push_back(0.0f);
    b.push_back(0.0f);
  }
  for (size_t i = 0; i < a.size(); i += 8) {
    float out[8];
    hardware(&a[i], &b[i], out);
    for (size_t j = 0; j < 8; ++j) {
      const float want = out[j], got = emulated(a[i + j], b[i + j]);
      ASSERT_EQ(bits(got), bits(want)) << what << "(" << a[i + j] << " [" << std::hex
                                       << bits(a[i + j]) << "], " << b[i + j] << " ["
                                       << bits(b[i + j]) << "]): hardware " << bits(want)
                                       << ", emulation " << bits(got);
    }
  }
}

__attribute__((target("avx2"))) void hw_max(const float* a, const float* b, float* out) {
  _mm256_storeu_ps(out, _mm256_max_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b)));
}
__attribute__((target("avx2"))) void hw_min(const float* a, const float* b, float* out) {
  _mm256_storeu_ps(out, _mm256_min_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b)));
}

TEST(Avx512LaneSemantics, MaxAndMinReturnTheSecondOperandOnNaNAndZeros) {
  REQUIRE_AVX2();
  const std::vector<float> v = special_values();
  compare_pairs(v, v, hw_max, lane::max, "max");
  compare_pairs(v, v, hw_min, lane::min, "min");
  const std::vector<float> r = random_values(64, 1);
  compare_pairs(r, r, hw_max, lane::max, "max");
}

// Inputs for the rounding instructions: the special values, ties and near-ties
// around small integers, then random ones.
std::vector<float> rounding_values(uint32_t seed) {
  std::vector<float> v = special_values();
  for (int k = -12; k <= 12; ++k) {
    v.push_back(float(k) + 0.5f);
    v.push_back(float(k) + 0.49999997f);
    v.push_back(float(k) - 0.3f);
  }
  for (float x : random_values(4000, seed)) v.push_back(x);
  return v;
}

template <int Imm>
__attribute__((target("avx2"))) void hw_round(const float* a, const float*, float* out) {
  _mm256_storeu_ps(out, _mm256_round_ps(_mm256_loadu_ps(a), Imm));
}

template <int Imm>
void check_rounding(const std::vector<float>& v) {
  compare_pairs(v, {0.0f}, hw_round<Imm>,
                [](float x, float) { return lane::round_to_integer(x, Imm); }, "round");
}

TEST(Avx512LaneSemantics, RoundingMatchesRoundps) {
  REQUIRE_AVX2();
  const std::vector<float> v = rounding_values(2);
  check_rounding<_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC>(v);
  check_rounding<_MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC>(v);
  check_rounding<_MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC>(v);
  check_rounding<_MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC>(v);
  check_rounding<_MM_FROUND_CUR_DIRECTION>(v);  // MXCSR: nearest-even in these tests
}

// VREDUCEPS (AVX512DQ; no AVX2 counterpart): against the instruction itself
// where the CPU has AVX-512 (8 lanes of a 512-bit reduction), and everywhere
// against the values measured on the AMX Xeon (model 167).
template <int Imm>
__attribute__((target("avx512f,avx512dq"))) void hw_reduce(const float* a, const float*, float* out) {
  alignas(64) float lanes[16] = {};
  std::memcpy(lanes, a, 8 * sizeof(float));
  _mm512_store_ps(lanes, _mm512_reduce_ps(_mm512_load_ps(lanes), Imm));
  std::memcpy(out, lanes, 8 * sizeof(float));
}

TEST(Avx512LaneSemantics, ReduceMatchesVreduceps) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const float inf = std::numeric_limits<float>::infinity();
  const std::pair<float, uint32_t> measured[] = {
      {inf, 0x00000000u},     {-inf, 0x00000000u},    {-0.3f, 0xbe99999au}, {0.5f, 0x3f000000u},
      {1.5f, 0xbf000000u},    {2.5f, 0x3f000000u},    {-0.5f, 0xbf000000u}, {8388608.0f, 0x00000000u},
      {-1e30f, 0x00000000u},  {-0.0f, 0x00000000u},   {126.7f, 0xbe999a00u}, {-125.5f, 0x3f000000u},
      {3.4e38f, 0x00000000u}, {1e-40f, bits(1e-40f)}, {lane::from_bits(0x7f800001u), 0x7fc00001u}};
  for (const auto& [x, want] : measured)
    EXPECT_EQ(bits(lane::reduce(x, kNearest)), want) << "reduce(" << x << ")";
  constexpr int kDown = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
  EXPECT_EQ(bits(lane::reduce(-1e-40f, kDown)), 0x3f7fffffu);
  EXPECT_EQ(bits(lane::reduce(8388608.0f, kDown)), 0x80000000u);
  EXPECT_EQ(bits(lane::reduce(inf, kDown)), 0x00000000u);
  if (!isa_available(Isa::avx512)) GTEST_SKIP() << "table checked; needs AVX-512 to compare with the instruction";
  const std::vector<float> v = rounding_values(4);
  compare_pairs(v, {0.0f}, hw_reduce<kNearest>, [](float x, float) { return lane::reduce(x, kNearest); },
                "reduce");
  compare_pairs(v, {0.0f}, hw_reduce<kDown>, [](float x, float) { return lane::reduce(x, kDown); }, "reduce");
  constexpr int kUp = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC, kZero = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
  compare_pairs(v, {0.0f}, hw_reduce<kUp>, [](float x, float) { return lane::reduce(x, kUp); }, "reduce");
  compare_pairs(v, {0.0f}, hw_reduce<kZero>, [](float x, float) { return lane::reduce(x, kZero); }, "reduce");
  // Five fraction bits kept (the bf16 exponentials' table, exp2_table_masked_ps).
  constexpr int kFifths = (5 << 4) | kNearest;
  compare_pairs(v, {0.0f}, hw_reduce<kFifths>, [](float x, float) { return lane::reduce(x, kFifths); }, "reduce");
  compare_pairs(v, {0.0f}, hw_reduce<(5 << 4) | kDown>,
                [](float x, float) { return lane::reduce(x, (5 << 4) | kDown); }, "reduce");
}

template <int Predicate>
__attribute__((target("avx2"))) void hw_compare(const float* a, const float* b, float* out) {
  const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b), Predicate));
  for (int j = 0; j < 8; ++j) out[j] = float((mask >> j) & 1);
}

template <int... P>
void check_predicates(std::integer_sequence<int, P...>) {
  const std::vector<float> v = special_values();
  (compare_pairs(v, v, hw_compare<P>,
                 [](float x, float y) { return float(lane::compare(x, y, P)); }, "cmp"),
   ...);
}

TEST(Avx512LaneSemantics, EveryComparePredicateMatchesCmpps) {
  REQUIRE_AVX2();
  check_predicates(std::make_integer_sequence<int, 32>{});
}

__attribute__((target("avx2,fma"))) void hw_fma(const float* a, const float* b, const float* c,
                                                float* out) {
  _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b), _mm256_loadu_ps(c)));
}

TEST(Avx512LaneSemantics, FmaRoundsOnceLikeVfmadd) {
  REQUIRE_AVX2();
  const std::vector<float> x = random_values(4096, 3);
  std::vector<float> a(x.begin(), x.begin() + 1360), b(x.begin() + 1360, x.begin() + 2720),
      c(x.begin() + 2720, x.begin() + 4080);
  // Products that cancel against the addend: the single rounding shows.
  for (int i = 0; i < 64; ++i) {
    a.push_back(1.0f + float(i) * 0x1p-23f);
    b.push_back(1.0f - float(i) * 0x1p-23f);
    c.push_back(-1.0f);
  }
  for (size_t i = 0; i + 8 <= a.size(); i += 8) {
    float out[8];
    hw_fma(&a[i], &b[i], &c[i], out);
    for (size_t j = 0; j < 8; ++j) {
      const float got = std::fma(a[i + j], b[i + j], c[i + j]);
      if (std::isnan(out[j])) {
        ASSERT_TRUE(std::isnan(got));  // which NaN operand wins is not emulated
        continue;
      }
      ASSERT_EQ(bits(got), bits(out[j])) << a[i + j] << " * " << b[i + j] << " + " << c[i + j];
    }
  }
}

__attribute__((target("avx2,f16c"))) void hw_half_to_float(const uint16_t* h, float* out) {
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h))));
}

TEST(Avx512LaneSemantics, EveryHalfConvertsLikeVcvtph2ps) {
  REQUIRE_AVX2();
  for (uint32_t h0 = 0; h0 < 65536; h0 += 8) {
    uint16_t h[8];
    float out[8];
    for (int j = 0; j < 8; ++j) h[j] = uint16_t(h0 + uint32_t(j));
    hw_half_to_float(h, out);
    for (int j = 0; j < 8; ++j)
      ASSERT_EQ(bits(lane::half_to_float(h[j])), bits(out[j])) << std::hex << "half " << h[j];
  }
}

template <int Imm>
__attribute__((target("avx2,f16c"))) void hw_float_to_half(const float* x, uint16_t* out) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(_mm256_loadu_ps(x), Imm));
}

TEST(Avx512LaneSemantics, FloatsConvertToHalfLikeVcvtps2ph) {
  REQUIRE_AVX2();
  std::vector<float> v = special_values();
  for (float x : random_values(200000, 4)) v.push_back(x);
  // Around fp16's overflow and subnormal thresholds, and ties.
  for (uint32_t b = 0x477fe000u; b < 0x47800100u; b += 0x10u) v.push_back(lane::from_bits(b));
  for (uint32_t b = 0x33000000u; b < 0x38800000u; b += 0x3fffu) v.push_back(lane::from_bits(b));
  while (v.size() % 8) v.push_back(0.0f);
  for (size_t i = 0; i < v.size(); i += 8) {
    uint16_t nearest[8], current[8];
    hw_float_to_half<_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC>(&v[i], nearest);
    hw_float_to_half<_MM_FROUND_CUR_DIRECTION>(&v[i], current);
    for (size_t j = 0; j < 8; ++j) {
      ASSERT_EQ(lane::float_to_half(v[i + j], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                nearest[j])
          << std::hex << "float bits " << bits(v[i + j]);
      ASSERT_EQ(lane::float_to_half(v[i + j], _MM_FROUND_CUR_DIRECTION), current[j]);
    }
  }
}

// VSCALEFPS: no pre-AVX-512 counterpart, so the SDM's definition by example.
TEST(Avx512LaneSemantics, ScalefFollowsTheSdm) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(lane::scalef(1.5f, 3.0f), 12.0f);
  EXPECT_EQ(lane::scalef(1.5f, 3.7f), 12.0f);     // floor(3.7) = 3
  EXPECT_EQ(lane::scalef(1.5f, -0.5f), 0.75f);    // floor(-0.5) = -1, not truncation
  EXPECT_EQ(lane::scalef(-1.0f, -126.0f), -0x1p-126f);
  EXPECT_EQ(lane::scalef(1.0f, -149.0f), 0x1p-149f);  // subnormal result, no flush
  EXPECT_EQ(lane::scalef(1.0f, -150.0f), 0.0f);       // ties to even: 2^-150 -> 0
  EXPECT_EQ(lane::scalef(1.5f, -150.0f), 0x1p-149f);  // 1.5 * 2^-150 rounds up
  EXPECT_EQ(lane::scalef(1.0f, 128.0f), inf);         // overflow
  EXPECT_EQ(lane::scalef(1.0f, 1e30f), inf);
  EXPECT_EQ(lane::scalef(-1.0f, -1e30f), -0.0f);
  EXPECT_TRUE(std::signbit(lane::scalef(-1.0f, -1e30f)));
  EXPECT_EQ(lane::scalef(2.0f, inf), inf);
  EXPECT_EQ(bits(lane::scalef(-2.0f, -inf)), bits(-0.0f));
  EXPECT_EQ(bits(lane::scalef(0.0f, 5.0f)), bits(0.0f));
  EXPECT_EQ(bits(lane::scalef(-0.0f, 5.0f)), bits(-0.0f));
  EXPECT_EQ(lane::scalef(-inf, -3.0f), -inf);
  EXPECT_EQ(bits(lane::scalef(0.0f, inf)), 0xffc00000u);  // 0 * 2^inf: invalid
  EXPECT_EQ(bits(lane::scalef(inf, -inf)), 0xffc00000u);  // inf * 2^-inf: invalid
  EXPECT_EQ(bits(lane::scalef(lane::from_bits(0x7f800001u), 1.0f)), 0x7fc00001u);  // quieted
  EXPECT_EQ(bits(lane::scalef(1.0f, lane::from_bits(0xffc00002u))), 0xffc00002u);
  EXPECT_EQ(bits(lane::scalef(lane::from_bits(0x7fc00003u), lane::from_bits(0xffc00002u))),
            0x7fc00003u);  // both NaN: the first
  EXPECT_EQ(bits(lane::scalef(lane::from_bits(0xffc00003u), inf)), bits(inf));  // the table's odd row
  EXPECT_EQ(bits(lane::scalef(lane::from_bits(0xffc00003u), -inf)), bits(0.0f));
  EXPECT_EQ(bits(lane::scalef(lane::from_bits(0xff800003u), -inf)), 0xffc00003u);  // SNaN: quieted
  EXPECT_EQ(lane::scalef(1e-40f, 10.0f), 1e-40f * 1024.0f);  // subnormal a: no DAZ
}

}  // namespace
}  // namespace tileattn::testing
