// AVX-512 (F/BW/DQ/VL) kernels: 16 fp32 lanes, 32 zmm registers.
// Included only by files of this directory, compiled with the AVX-512 flags.
#pragma once

// Tests may compile this file against a scalar emulation of the intrinsics
// (tests/isa/avx512_emulation.hpp) in another namespace, to check it on CPUs
// without AVX-512; the library always uses the real ones.
#ifndef TILEATTN_AVX512_EMULATION
#include <immintrin.h>
#else
#include TILEATTN_AVX512_EMULATION
#endif
#ifndef TILEATTN_AVX512_NAMESPACE
#define TILEATTN_AVX512_NAMESPACE avx512
#endif

#include <cstdint>
#include <cstring>

#include "core/exp2_poly.hpp"
#include "core/half.hpp"
#include "core/row_prefetch.hpp"
#include "isa/avx512/few_rows_vbmi.hpp"
#include "isa/avx512/few_rows_vnni.hpp"
#include "tileattn/types.hpp"

namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE {

static inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((n >= 16) ? 0xffffu : ((1u << n) - 1u));
}

// max |x[0, n)| into max_abs; false when an element is NaN or infinite (then
// max_abs is not set). The query split of the integer decode scores (VNNI,
// few_rows_vnni.cpp) takes its steps from it.
static inline bool max_abs_if_finite(const float* x, int64_t n, float& max_abs) {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512 largest = _mm512_set1_ps(3.4028235e38f);
  __m512 max_lanes = _mm512_setzero_ps();
  __mmask16 finite = 0xffff;
  for (int64_t t = 0; t < n; t += 16) {
    const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(tail_mask(n - t), x + t));
    const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(bits, magnitude));
    finite &= _mm512_cmp_ps_mask(a, largest, _CMP_LE_OS);
    max_lanes = _mm512_max_ps(max_lanes, a);
  }
  if (finite != 0xffff) return false;
  max_abs = _mm512_reduce_max_ps(max_lanes);
  return true;
}

// 2^x in the lanes of `keep`, 0 in the others; x above 127 counts as 127,
// x < -126 (and -inf) gives 0, NaN stays NaN. vscalefps applies 2^n. 12
// instructions: no lower clamp (a lane below -126, -inf included, is zeroed
// by the mask whatever its f and n), and the compare folds that mask into `keep`
// (not-less-than, unordered true: NaN passes) for the masked scalef to
// write the zeros. The same bits as clamping both ends, zeroing the tiny
// lanes and then the lanes outside `keep` (15 instructions).
static inline __m512 exp2_masked_ps(__m512 x, __mmask16 keep) {
  using namespace exp2_poly;
  const __m512 clamped = _mm512_min_ps(_mm512_set1_ps(kMaxInput), x);
  // f = x - rint(x) in one vreduceps, then n = x - f = rint(x), both exact:
  // the same n and f as vrndscaleps and a subtraction, but vrndscaleps is
  // two port-0 uops (about a third of the FMA throughput, measured on the
  // AMX Xeon model 167), where the tile unit also takes port 0.
  const __m512 f = _mm512_reduce_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 n = _mm512_sub_ps(clamped, f);
  __m512 poly = _mm512_set1_ps(kC6);
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(kC5));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(kC4));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(kC3));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(kC2));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(kC1));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.0f));
  const __mmask16 normal = _mm512_mask_cmp_ps_mask(keep, x, _mm512_set1_ps(kMinInput), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(normal, poly, n);
}

// 2^x in the lanes of `keep` as exp2_masked_ps gives it, for the bf16
// products' P (bf16_kernels.hpp), which P V keeps to 2^-16 at best (hi +
// lo), and x at most the online softmax's slack of 8 (no upper clamp; +inf
// still gives +inf): x = k / 32 + r (|r| <= 1/64, r by vreduceps keeping 5
// fraction bits), 2^(k mod 32 / 32) from a 32-entry table (vpermt2ps), 2^r -
// 1 by a degree-2 polynomial, 2^floor(k / 32) by vscalefps of k / 32
// itself. Max relative error 1.6e-7 evaluated in fp32 (the degree-6
// polynomial: 1.0e-7). Three FMA-unit instructions instead of six: a tile
// product and FMAs hardly overlap on the AMX Xeon model 167 (a loop of one
// tdpbf16ps and 48 independent FMAs took 43-48 TSC ticks, the FMAs alone
// 26-28, the product alone 14-15; with 48 adds 32 against 24).
static inline __m512 exp2_table_masked_ps(__m512 x, __mmask16 keep) {
  using namespace exp2_poly;
  const __m512 r = _mm512_reduce_ps(x, (5 << 4) | _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 xr = _mm512_sub_ps(x, r);  // k / 32, exact
  // k / 32 + 1.5 * 2^18 is exact and holds k mod 32 in its low 5 bits.
  const __m512i index = _mm512_castps_si512(_mm512_add_ps(xr, _mm512_set1_ps(393216.0f)));
  const __m512 t = _mm512_permutex2var_ps(_mm512_load_ps(kTable), index, _mm512_load_ps(kTable + 16));
  const __m512 q = _mm512_mul_ps(_mm512_fmadd_ps(_mm512_set1_ps(kTableC2), r, _mm512_set1_ps(kTableC1)), r);
  const __m512 e = _mm512_fmadd_ps(t, q, t);
  const __mmask16 normal = _mm512_mask_cmp_ps_mask(keep, x, _mm512_set1_ps(kMinInput), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(normal, e, xr);
}

// The 16 x 16 block r[0..15] (one row per vector) transposed in registers:
// r[c] becomes column c. 64 shuffles: pairs of rows interleaved, then 4-row
// columns within 128-bit lanes, then 128-bit lanes moved twice. It replaced
// a store of the block to L1 and 16 gathers from it in pack_transposed:
// paired (2026-12-01, fp32, H = 8, N = 4096, 2 threads), forward D = 128
// 0.94-1.05 of the time (median of 8 rounds 0.98), backward D = 128
// 0.95-1.07 (median 1.00), D = 64 0.85: a small gain where K packing is a
// small share of the work.
static inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);  // per 128-bit lane: a0 b0 a1 b1
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);  // a2 b2 a3 b3
  }
  for (int i = 0; i < 16; i += 4) {  // per lane: column 0..3 of rows i..i+3
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int h = 0; h < 16; h += 8)  // lanes 0 and 2 / 1 and 3 of rows h..h+3 and h+4..h+7
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + 4 + i], 0x88);
      t[h + 4 + i] = _mm512_shuffle_f32x4(r[h + i], r[h + 4 + i], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {  // rows 0..7 with rows 8..15
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// Register tile: MR rows x (16 * NV) columns; at MR = 12, NV = 2 (or 6 x 4)
// it holds 24 accumulators, the B vectors and the A broadcast in 32 registers.
template <int MR, int NV>
static inline void gemm_block(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                              int64_t b_panel, float* c, int64_t ldc, bool accumulate) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? _mm512_load_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    __m512 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + v * b_panel + p * ldb);
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + p]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_store_ps(c + r * ldc + 16 * v, acc[r][v]);
}

// The last m % kRows rows of a panel: one block of exactly `rows` rows.
template <int NV, int R>
static inline void gemm_rows_tail(int rows, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                                  int64_t b_panel, float* c, int64_t ldc, bool accumulate) {
  if constexpr (R > 0) {
    if (rows == R) return gemm_block<R, NV>(k, a, lda, b, ldb, b_panel, c, ldc, accumulate);
    gemm_rows_tail<NV, R - 1>(rows, k, a, lda, b, ldb, b_panel, c, ldc, accumulate);
  }
}

// Rows per register block: 6 x 4 and 12 x 2 vectors both hold 24
// accumulators; 6 x 4 loads 4 B vectors and 6 broadcasts per 24 FMAs where
// 12 x 2 loads 2 and 12. Forward fp32, H = 8, N = 4096 (paired, alternating
// call by call, 2026-12-01, AVX-512 Xeon): 6 x 4 panels wherever n allows
// took 0.91-0.96 of the time at D = 128 (2 threads, also causal; 0.91 on 1
// thread) and 0.96 at D = 64; the backward 0.92-1.00.
template <int NV>
constexpr int kBlockRows = NV >= 4 ? 6 : 12;

template <int NV>
static inline void gemm_panel(int64_t m, int64_t k, const float* a, int64_t lda, const float* b,
                              int64_t ldb, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                              RowPrefetch* prefetch) {
  constexpr int kRows = kBlockRows<NV>;
  // A 12 x 32 (or 6 x 64) block is 4x the FMAs of AVX2's 6 x 16: 8 lines per
  // block keeps the same lines per FMA.
  constexpr int64_t kPrefetchLinesPerBlock = 8;
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) {
    gemm_block<kRows, NV>(k, a + i * lda, lda, b, ldb, b_panel, c + i * ldc, ldc, accumulate);
    if (prefetch) prefetch->issue(kPrefetchLinesPerBlock);
  }
  gemm_rows_tail<NV, kRows - 1>(int(m - i), k, a + i * lda, lda, b, ldb, b_panel, c + i * ldc, ldc, accumulate);
}

#include "isa/avx512/reduce16.hpp"

// Decode tile products (at most kFewRowsMax stacked query rows): the 16-lane
// ones of few_rows_kernels.hpp, which reuse the AVX2 file's element-strided
// fallbacks (this directory's files are compiled with -mavx2 -mfma -mf16c
// too). Under the emulation the test supplies the AVX2 products as
// TILEATTN_AVX512_FEW_ROWS_KERNELS, built natively in a translation unit of
// its own, since this one must not see <immintrin.h>: the emulated main loop
// is checked with those, the 16-lane products only on AVX-512 hardware.
#ifndef TILEATTN_AVX512_EMULATION
#include "isa/avx2/few_rows_kernels.hpp"
#include "isa/avx512/few_rows_kernels.hpp"
using DecodeKernels = FewRows16Kernels;
#elif defined(TILEATTN_AVX512_FEW_ROWS_KERNELS)
#include "isa/avx512/e4m3_permutes.hpp"  // E4m3ToBf16, for the emulated vdpbf16ps decode products
using DecodeKernels = TILEATTN_AVX512_FEW_ROWS_KERNELS;
#else
#error "the AVX-512 emulation needs TILEATTN_AVX512_FEW_ROWS_KERNELS (see tests/isa/emulated_avx512_kernels.hpp)"
#endif

struct Kernels : DecodeKernels {  // few-rows products: isa/avx512/few_rows_kernels.hpp
  // C(m, n) (+)= A(m, k) B(k, n); n, ldc multiples of 16; b, c 64-byte aligned.
  // B(p, j) is at b + (j / 16) * b_panel + p * ldb + j % 16: row-major B is
  // ldb = n, b_panel = 16; panel-major B is ldb = 16, b_panel = 16 * k.
  // `prefetch`, if given, is advanced a few lines per register block.
  static void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate, int64_t b_panel = 16,
                   RowPrefetch* prefetch = nullptr) {
    int64_t j = 0;
    for (; j + 64 <= n; j += 64)
      gemm_panel<4>(m, k, a, lda, b + j / 16 * b_panel, ldb, b_panel, c + j, ldc, accumulate, prefetch);
    for (; j + 32 <= n; j += 32)
      gemm_panel<2>(m, k, a, lda, b + j / 16 * b_panel, ldb, b_panel, c + j, ldc, accumulate, prefetch);
    if (j < n)
      gemm_panel<1>(m, k, a, lda, b + j / 16 * b_panel, ldb, b_panel, c + j, ldc, accumulate, prefetch);
  }

  // Largest of x[0, n); NaN if any element is NaN (maxps alone would drop it).
  static float row_max(const float* x, int64_t n) {
    __m512 m = _mm512_set1_ps(-__builtin_inff());
    __mmask16 nan = 0;
    for (int64_t j = 0; j < n; j += 16) {
      const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-__builtin_inff()), tail_mask(n - j), x + j);
      m = _mm512_max_ps(v, m);
      nan = static_cast<__mmask16>(nan | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
    }
    if (nan) return __builtin_nanf("");
    return _mm512_reduce_max_ps(m);
  }

  static float exp2_sum(float* x, int64_t n, float sub) {
    const __m512 s = _mm512_set1_ps(sub);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mask = tail_mask(n - j);
      const __m512 e = exp2_masked_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + j), s), mask);
      _mm512_mask_storeu_ps(x + j, mask, e);
      sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
  }

  // Softmax row passes over `rows` rows of a tile (row r at s + r * ld), four
  // rows interleaved like the AVX2 ones. Each row's result is exactly
  // row_max's / exp2_sum's (same lanes, same order of additions); at 4
  // vectors a row (64-key tiles) one row's max/sum chain and its reduction
  // leave the pipes idle. Both passes over a 256x64 tile, in L1, alternating
  // with the row-by-row passes (2026-12-01): min 14.8-15.1k TSC ticks against
  // 15.8-16.1k, -6%; the forward (softmax ~10% of it) did not resolve it.
  static void row_max_rows(const float* s, int64_t ld, int64_t rows, int64_t n, float* out) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) row_max_group<4>(s + r * ld, ld, n, out + r);
    for (; r < rows; ++r) out[r] = row_max(s + r * ld, n);
  }

  // Row r: s := exp2(s - sub[r]), sums[r] = its sum.
  static void exp2_sum_rows(float* s, int64_t ld, int64_t rows, int64_t n, const float* sub,
                            float* sums) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) exp2_sum_group<4>(s + r * ld, ld, n, sub + r, sums + r);
    for (; r < rows; ++r) sums[r] = exp2_sum(s + r * ld, n, sub[r]);
  }

  // Row r: s := exp2(s * scale - sub[r]) (one rounding: an FMA), sums[r] =
  // its sum: the softmax of raw scores whose scale the products left out
  // (mainloop.hpp, deferred_score_scale).
  static void exp2_sum_rows_scaled(float* s, int64_t ld, int64_t rows, int64_t n, float scale,
                                   const float* sub, float* sums) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) exp2_sum_group<4, true>(s + r * ld, ld, n, sub + r, sums + r, scale);
    for (; r < rows; ++r) exp2_sum_group<1, true>(s + r * ld, ld, n, sub + r, sums + r, scale);
  }

  // Rows g: out[g] = max of s[g][0, n), NaN if one is NaN (row_max's result).
  // Whole vectors take their loads inside vmaxps; NaN is watched for by a
  // sum of the scores (NaN sticks to it), one add per vector instead of a
  // compare, a mask move and an or: a sum that ends NaN (a NaN score, or +inf
  // meeting -inf, directly or by overflow) has the row scanned again by
  // row_max, whose compare decides.
  template <int G>
  static inline void row_max_group(const float* s, int64_t ld, int64_t n, float* out) {
    __m512 m[G], seen[G];
    for (int g = 0; g < G; ++g) {
      m[g] = _mm512_set1_ps(-__builtin_inff());
      seen[g] = _mm512_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
      for (int g = 0; g < G; ++g) {
        const __m512 v = _mm512_loadu_ps(s + g * ld + j);
        m[g] = _mm512_max_ps(v, m[g]);
        seen[g] = _mm512_add_ps(seen[g], v);
      }
    if (j < n) {
      const __mmask16 mask = tail_mask(n - j);
      for (int g = 0; g < G; ++g) {
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-__builtin_inff()), mask, s + g * ld + j);
        m[g] = _mm512_max_ps(v, m[g]);
        seen[g] = _mm512_add_ps(seen[g], _mm512_maskz_mov_ps(mask, v));
      }
    }
    for (int g = 0; g < G; ++g)
      out[g] = _mm512_cmp_ps_mask(seen[g], seen[g], _CMP_UNORD_Q) ? row_max(s + g * ld, n)
                                                                    : _mm512_reduce_max_ps(m[g]);
  }

  template <int G, bool kScaled = false>
  static inline void exp2_sum_group(float* s, int64_t ld, int64_t n, const float* sub, float* sums,
                                    float scale = 1.0f) {
    const __m512 scale_v = _mm512_set1_ps(scale);
    __m512 sv[G], sum[G];
    for (int g = 0; g < G; ++g) {
      sv[g] = _mm512_set1_ps(sub[g]);
      sum[g] = _mm512_setzero_ps();
    }
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mask = tail_mask(n - j);
      for (int g = 0; g < G; ++g) {
        float* x = s + g * ld + j;
        const __m512 v = _mm512_maskz_loadu_ps(mask, x);
        const __m512 arg = kScaled ? _mm512_fmsub_ps(v, scale_v, sv[g]) : _mm512_sub_ps(v, sv[g]);
        const __m512 e = exp2_masked_ps(arg, mask);
        _mm512_mask_storeu_ps(x, mask, e);
        sum[g] = _mm512_add_ps(sum[g], e);
      }
    }
    for (int g = 0; g < G; ++g) sums[g] = _mm512_reduce_add_ps(sum[g]);
  }

  static void scale(float* x, int64_t n, float alpha) {
    const __m512 a = _mm512_set1_ps(alpha);
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mask = tail_mask(n - j);
      _mm512_mask_storeu_ps(x + j, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + j), a));
    }
  }

  // Up to 16 elements (mask) of `dtype` at src (contiguous) as fp32; others 0.
  static inline __m512 load16(const void* src, DType dtype, __mmask16 mask) {
    switch (dtype) {
      case DType::f32: return _mm512_maskz_loadu_ps(mask, src);
      case DType::f16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, src));
      case DType::bf16: {
        const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, src));
        return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
      }
      case DType::i8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, src)));
      case DType::f8_e4m3: {
        // Sign-extended to 32-bit lanes, shifted and masked into fp16's
        // fields (the value / 2^8: bias 7 against 15, subnormals included),
        // S.1111.111 (NaN) given fp16's top exponent bit by an add that
        // carries into bit 14 only from 0x3f80, vcvtph2ps, x 2^8 (exact).
        // The prefill tiles' loads, in the intrinsics the emulation has; the
        // decode products convert in 16-bit lanes (few_rows16::load16).
        const __m512i x = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, src));
        __m512i h = _mm512_and_si512(_mm512_slli_epi32(x, 7), _mm512_set1_epi32(0xbf80));
        const __m512i fields = _mm512_and_si512(h, _mm512_set1_epi32(0x3f80));
        h = _mm512_or_si512(h, _mm512_and_si512(_mm512_add_epi32(fields, _mm512_set1_epi32(0x80)),
                                                _mm512_set1_epi32(0x4000)));
        return _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)), _mm512_set1_ps(256.0f));
      }
    }
    return _mm512_setzero_ps();
  }

  // Element j goes to dst + (j / 16) * panel + j % 16; zero-padded to 16.
  static void load_row(const void* src, DType dtype, int64_t n, int64_t stride, float scale,
                       float* dst, int64_t panel = 16) {
    const int64_t esize = int64_t(dtype_size(dtype));
    const int64_t n_pad = (n + 15) / 16 * 16;
    if (stride == 1) {
      const __m512 s = _mm512_set1_ps(scale);
      for (int64_t j = 0; j < n_pad; j += 16) {
        const __m512 v = load16(static_cast<const char*>(src) + j * esize, dtype, tail_mask(n - j));
        _mm512_storeu_ps(dst + j / 16 * panel, _mm512_mul_ps(s, v));
      }
      return;
    }
    int64_t j = 0;
    for (; j < n; ++j) dst[j / 16 * panel + j % 16] = scale * load_element(src, int(dtype), j * stride);
    for (; j < n_pad; ++j) dst[j / 16 * panel + j % 16] = 0.0f;
  }

  // bf16 nearest-even of 16 floats, bitwise float_to_bf16 (core/half.hpp):
  // a NaN keeps its upper bits, quieted.
  static inline __m256i round_to_bf16(__m512 value) {
    const __m512i x = _mm512_castps_si512(value);
    const __m512i upper = _mm512_srli_epi32(x, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(upper, _mm512_set1_epi32(1)));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(upper, _mm512_set1_epi32(0x40))));
  }

  static void store_row(const float* src, float scale, int64_t n, DType dtype, void* dst,
                        int64_t stride) {
    int64_t j = 0;
    if (stride == 1) {
      const __m512 s = _mm512_set1_ps(scale);
      for (; j < n; j += 16) {
        const __mmask16 mask = tail_mask(n - j);
        const __m512 value = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, src + j), s);
        if (dtype == DType::f32) {
          _mm512_mask_storeu_ps(static_cast<float*>(dst) + j, mask, value);
        } else {
          const __m256i half = dtype == DType::f16
                                   ? _mm512_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                   : round_to_bf16(value);
          _mm256_mask_storeu_epi16(static_cast<uint16_t*>(dst) + j, mask, half);
        }
      }
      return;
    }
    for (; j < n; ++j) {
      store_element(dst, int(dtype), j * stride, src[j] * scale);
    }
  }

  // dst[c * ld + r] = rows[r][c * stride], columns n_rows..round_up(n_rows, 16) zeroed.
  // 16x16 blocks: rows converted into registers and transposed there (transpose16),
  // so every store to dst is a full 64-byte line.
  // K^T: rows[r][c * stride] to dst + (r / 16) * panel + c * ld + r % 16.
  static void pack_transposed(const void* const* rows, int64_t n_rows, DType dtype, int64_t d,
                              int64_t stride, float* dst, int64_t ld, int64_t panel = 16) {
    const int64_t n_pad = (n_rows + 15) / 16 * 16;
    const int64_t esize = int64_t(dtype_size(dtype));
    if (stride == 1) {
      for (int64_t r0 = 0; r0 < n_pad; r0 += 16) {
        for (int64_t c0 = 0; c0 < d; c0 += 16) {
          const __mmask16 cols = tail_mask(d - c0);
          __m512 block[16];
          for (int64_t r = 0; r < 16; ++r)
            block[r] = r0 + r < n_rows
                           ? load16(static_cast<const char*>(rows[r0 + r]) + c0 * esize, dtype, cols)
                           : _mm512_setzero_ps();
          transpose16(block);
          const int64_t c_end = d - c0 < 16 ? d - c0 : 16;
          for (int64_t c = 0; c < c_end; ++c) _mm512_storeu_ps(dst + r0 / 16 * panel + (c0 + c) * ld, block[c]);
        }
      }
      return;
    }
    for (int64_t c = 0; c < d; ++c) {
      float* out = dst + c * ld;
      for (int64_t r = 0; r < n_rows; ++r)
        out[r / 16 * panel + r % 16] = load_element(rows[r], int(dtype), c * stride);
      for (int64_t r = n_rows; r < n_pad; ++r) out[r / 16 * panel + r % 16] = 0.0f;
    }
  }
};

}  // namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE
