// AVX2 + FMA + F16C kernels (8 fp32 lanes, 16 ymm registers).
// Included only by forward_avx2.cpp and other files of this directory, which
// are compiled with -mavx2 -mfma -mf16c.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/exp2_poly.hpp"
#include "core/half.hpp"
#include "core/row_prefetch.hpp"
#include "tileattn/types.hpp"

namespace tileattn::detail::avx2 {

// FewRowsKernels (decode tile products), compiled here as avx2::FewRowsKernels.
#include "isa/avx2/few_rows_kernels.hpp"

// Lanes [0, n) set, for masked loads/stores of row tails (0 <= n <= 8).
static inline __m256i tail_mask(int64_t n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), lanes);
}

// 2^x for x <= 127; x < -126 gives 0; NaN stays NaN.
static inline __m256 exp2_ps(__m256 x) {
  using namespace exp2_poly;
  const __m256 clamped = _mm256_min_ps(_mm256_set1_ps(kMaxInput),
                                       _mm256_max_ps(_mm256_set1_ps(kMinInput - 1.0f), x));
  const __m256 n = _mm256_round_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(clamped, n);
  __m256 poly = _mm256_set1_ps(kC6);
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(kC5));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(kC4));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(kC3));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(kC2));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(kC1));
  poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(1.0f));
  const __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(poly, _mm256_castsi256_ps(exponent));
  // Flush below the normal range; an unordered compare keeps NaN lanes.
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(kMinInput), _CMP_LT_OQ);
  return _mm256_andnot_ps(tiny, result);
}

// Register tile: MR rows x 16 columns (two ymm per row), 12 accumulators at
// MR = 6, leaving registers for the two B vectors and the A broadcast.
template <int MR>
__attribute__((always_inline)) static inline void gemm_block(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                              float* c, int64_t ldc, bool accumulate) {
  __m256 c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) {
    c0[r] = accumulate ? _mm256_load_ps(c + r * ldc) : _mm256_setzero_ps();
    c1[r] = accumulate ? _mm256_load_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  // Row pointers advanced together; unrolled so that loop control and
  // address arithmetic are amortized over more FMAs (-7% instructions in
  // the forward, callgrind).
  const float* a_row[MR];
  for (int r = 0; r < MR; ++r) a_row[r] = a + r * lda;
#pragma GCC unroll 4
  for (int64_t p = 0; p < k; ++p) {
    const __m256 b0 = _mm256_load_ps(b + p * ldb);
    const __m256 b1 = _mm256_load_ps(b + p * ldb + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a_row[r] + p);
      c0[r] = _mm256_fmadd_ps(ar, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(ar, b1, c1[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_store_ps(c + r * ldc, c0[r]);
    _mm256_store_ps(c + r * ldc + 8, c1[r]);
  }
}

struct Kernels : FewRowsKernels {  // few-rows products: few_rows_kernels.hpp
  static constexpr int kRows = 6;

  // Lines of the next tile asked for after each register block (a 6x16
  // block is ~1.5k FMAs at D = 128): 1024 lines of a 64x128 fp32 K/V tile
  // spread over the 516 blocks of a 256-row tile's two products.
  static constexpr int64_t kPrefetchLinesPerBlock = 2;

  // C(m, n) (+)= A(m, k) B(k, n); n, ldc multiples of 16; b, c 32-byte aligned.
  // B(p, j) is at b + (j / 16) * b_panel + p * ldb + j % 16: row-major B is
  // ldb = n, b_panel = 16; panel-major B (each (k, 16) panel contiguous) is
  // ldb = 16, b_panel = 16 * k. `prefetch`, if given, is advanced a few lines
  // per register block.
  static void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate, int64_t b_panel = 16,
                   RowPrefetch* prefetch = nullptr) {
    // Column panels outside, rows inside: the (k, 16) panel of B stays in L1
    // while every row block of A streams past it.
    for (int64_t j = 0; j < n; j += 16) {
      const float* bj = b + j / 16 * b_panel;
      int64_t i = 0;
      for (; i + kRows <= m; i += kRows) {
        gemm_block<kRows>(k, a + i * lda, lda, bj, ldb, c + i * ldc + j, ldc, accumulate);
        if (prefetch) prefetch->issue(kPrefetchLinesPerBlock);
      }
      const float* ai = a + i * lda;
      float* ci = c + i * ldc + j;
      switch (m - i) {
        case 5: gemm_block<5>(k, ai, lda, bj, ldb, ci, ldc, accumulate); break;
        case 4: gemm_block<4>(k, ai, lda, bj, ldb, ci, ldc, accumulate); break;
        case 3: gemm_block<3>(k, ai, lda, bj, ldb, ci, ldc, accumulate); break;
        case 2: gemm_block<2>(k, ai, lda, bj, ldb, ci, ldc, accumulate); break;
        case 1: gemm_block<1>(k, ai, lda, bj, ldb, ci, ldc, accumulate); break;
        default: break;
      }
    }
  }

  // Largest of x[0, n); NaN if any element is NaN (maxps alone would drop it).
  static float row_max(const float* x, int64_t n) {
    __m256 m = _mm256_set1_ps(-__builtin_inff());
    __m256 nan = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 v = _mm256_loadu_ps(x + j);
      m = _mm256_max_ps(v, m);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (j < n) {
      const __m256i mask = tail_mask(n - j);
      const __m256 tail = _mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()),
                                           _mm256_maskload_ps(x + j, mask), _mm256_castsi256_ps(mask));
      m = _mm256_max_ps(tail, m);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(tail, tail, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan)) return __builtin_nanf("");
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
  }

  static float exp2_sum(float* x, int64_t n, float sub) {
    const __m256 s = _mm256_set1_ps(sub);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 e = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
      _mm256_storeu_ps(x + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    if (j < n) {
      const __m256i mask = tail_mask(n - j);
      const __m256 e = _mm256_and_ps(exp2_ps(_mm256_sub_ps(_mm256_maskload_ps(x + j, mask), s)),
                                     _mm256_castsi256_ps(mask));
      _mm256_maskstore_ps(x + j, mask, e);
      sum = _mm256_add_ps(sum, e);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
  }

  // Softmax row passes over `rows` rows of a tile (row r at s + r * ld), four
  // rows interleaved. Each row's result is exactly row_max's / exp2_sum's
  // (same lanes, same order of additions); interleaving overlaps the rows'
  // dependency chains (horizontal reductions, the sum chain), which dominate
  // at 4-8 vectors a row: softmax 10.1k -> 8.8k TSC ticks per 128x64 tile
  // (D = 128, min over tiles).
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

  template <int G>
  static inline void row_max_group(const float* s, int64_t ld, int64_t n, float* out) {
    __m256 m[G], nan[G];
    for (int g = 0; g < G; ++g) {
      m[g] = _mm256_set1_ps(-__builtin_inff());
      nan[g] = _mm256_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
      for (int g = 0; g < G; ++g) {
        const __m256 v = _mm256_loadu_ps(s + g * ld + j);
        m[g] = _mm256_max_ps(v, m[g]);
        nan[g] = _mm256_or_ps(nan[g], _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      }
    if (j < n) {
      const __m256i mask = tail_mask(n - j);
      for (int g = 0; g < G; ++g) {
        const __m256 tail = _mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()),
                                             _mm256_maskload_ps(s + g * ld + j, mask),
                                             _mm256_castsi256_ps(mask));
        m[g] = _mm256_max_ps(tail, m[g]);
        nan[g] = _mm256_or_ps(nan[g], _mm256_cmp_ps(tail, tail, _CMP_UNORD_Q));
      }
    }
    for (int g = 0; g < G; ++g) {
      if (_mm256_movemask_ps(nan[g])) {
        out[g] = __builtin_nanf("");
        continue;
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m[g]), _mm256_extractf128_ps(m[g], 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
      out[g] = _mm_cvtss_f32(h);
    }
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

  template <int G, bool kScaled = false>
  static inline void exp2_sum_group(float* s, int64_t ld, int64_t n, const float* sub, float* sums,
                                    float scale = 1.0f) {
    const __m256 scale_v = _mm256_set1_ps(scale);
    __m256 sv[G], sum[G];
    for (int g = 0; g < G; ++g) {
      sv[g] = _mm256_set1_ps(sub[g]);
      sum[g] = _mm256_setzero_ps();
    }
    const auto argument = [&](__m256 v, int g) {
      return kScaled ? _mm256_fmsub_ps(v, scale_v, sv[g]) : _mm256_sub_ps(v, sv[g]);
    };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
      for (int g = 0; g < G; ++g) {
        float* x = s + g * ld + j;
        const __m256 e = exp2_ps(argument(_mm256_loadu_ps(x), g));
        _mm256_storeu_ps(x, e);
        sum[g] = _mm256_add_ps(sum[g], e);
      }
    if (j < n) {
      const __m256i mask = tail_mask(n - j);
      for (int g = 0; g < G; ++g) {
        float* x = s + g * ld + j;
        const __m256 e = _mm256_and_ps(exp2_ps(argument(_mm256_maskload_ps(x, mask), g)),
                                       _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(x, mask, e);
        sum[g] = _mm256_add_ps(sum[g], e);
      }
    }
    for (int g = 0; g < G; ++g) {
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(sum[g]), _mm256_extractf128_ps(sum[g], 1));
      h = _mm_add_ps(h, _mm_movehl_ps(h, h));
      h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
      sums[g] = _mm_cvtss_f32(h);
    }
  }

  // n is a multiple of 8 where it is called (padded rows).
  static void scale(float* x, int64_t n, float alpha) {
    const __m256 a = _mm256_set1_ps(alpha);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), a));
    for (; j < n; ++j) x[j] *= alpha;
  }

  // 8 elements of `dtype` at src (contiguous) as fp32 (int8 and fp8 e4m3
  // without their scales: the elements' own values).
  template <DType kType>
  static inline __m256 load8(const void* src) {
    if constexpr (kType == DType::f32) {
      return _mm256_loadu_ps(static_cast<const float*>(src));
    } else if constexpr (kType == DType::f16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(src)));
    } else if constexpr (kType == DType::i8 || kType == DType::f8_e4m3) {
      // The few-rows loads (few_rows_kernels.hpp), fp8's 2^8 put back.
      const __m256 v = few_rows::load8<kType>(static_cast<const char*>(src));
      constexpr float kScale = few_rows::kLoadScale<kType>;
      if constexpr (kScale != 1.0f) return _mm256_mul_ps(v, _mm256_set1_ps(kScale));
      return v;
    } else {
      const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(src)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
  }

  // The contiguous body of load_row for one dtype: the switch stays out of the
  // loop, and an exact scale of 1 (V tiles) costs no multiply.
  template <DType kType>
  static inline int64_t load_contiguous(const void* src, int64_t n, float scale, float* dst,
                                        int64_t panel) {
    const char* bytes = static_cast<const char*>(src);
    constexpr int64_t kSize = few_rows::kElementSize<kType>;
    int64_t j = 0;
    if (scale == 1.0f) {
      for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(dst + j / 16 * panel + j % 16, load8<kType>(bytes + j * kSize));
    } else {
      const __m256 s = _mm256_set1_ps(scale);
      for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(dst + j / 16 * panel + j % 16, _mm256_mul_ps(s, load8<kType>(bytes + j * kSize)));
    }
    return j;
  }

  // dst = scale * src[0, n) as fp32, zero-padded to a multiple of 16; element
  // j goes to dst + (j / 16) * panel + j % 16 (panel = 16: one contiguous row;
  // larger: the row's 16-wide pieces land in consecutive panels of a
  // panel-major tile).
  static void load_row(const void* src, DType dtype, int64_t n, int64_t stride, float scale,
                       float* dst, int64_t panel = 16) {
    int64_t j = 0;
    if (stride == 1) {
      switch (dtype) {
        case DType::f32: j = load_contiguous<DType::f32>(src, n, scale, dst, panel); break;
        case DType::f16: j = load_contiguous<DType::f16>(src, n, scale, dst, panel); break;
        case DType::bf16: j = load_contiguous<DType::bf16>(src, n, scale, dst, panel); break;
        case DType::i8: j = load_contiguous<DType::i8>(src, n, scale, dst, panel); break;
        case DType::f8_e4m3: j = load_contiguous<DType::f8_e4m3>(src, n, scale, dst, panel); break;
      }
    }
    for (; j < n; ++j) dst[j / 16 * panel + j % 16] = scale * load_element(src, int(dtype), j * stride);
    for (; j % 16 != 0; ++j) dst[j / 16 * panel + j % 16] = 0.0f;
  }

  static void store_row(const float* src, float scale, int64_t n, DType dtype, void* dst,
                        int64_t stride) {
    int64_t j = 0;
    if (stride == 1) {
      const __m256 s = _mm256_set1_ps(scale);
      for (; j + 8 <= n; j += 8) {
        const __m256 value = _mm256_mul_ps(_mm256_loadu_ps(src + j), s);
        if (dtype == DType::f32) {
          _mm256_storeu_ps(static_cast<float*>(dst) + j, value);
        } else if (dtype == DType::f16) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(dst) + j),
                           _mm256_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        } else {
          break;  // bf16: the scalar loop rounds to nearest even
        }
      }
    }
    for (; j < n; ++j) {
      store_element(dst, int(dtype), j * stride, src[j] * scale);
    }
  }

  // K^T: rows[r][c * stride] goes to dst + (r / 16) * panel + c * ld + r % 16
  // (row-major K^T: ld = padded rows, panel = 16; panel-major: ld = 16,
  // panel = 16 * d); 8x8 blocks transposed in registers; rows zero-padded to
  // a multiple of 16.
  static void pack_transposed(const void* const* rows, int64_t n_rows, DType dtype, int64_t d,
                              int64_t stride, float* dst, int64_t ld, int64_t panel = 16) {
    int64_t r0 = 0;
    if (stride == 1) {
      switch (dtype) {
        case DType::f32: r0 = transpose_blocks<DType::f32>(rows, n_rows, d, dst, ld, panel); break;
        case DType::f16: r0 = transpose_blocks<DType::f16>(rows, n_rows, d, dst, ld, panel); break;
        case DType::bf16: r0 = transpose_blocks<DType::bf16>(rows, n_rows, d, dst, ld, panel); break;
        case DType::i8: r0 = transpose_blocks<DType::i8>(rows, n_rows, d, dst, ld, panel); break;
        case DType::f8_e4m3: r0 = transpose_blocks<DType::f8_e4m3>(rows, n_rows, d, dst, ld, panel); break;
      }
    }
    // Rows left over from the 8-row blocks (all rows when strided), and the
    // zero padding up to the next multiple of 16 columns.
    const int64_t n_pad = (n_rows + 15) / 16 * 16;
    if (r0 == n_pad) return;
    for (int64_t c = 0; c < d; ++c) {
      float* out = dst + c * ld;
      for (int64_t r = r0; r < n_rows; ++r)
        out[r / 16 * panel + r % 16] = load_element(rows[r], int(dtype), c * stride);
      for (int64_t r = n_rows; r < n_pad; ++r) out[r / 16 * panel + r % 16] = 0.0f;
    }
  }

  // Full 8-row blocks of K^T for contiguous rows; returns the rows done.
  template <DType kType>
  static inline int64_t transpose_blocks(const void* const* rows, int64_t n_rows, int64_t d,
                                         float* dst, int64_t ld, int64_t panel) {
    constexpr int64_t kSize = few_rows::kElementSize<kType>;
    int64_t r0 = 0;
    for (; r0 + 8 <= n_rows; r0 += 8) {
      float* block = dst + r0 / 16 * panel + r0 % 16;  // 8 rows never straddle a panel
      int64_t c0 = 0;
      for (; c0 + 8 <= d; c0 += 8) {
        __m256 v[8];
        for (int i = 0; i < 8; ++i) v[i] = load8<kType>(static_cast<const char*>(rows[r0 + i]) + c0 * kSize);
        transpose8(v);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(block + (c0 + i) * ld, v[i]);
      }
      for (; c0 < d; ++c0)
        for (int64_t r = 0; r < 8; ++r) block[c0 * ld + r] = load_element(rows[r0 + r], int(kType), c0);
    }
    return r0;
  }

  static inline void transpose8(__m256* v) {
    const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    v[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    v[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    v[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    v[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    v[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    v[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    v[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    v[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
  }
};

}  // namespace tileattn::detail::avx2
