// bf16 operands for the bf16 dot-product tile products (AVX512-BF16's
// vdpbf16ps and AMX-BF16's tdpbf16ps), and the vdpbf16ps product itself.
// Included by the avx512bf16 and amx translation units, compiled with the
// AVX-512 flags plus -mavx512bf16 (and the AMX flags for amx).
//
// The VNNI pair layout, for C (m, n) += A (m, k) B (k, n) with k even:
//   A: row-major bf16 (rows, lda); its (row, 2p) and (row, 2p + 1) form pair p;
//   B: panel-major: the 16 output columns of panel j / 16 start at
//      b + (j / 16) * b_panel; pair row p holds, for each of the 16 columns,
//      B(2p, j) then B(2p + 1, j): 32 bf16, 64 bytes, at + p * 32.
// Q K^T takes A = Q (reduction over D), B = K with pairs along D; P V takes
// A = P (reduction over keys), B = V with pairs along keys. One pair row is
// one vdpbf16ps B vector and one row of an AMX B tile.
#pragma once

#include "isa/avx512/kernels.hpp"

namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE {

#ifndef TILEATTN_AVX512_EMULATION
static inline __m512bh as_bf16_pairs(__m512i v) { return (__m512bh)v; }
static inline __m512i bf16_bits(__m512bh v) { return (__m512i)v; }
#endif

// The first n of 32 lanes (none for n <= 0).
static inline __mmask32 tail_mask32(int64_t n) {
  return static_cast<__mmask32>(n >= 32 ? 0xffffffffu : n <= 0 ? 0u : ((1u << n) - 1u));
}
// The first n of 16 lanes (none for n <= 0; tail_mask wants n > 0).
static inline __mmask16 lanes16(int64_t n) { return n <= 0 ? __mmask16(0) : tail_mask(n); }

// Word indices (permutex2var_epi16) of the high halves of two vectors' 32
// dwords: a's 16, then b's.
static inline __m512i high_word_index() {
  alignas(64) static constexpr uint16_t kIndex[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                      23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                      45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  return _mm512_load_si512(kIndex);
}

// x0, x1 (32 fp32) as bf16 hi + lo, x0's 16 words then x1's in each: hi =
// x truncated to bf16 (its high word), lo = bf16(x - hi) rounded to nearest
// even. x - hi is exact (it is x's low 16 significand bits), so hi + lo
// holds x to 2^-16 relative (lo's rounding of at most 2^-9 of x - hi, which
// is below 2^-7 of x). Seven instructions (and, sub, one word permute for
// hi, one vcvtne2ps2bf16 for lo) where rounding hi to nearest too took
// eleven, four of them shifts and widenings that share port 0 with the AMX
// tile unit. vcvtne2ps2bf16 reads denormals as 0: x below 2^-126 counts as
// 0 in lo.
static inline void split_hi_lo(__m512 x0, __m512 x1, __m512i high_words, __m512i& hi, __m512i& lo) {
  const __m512i keep_high = _mm512_set1_epi32(int32_t(0xffff0000u));
  const __m512 h0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x0), keep_high));
  const __m512 h1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x1), keep_high));
  hi = _mm512_permutex2var_epi16(_mm512_castps_si512(x0), high_words, _mm512_castps_si512(x1));
  lo = bf16_bits(_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0)));
}

// x0, x1's 32 values stored as 32 bf16 at hi (x0's, then x1's) and, with
// lo, split_hi_lo's hi and lo at hi and lo; lo null: hi alone, rounded to
// nearest even by vcvtne2ps2bf16.
static inline void store_split(__m512 x0, __m512 x1, __m512i high_words, uint16_t* hi, uint16_t* lo) {
  if (!lo) {
    _mm512_storeu_si512(hi, bf16_bits(_mm512_cvtne2ps_pbh(x1, x0)));
    return;
  }
  __m512i h, l;
  split_hi_lo(x0, x1, high_words, h, l);
  _mm512_storeu_si512(hi, h);
  _mm512_storeu_si512(lo, l);
}

// Where the packers' rows come from: 32 elements from element c0 (lanes
// `cols`, the others zero) as 32 bf16 words. Bf16Rows: bf16 rows as they are.
struct Bf16Rows {
  static __m512i load32(const void* row, int64_t c0, __mmask32 cols) {
    return _mm512_maskz_loadu_epi16(cols, static_cast<const uint16_t*>(row) + c0);
  }
};
// A quantized cache's int8 or fp8 e4m3 rows, unscaled, through the fp32
// loads of the prefill tiles (Kernels::load16) and rounded to bf16, which
// changes nothing: every int8 and every e4m3 value is a bf16 value. Packing
// from the cache's bytes directly writes no staged bf16 rows.
template <DType kType>
struct QuantizedRows {
  static __m512i load32(const void* row, int64_t c0, __mmask32 cols) {
    const char* src = static_cast<const char*>(row) + c0;  // one byte per element
    const __m512 lo = Kernels::load16(src, kType, __mmask16(cols));
    const __m512 hi = Kernels::load16(src + 16, kType, __mmask16(cols >> 16));
    return bf16_bits(_mm512_cvtne2ps_pbh(hi, lo));
  }
};
#ifdef TILEATTN_E4M3_PERMUTES
// fp8 e4m3 rows as bf16 on AVX512-VBMI byte permutes (E4m3ToBf16, its tables
// held in registers for a whole pack): three permutes and two logic
// instructions per 32 elements where the fp32 route takes about twenty.
struct E4m3PermuteRows {
  few_rows16::E4m3ToBf16 to_bf16;
  __m512i load32(const void* row, int64_t c0, __mmask32 cols) const {
    __m512i k0, k1;
    to_bf16(_mm512_maskz_loadu_epi8(__mmask64(cols), static_cast<const char*>(row) + c0), k0, k1);
    return k0;  // the 32 loaded elements (k1 converts the 32 zero bytes after them)
  }
};
#endif

// Packing and conversion into the pair layout (bf16 inputs only).
struct Bf16Packing {
  // dst[0, k) = the row's D bf16 elements, then zeros (k >= d).
  static void bf16_copy_row(const void* src, int64_t d, int64_t stride, uint16_t* dst, int64_t k) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    if (stride == 1) {
      for (int64_t c = 0; c < k; c += 32)
        _mm512_storeu_si512(dst + c, _mm512_maskz_loadu_epi16(tail_mask32(d - c), s + c));
      return;
    }
    int64_t c = 0;
    for (; c < d; ++c) dst[c] = s[c * stride];
    for (; c < k; ++c) dst[c] = 0;
  }

  // K (n keys of D elements, rows[j]) into kv_pad / 16 panels of (k / 2
  // pair rows, 16 keys, 2): element (j, d) at dst + (j / 16) * 16 * k +
  // (d / 2) * 32 + (j % 16) * 2 + d % 2. Keys n..round_up(n, 16) and
  // elements D..k are zero. A pair is one 32-bit word, so a 16-key x 32-element
  // block is a 16 x 16 transpose of words (transpose16).
  // load: Bf16Rows, or with unit stride QuantizedRows / E4m3PermuteRows.
  template <class Rows = Bf16Rows>
  static void bf16_pack_k(const void* const* rows, int64_t n, int64_t d, int64_t stride, uint16_t* dst,
                          int64_t k, const Rows& load = Rows{}) {
    const int64_t n_pad = (n + 15) / 16 * 16;
    if (stride == 1) {
      for (int64_t j0 = 0; j0 < n_pad; j0 += 16) {
        uint16_t* panel = dst + j0 * k;
        for (int64_t c0 = 0; c0 < k; c0 += 32) {
          const __mmask32 cols = tail_mask32(d - c0);
          __m512 block[16];
          for (int64_t r = 0; r < 16; ++r)
            block[r] = j0 + r < n ? _mm512_castsi512_ps(load.load32(rows[j0 + r], c0, cols)) : _mm512_setzero_ps();
          transpose16(block);
          for (int64_t p = 0; p < 16; ++p) _mm512_store_si512(panel + (c0 / 2 + p) * 32, _mm512_castps_si512(block[p]));
        }
      }
      return;
    }
    for (int64_t j = 0; j < n_pad; ++j)
      for (int64_t c = 0; c < k; ++c)
        dst[(j / 16) * 16 * k + (c / 2) * 32 + (j % 16) * 2 + c % 2] =
            j < n && c < d ? static_cast<const uint16_t*>(rows[j])[c * stride] : uint16_t(0);
  }

  // V (n keys of D elements) into D_pad / 16 panels of (kv_pad / 2 pair rows,
  // 16 columns, 2): element (j, c) at dst + (c / 16) * 16 * kv_pad +
  // (j / 2) * 32 + (c % 16) * 2 + j % 2; keys n..kv_pad are zero.
  // load: Bf16Rows, or with unit stride QuantizedRows / E4m3PermuteRows.
  template <class Rows = Bf16Rows>
  static void bf16_pack_v(const void* const* rows, int64_t n, int64_t d, int64_t stride, uint16_t* dst,
                          int64_t kv_pad, const Rows& load = Rows{}) {
    const int64_t d_pad = (d + 15) / 16 * 16;
    if (stride == 1) {
      // Words 0..15 interleave the first 16 elements of rows a and b, words
      // 16..31 the next 16: a0 b0 a1 b1 ...
      alignas(64) uint16_t lo_index[32], hi_index[32];
      for (int i = 0; i < 16; ++i) {
        lo_index[2 * i] = uint16_t(i), lo_index[2 * i + 1] = uint16_t(32 + i);
        hi_index[2 * i] = uint16_t(16 + i), hi_index[2 * i + 1] = uint16_t(48 + i);
      }
      const __m512i lo = _mm512_load_si512(lo_index), hi = _mm512_load_si512(hi_index);
      for (int64_t j = 0; j < kv_pad; j += 2) {
        const void* a = j < n ? rows[j] : nullptr;
        const void* b = j + 1 < n ? rows[j + 1] : nullptr;
        for (int64_t c0 = 0; c0 < d_pad; c0 += 32) {
          const __mmask32 cols = tail_mask32(d - c0);
          const __m512i ra = a ? load.load32(a, c0, cols) : _mm512_setzero_si512();
          const __m512i rb = b ? load.load32(b, c0, cols) : _mm512_setzero_si512();
          uint16_t* out = dst + (c0 / 16) * 16 * kv_pad + (j / 2) * 32;
          _mm512_store_si512(out, _mm512_permutex2var_epi16(ra, lo, rb));
          if (c0 + 16 < d_pad) _mm512_store_si512(out + 16 * kv_pad, _mm512_permutex2var_epi16(ra, hi, rb));
        }
      }
      return;
    }
    for (int64_t j = 0; j < kv_pad; ++j)
      for (int64_t c = 0; c < d_pad; ++c)
        dst[(c / 16) * 16 * kv_pad + (j / 2) * 32 + (c % 16) * 2 + j % 2] =
            j < n && c < d ? static_cast<const uint16_t*>(rows[j])[c * stride] : uint16_t(0);
  }

  // P (m rows of n fp32, row r at p + r * ldp) as hi + lo, two bf16 rows of
  // k (zero-padded): split_hi_lo's hi and lo. P is finite (the softmax's
  // exponentials, times the dropout scale). lo null: hi alone, rounded to
  // nearest even by vcvtne2ps2bf16 (P to 2^-8 relative).
  static void bf16_split_rows(const float* p, int64_t ldp, int64_t m, int64_t n, int64_t k, uint16_t* hi,
                              uint16_t* lo, int64_t ld) {
    const __m512i high_words = high_word_index();
    for (int64_t r = 0; r < m; ++r) {
      const float* row = p + r * ldp;
      for (int64_t c = 0; c < k; c += 32) {
        const __m512 x0 = _mm512_maskz_loadu_ps(lanes16(n - c), row + c);  // zero past n
        const __m512 x1 = _mm512_maskz_loadu_ps(lanes16(n - c - 16), row + c + 16);
        store_split(x0, x1, high_words, hi + r * ld + c, lo ? lo + r * ld + c : nullptr);
      }
    }
  }

  // bf16_split_rows of the transpose: hi/lo row c (c < n, k elements, row
  // stride ld) := column c of P (m rows of n fp32, row stride ldp), zero past
  // row m; lo null: hi alone. Bit for bit the split of pack_transposed's fp32
  // transpose, without writing and reading that transpose: two 16 x 16
  // blocks (rows r0..r0 + 31, 16 columns) transposed in registers give each
  // output row's 32 elements for split_hi_lo. The backward's P^T and dS^T.
  static void bf16_split_transposed(const float* p, int64_t ldp, int64_t m, int64_t n, int64_t k,
                                    uint16_t* hi, uint16_t* lo, int64_t ld) {
    const __m512i high_words = high_word_index();
    for (int64_t c0 = 0; c0 < n; c0 += 16) {
      const __mmask16 cols = lanes16(n - c0);
      const int64_t c_end = n - c0 < 16 ? n - c0 : 16;
      for (int64_t r0 = 0; r0 < k; r0 += 32) {
        __m512 a[16], b[16];
        for (int64_t r = 0; r < 16; ++r) {
          a[r] = r0 + r < m ? _mm512_maskz_loadu_ps(cols, p + (r0 + r) * ldp + c0) : _mm512_setzero_ps();
          b[r] = r0 + 16 + r < m ? _mm512_maskz_loadu_ps(cols, p + (r0 + 16 + r) * ldp + c0) : _mm512_setzero_ps();
        }
        transpose16(a);
        transpose16(b);
        for (int64_t j = 0; j < c_end; ++j)
          store_split(a[j], b[j], high_words, hi + (c0 + j) * ld + r0, lo ? lo + (c0 + j) * ld + r0 : nullptr);
      }
    }
  }

  // exp2_split_group over `rows` rows, one at a time (scale 1: unscaled; lo
  // null: hi alone); tick(1) after each 32 columns of a row.
  // step: elements of a hi / lo row from one 32-column piece to the next (32:
  // contiguous rows; 64: hi and lo interleaved by pieces in one row, which may
  // be the scores' own row: piece c's 128 bytes are written after they are read).
  // col_scale (n floats, or null): P's column c is written times col_scale[c]
  // (a quantized cache's V scales), the sums staying those of P.
  template <class Tick>
  static void exp2_split_rows(const float* s, int64_t ld, int64_t rows, int64_t n, int64_t k, float scale,
                              const float* sub, float* sums, uint16_t* hi, uint16_t* lo, int64_t ld16,
                              int64_t step, const float* col_scale, Tick&& tick);
};

// The softmax's exponentials of one row group, written straight into the
// bf16 hi + lo form P V reads (bf16_split_rows' rounding): rows g of s (fp32,
// row stride ld) become P = exp2(s * scale - sub[g]) (kScaled; else s -
// sub[g]) in hi / lo rows of k elements (row stride ld16, zero past n), and
// sums[g] their fp32 sum, added in exp2_sum_rows' lane order. No fp32 P is
// stored and read back; the scores stay as they are unless hi / lo are their
// own rows (step 64, the amx rung). kLo false: hi alone
// (ForwardArgs::bf16_probabilities). col_scale non-null: the split P is P
// times col_scale[c] in fp32 (a quantized cache's V scales: the product the
// main loop's scale_columns forms), the sums P's own. tick(G) after each 32
// columns: the caller's work to interleave (queued tile steps on AMX).
template <int G, bool kScaled, bool kLo, class Tick>
static inline void exp2_split_group(const float* s, int64_t ld, int64_t n, int64_t k, float scale,
                                    const float* sub, float* sums, uint16_t* hi, uint16_t* lo, int64_t ld16,
                                    int64_t step, const float* col_scale, Tick& tick) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  const __m512i high_words = high_word_index();
  __m512 sv[G], sum[G];
  for (int g = 0; g < G; ++g) {
    sv[g] = _mm512_set1_ps(sub[g]);
    sum[g] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < k; c += 32) {
    const __mmask16 m0 = lanes16(n - c), m1 = lanes16(n - c - 16);
    for (int g = 0; g < G; ++g) {
      const float* x = s + g * ld + c;
      const __m512 v0 = _mm512_maskz_loadu_ps(m0, x), v1 = _mm512_maskz_loadu_ps(m1, x + 16);
      const __m512 a0 = kScaled ? _mm512_fmsub_ps(v0, scale_v, sv[g]) : _mm512_sub_ps(v0, sv[g]);
      const __m512 a1 = kScaled ? _mm512_fmsub_ps(v1, scale_v, sv[g]) : _mm512_sub_ps(v1, sv[g]);
      __m512 e0 = exp2_table_masked_ps(a0, m0), e1 = exp2_table_masked_ps(a1, m1);
      sum[g] = _mm512_add_ps(_mm512_add_ps(sum[g], e0), e1);
      if (col_scale) {
        e0 = _mm512_mul_ps(e0, _mm512_maskz_loadu_ps(m0, col_scale + c));
        e1 = _mm512_mul_ps(e1, _mm512_maskz_loadu_ps(m1, col_scale + c + 16));
      }
      const int64_t at = g * ld16 + c / 32 * step;
      store_split(e0, e1, high_words, hi + at, kLo ? lo + at : nullptr);
    }
    tick(G);
  }
  for (int g = 0; g < G; ++g) sums[g] = _mm512_reduce_add_ps(sum[g]);
}

template <bool kScaled, bool kLo, class Tick>
static inline void exp2_split_rows_of(const float* s, int64_t ld, int64_t rows, int64_t n, int64_t k, float scale,
                                      const float* sub, float* sums, uint16_t* hi, uint16_t* lo, int64_t ld16,
                                      int64_t step, const float* col_scale, Tick& tick) {
  for (int64_t r = 0; r < rows; ++r)
    exp2_split_group<1, kScaled, kLo>(s + r * ld, ld, n, k, scale, sub + r, sums + r, hi + r * ld16,
                                      kLo ? lo + r * ld16 : nullptr, ld16, step, col_scale, tick);
}

template <class Tick>
inline void Bf16Packing::exp2_split_rows(const float* s, int64_t ld, int64_t rows, int64_t n, int64_t k,
                                         float scale, const float* sub, float* sums, uint16_t* hi, uint16_t* lo,
                                         int64_t ld16, int64_t step, const float* col_scale, Tick&& tick) {
  if (scale != 1.0f) {
    if (lo) exp2_split_rows_of<true, true>(s, ld, rows, n, k, scale, sub, sums, hi, lo, ld16, step, col_scale, tick);
    else exp2_split_rows_of<true, false>(s, ld, rows, n, k, scale, sub, sums, hi, nullptr, ld16, step, col_scale, tick);
  } else {
    if (lo) exp2_split_rows_of<false, true>(s, ld, rows, n, k, 1.0f, sub, sums, hi, lo, ld16, step, col_scale, tick);
    else exp2_split_rows_of<false, false>(s, ld, rows, n, k, 1.0f, sub, sums, hi, nullptr, ld16, step, col_scale, tick);
  }
}

// vdpbf16ps register tile: MR rows x (16 * NV) columns of C, like the fp32
// gemm_block; each step takes one pair of the reduction (two bf16 of every A
// row, one pair row of B). With a_lo, every step adds A_lo's pair too.
template <int MR, int NV, bool kLo>
static inline void bf16_dot_block(int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                                  const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < k / 2; ++p) {
    __m512i bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_si512(b + v * b_panel + p * 32);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * p, sizeof(pair));
      const __m512bh ar = as_bf16_pairs(_mm512_set1_epi32(pair));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, as_bf16_pairs(bv[v]));
      if constexpr (kLo) {
        std::memcpy(&pair, a_lo + r * lda + 2 * p, sizeof(pair));
        const __m512bh al = as_bf16_pairs(_mm512_set1_epi32(pair));
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], al, as_bf16_pairs(bv[v]));
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

template <int NV, bool kLo, int R>
static inline void bf16_dot_rows_tail(int rows, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                                      const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate) {
  if constexpr (R > 0) {
    if (rows == R) return bf16_dot_block<R, NV, kLo>(k, a, a_lo, lda, b, b_panel, c, ldc, accumulate);
    bf16_dot_rows_tail<NV, kLo, R - 1>(rows, k, a, a_lo, lda, b, b_panel, c, ldc, accumulate);
  }
}

template <int NV, bool kLo>
static inline void bf16_dot_panel(int64_t m, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                                  const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                                  RowPrefetch* prefetch) {
  constexpr int kRows = kBlockRows<NV>;
  constexpr int64_t kPrefetchLinesPerBlock = 8;
  // A tail of 1-3 rows after the full blocks has too few accumulator chains
  // to hide vdpbf16ps' latency: the last full block and it go as a 4-row
  // block and a 3-5-row one (a 32-row step: 4 x 6 + 4 + 4, not 5 x 6 + 2).
  // AMD EPYC Zen 5, bf16 H8 N4096 D128, 2 threads, paired with the code
  // before (loaded host): 0.93-0.98 of the time, 0.89-0.98 with
  // bf16_probabilities.
  constexpr int kSplitRows = 4;
  const int64_t rest = m % kRows;
  const int64_t tail = kRows == 6 && m > kRows && rest > 0 && rest < kSplitRows ? rest + kRows : rest;
  int64_t i = 0;
  for (; i + kRows <= m - tail; i += kRows) {
    bf16_dot_block<kRows, NV, kLo>(k, a + i * lda, kLo ? a_lo + i * lda : nullptr, lda, b, b_panel, c + i * ldc,
                                   ldc, accumulate);
    if (prefetch) prefetch->issue(kPrefetchLinesPerBlock);
  }
  if (m - i > kRows) {
    bf16_dot_block<kSplitRows, NV, kLo>(k, a + i * lda, kLo ? a_lo + i * lda : nullptr, lda, b, b_panel,
                                        c + i * ldc, ldc, accumulate);
    i += kSplitRows;
  }
  bf16_dot_rows_tail<NV, kLo, kRows - 1>(int(m - i), k, a + i * lda, kLo ? a_lo + i * lda : nullptr, lda, b,
                                         b_panel, c + i * ldc, ldc, accumulate);
}

template <bool kLo>
static inline void bf16_dot_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo,
                                 int64_t lda, const uint16_t* b, int64_t b_panel, float* c, int64_t ldc,
                                 bool accumulate, RowPrefetch* prefetch) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64)
    bf16_dot_panel<4, kLo>(m, k, a, a_lo, lda, b + j / 16 * b_panel, b_panel, c + j, ldc, accumulate, prefetch);
  for (; j + 32 <= n; j += 32)
    bf16_dot_panel<2, kLo>(m, k, a, a_lo, lda, b + j / 16 * b_panel, b_panel, c + j, ldc, accumulate, prefetch);
  if (j < n)
    bf16_dot_panel<1, kLo>(m, k, a, a_lo, lda, b + j / 16 * b_panel, b_panel, c + j, ldc, accumulate, prefetch);
}

}  // namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE

#include "isa/avx512bf16/few_rows_dot.hpp"
#include "isa/avx512bf16/lo_int8.hpp"

namespace tileattn::detail {
// Bf16Packing::bf16_pack_k / bf16_pack_v of fp8 e4m3 rows (unit stride) on
// AVX512-VBMI byte permutes (E4m3PermuteRows), compiled in few_rows_vbmi.cpp.
void bf16_pack_k_e4m3(const void* const* rows, int64_t n, int64_t d, uint16_t* dst, int64_t k);
void bf16_pack_v_e4m3(const void* const* rows, int64_t n, int64_t d, uint16_t* dst, int64_t kv_pad);
}  // namespace tileattn::detail

namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE {


// The avx512bf16 rung: the AVX-512 Kernels plus bf16 products on vdpbf16ps.
struct Bf16DotKernels : Kernels, Bf16Packing {
  static constexpr bool kBf16Products = true;
  // bf16_pack_k (values false) or bf16_pack_v (true) of a quantized cache's
  // int8 or fp8 e4m3 rows (unit stride): fp8 on VBMI byte permutes where
  // CPUID has VBMI (the emulation: unless fp8_rows_on_fp32).
  static void bf16_pack_quantized(bool values, DType type, const void* const* rows, int64_t n, int64_t d,
                                  uint16_t* dst, int64_t ld) {
    const auto pack = [&](const auto& load) {
      if (values) bf16_pack_v(rows, n, d, 1, dst, ld, load);
      else bf16_pack_k(rows, n, d, 1, dst, ld, load);
    };
    if (type == DType::i8) return pack(QuantizedRows<DType::i8>{});
    if (fp32_fp8_rows()) return pack(QuantizedRows<DType::f8_e4m3>{});
#ifdef TILEATTN_AVX512_EMULATION
    pack(E4m3PermuteRows{});
#else
    if (values) bf16_pack_v_e4m3(rows, n, d, dst, ld);
    else bf16_pack_k_e4m3(rows, n, d, dst, ld);
#endif
  }
  // fp8 rows through the fp32 loads: CPUs without VBMI (Cooper Lake), and
  // the emulation when a test asks (emulated_fp8_rows_on_fp32).
#ifdef TILEATTN_AVX512_EMULATION
  static inline bool fp8_rows_on_fp32 = false;
  static bool fp32_fp8_rows() { return fp8_rows_on_fp32; }
#else
  static bool fp32_fp8_rows() { return !few_rows_dot_vbmi(); }
#endif
  static void bf16_begin() {}
  static void bf16_end() {}
  // C (m, n) (+)= A (m, k) B (k, n) [+ A_lo (m, k) B], in the pair layout
  // above; n a multiple of 16, k even. a_lo may be null.
  static void bf16_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                        const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                        RowPrefetch* prefetch = nullptr) {
    if (a_lo) bf16_dot_gemm<true>(m, n, k, a, a_lo, lda, b, b_panel, c, ldc, accumulate, prefetch);
    else bf16_dot_gemm<false>(m, n, k, a, nullptr, lda, b, b_panel, c, ldc, accumulate, prefetch);
  }
  // P V's low part on int8 products (lo_int8.hpp) where CPUID has VNNI: the
  // forward's P from its own exponentials, V tiles within the range there.
  // AMD EPYC Zen 4, bf16 H8 N4096 D128, 2 threads: docs/architecture.md.
  static constexpr bool kLoOnInt8 = true;
  static bool lo_on_int8_take() { return lo_on_int8_available(); }
  static bool lo_int8_pack_v(const uint16_t* v, int64_t kv_pad, int64_t d_pad, uint8_t* v_q, float* v_scale) {
    return pack_v_int8(v, kv_pad, d_pad, v_q, v_scale);
  }
  // exp2_split_rows with lo as lo_int8.hpp's lo_q rows (stride ld8 bytes),
  // their lo_scale and lo_offset (col_scale as there).
  static void exp2_split_rows_lo_int8(float* s, int64_t ld, int64_t rows, int64_t n, int64_t k, float scale,
                                      const float* sub, float* sums, uint16_t* hi, int64_t ld16, int8_t* lo_q,
                                      int64_t ld8, float* lo_scale, int32_t* lo_offset,
                                      const float* col_scale = nullptr) {
    const auto each_row = [&]<bool kScaled>() {
      for (int64_t r = 0; r < rows; ++r)
        exp2_split_row_lo_int8<kScaled>(s + r * ld, n, k, scale, sub[r], sums + r, hi + r * ld16, lo_q + r * ld8,
                                        lo_scale + r, lo_offset + r, col_scale);
    };
    if (scale != 1.0f) each_row.template operator()<true>();
    else each_row.template operator()<false>();
  }
  static void lo_int8_products(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                               const int32_t* a_offset, const uint8_t* b, int64_t b_panel, const float* b_scale,
                               float* c, int64_t ldc) {
    lo_int8_gemm(m, n, k, a, lda, a_scale, a_offset, b, b_panel, b_scale, c, ldc);
  }
  // Decode scores of bf16 and fp8 e4m3 keys on vdpbf16ps
  // (few_rows_dot::scores): the main loop gives these kernels its few rows
  // of Q unscaled (still bf16 values) when K is such a cache with unit
  // element stride. Both need AVX512-VBMI here (fp8's byte permutes; bf16
  // keeps the rung's rule of one flag set per kernel): Cooper Lake keeps the
  // FMA scores.
  static constexpr bool kFewRowsDotScores = true;
  static bool few_rows_dot_scores_take(DType key_type) {
    return (key_type == DType::bf16 || key_type == DType::f8_e4m3) && few_rows_dot_vbmi();
  }
  static void few_rows_dot_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                                  const void* const* key_rows, DType key_type, float scale, float* s, int64_t lds,
                                  const RowsToPrefetch& ahead = {}) {
    const auto run = [&]<DType kKType>() {
      few_rows_dot::with_rows(m, [&]<int M>() {
        few_rows_dot::scores<kKType, M>(n, d, q, ldq, key_rows, scale, s, lds, ahead);
      });
    };
    if (key_type != DType::f8_e4m3) return run.template operator()<DType::bf16>();
#ifdef TILEATTN_E4M3_PERMUTES
    run.template operator()<DType::f8_e4m3>();
#else
    few_rows_dot_scores_e4m3(m, n, d, q, ldq, key_rows, scale, s, lds, ahead);
#endif
  }
  // Decode P V with P rounded (ForwardArgs / KvCacheArgs
  // ::bf16_probabilities): to bf16 on vdpbf16ps (few_rows_dot::
  // accumulate_bf16_probabilities) for a bf16, fp8 e4m3 or int8 cache read
  // with unit element stride on the CPUs where the dot scores run (VBMI;
  // Cooper Lake, unmeasured, keeps the FMA products), except that an int8
  // cache takes the VNNI P V where CPUID has VNNI (next; its scores are not
  // dot products either: FMAs, or VNNI with bf16_probabilities,
  // FewRows16Kernels, docs/inference.md).
  static constexpr bool kFewRowsDotProbabilities = true;
  static bool few_rows_dot_probabilities_take(DType value_type) {
    return ((value_type == DType::bf16 || value_type == DType::f8_e4m3 || value_type == DType::i8) &&
            few_rows_dot_vbmi()) ||
           few_rows_dot_int8_on_vnni(value_type);
  }
  // An int8 V takes the avx512 rung's P V on vpdpwssd instead where CPUID
  // has VNNI (P in 16-bit integers, one step per row and 32 keys;
  // few_rows_vnni.hpp): Llama-3-8B decode of an int8 cache with
  // bf16_probabilities (900 tokens in cache, one thread, AMD EPYC Zen 4,
  // 3 rounds) 18.96-19.52 ns per (token, KV head) against 21.45-21.77 on
  // vdpbf16ps, whose int8 -> bf16 conversion costs more than the
  // vpdpwssd pairs' interleave (docs/inference.md). The avx512 rung's own
  // rule and kernel (FewRows16Kernels) decide and run it; under the AVX-512
  // emulation (AVX2 few-rows products beneath) there is none, and the
  // emulated vdpbf16ps P V runs.
  template <class Base = Kernels>
  static bool few_rows_dot_int8_on_vnni(DType value_type) {
    if constexpr (requires { Base::kFewRowsDotProbabilities; })
      return Base::few_rows_dot_probabilities_take(value_type);
    else
      return false;
  }
  // The avx512 rung's VNNI P V (only where few_rows_dot_int8_on_vnni).
  template <class Base = Kernels>
  static void vnni_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                              const void* const* value_rows, DType value_type, float* acc, int64_t ldacc,
                              const RowsToPrefetch& ahead) {
    if constexpr (requires { Base::kFewRowsDotProbabilities; })
      Base::few_rows_dot_accumulate(m, n, d, p, ldp, value_rows, value_type, acc, ldacc, ahead);
  }
  // The next step's K rows stay with the scores here (`ahead` of
  // few_rows_dot_accumulate is then never given rows), except for the VNNI
  // P V, which asks for them itself (few_rows_vnni.cpp): P V asking for them
  // paid on the VNNI P V and lost on the FMA P V; the vdpbf16ps one is
  // unmeasured.
  static bool few_rows_dot_accumulate_prefetches_k(DType value_type) {
    return few_rows_dot_int8_on_vnni(value_type);
  }
  // The vdpbf16ps P V asks for the next step's V rows (ahead.v_rows) where
  // the main loop gives them (decode_pv_asks_next_v), as the FMA P V does.
  static bool few_rows_dot_accumulate_asks_next_v(DType value_type) {
    return !few_rows_dot_int8_on_vnni(value_type);
  }
  static void few_rows_dot_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                      const void* const* value_rows, DType value_type, float* acc, int64_t ldacc,
                                      const RowsToPrefetch& ahead) {
    if (few_rows_dot_int8_on_vnni(value_type))
      return vnni_accumulate(m, n, d, p, ldp, value_rows, value_type, acc, ldacc, ahead);
    const NextRows next = NextRows::values_of(ahead);
    const auto run = [&]<DType kVType>() {
      few_rows_dot::with_rows(m, [&]<int M>() {
        few_rows_dot::accumulate_bf16_probabilities<M, kVType>(n, d, p, ldp, value_rows, acc, ldacc, next);
      });
    };
    if (value_type == DType::i8) return run.template operator()<DType::i8>();
    if (value_type != DType::f8_e4m3) return run.template operator()<DType::bf16>();
#ifdef TILEATTN_E4M3_PERMUTES
    run.template operator()<DType::f8_e4m3>();
#else
    few_rows_dot_accumulate_e4m3(m, n, d, p, ldp, value_rows, acc, ldacc, ahead);
#endif
  }
};

}  // namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE
