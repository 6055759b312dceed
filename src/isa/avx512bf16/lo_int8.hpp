// P V's low part on int8 products (AVX512-VNNI vpdpbusd) for the vdpbf16ps
// rung. The forward splits P into bf16 hi + lo so that P V keeps P to
// 2^-16 (docs/accuracy.md); lo needs only a few bits of its own, and
// vpdpbusd multiplies 64 byte pairs per instruction where vdpbf16ps
// multiplies 32 bf16 pairs. So per key tile:
//   P V = hi V (vdpbf16ps, exact products)
//       + (lo_q V_q) * lo_scale[row] * v_scale[column]   (vpdpbusd, int32 sums)
// with hi = P rounded to nearest bf16, lo = P - hi (exact, |lo| <= 2^-8 P,
// either sign), lo_q = round(lo / lo_scale) in -127..127 (lo_scale: the
// row's largest |lo| in the tile / 127) and V_q = round(V / v_scale) in
// -127..127 (v_scale: the column's largest |V| in the tile / 127).
// vpdpbusd takes one operand unsigned: V_q goes as V_q + 128, and each
// row's 128 (sum of its lo_q) is taken back from the int32 sums (exactly;
// lo_q is 0 past the row's keys, so the correction holds for any reduction
// length a band of rows takes). Error of the low part, per key: lo's rounding (half a step,
// <= 2^-16 of the tile's largest P in the row) times |V|, and V's (half a
// step of the column's largest |V|) times |lo| (<= 2^-8 P), both of random
// sign from key to key, against 2^-16 P |V| for the bf16 lo. Measured in
// docs/accuracy.md.
//
// A tile whose V column maxima are not all 0 or within [2^-100, 2^100]
// (inf, NaN, huge or tiny values, where the steps' reciprocals would leave
// fp32) keeps the bf16 lo: pack_v_int8 says so and nothing else changes.
//
// Layout of V_q (from the bf16 pair tile, bf16_kernels.hpp): Dv_pad / 16
// panels of (kv_pad / 4 quad rows, 16 columns, 4 keys), element (j, c) at
// byte (c / 16) * 16 * kv_pad + (j / 4) * 64 + (c % 16) * 4 + j % 4: one
// quad row holds V_q + 128 (unsigned) and is one vpdpbusd vector. lo_q rows
// are plain signed bytes in key order, four keys (one dword) broadcast per
// step.
//
// Included by bf16_kernels.hpp inside its namespace, after Bf16Packing.
#pragma once

namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE {

// The int8 products need AVX512-VNNI, which every CPU with AVX512-BF16 has
// (Cooper Lake, Sapphire Rapids and later, Zen 4, Zen 5); the rung's
// translation unit is compiled without it, so these functions ask for it
// themselves and run only where CPUID has it (lo_on_int8_available).
#ifdef TILEATTN_AVX512_EMULATION
#define TILEATTN_LO_INT8_TARGET
using LoInt8Acc = __m512i;
static inline LoInt8Acc lo_int8_acc(__m512i v) { return v; }
static inline __m512i lo_int8_vector(LoInt8Acc v) { return v; }
static inline bool lo_on_int8_available() { return true; }
#else
#define TILEATTN_LO_INT8_TARGET __attribute__((target("avx512vnni")))
// int32 accumulators as GCC's own vector type: as __m512i (vectors of
// int64) GCC 12 kept a 6 x 4 block of them on the stack (101 spill loads
// and stores per block loop, 1.3x the time of the bf16 hi product it joins);
// as __v16si, none.
using LoInt8Acc = __v16si;
static inline LoInt8Acc lo_int8_acc(__m512i v) { return (LoInt8Acc)v; }
static inline __m512i lo_int8_vector(LoInt8Acc v) { return (__m512i)v; }
static inline bool lo_on_int8_available() { return cpu_features().avx512_vnni; }
#endif

// Column maxima outside this range (or non-finite) keep the bf16 lo.
constexpr float kLoInt8MinColumn = 0x1p-100f, kLoInt8MaxColumn = 0x1p100f;
// A row whose largest lo is below this drops its lo (P below 2^-93 of the
// row's largest key: an error under 2^-93 of the output).
constexpr float kLoInt8MinRow = 0x1p-100f;

// V_q + 128 (bytes) and v_scale (d_pad floats) from the bf16 pair tile v
// (d_pad / 16 panels of (kv_pad / 2, 16, 2), keys past the tile's zero).
// false: some column is outside [kLoInt8MinColumn, kLoInt8MaxColumn) and
// not all zero; nothing useful is written then.
static inline bool pack_v_int8(const uint16_t* v, int64_t kv_pad, int64_t d_pad, uint8_t* v_q, float* v_scale) {
  const __m512i keep_high = _mm512_set1_epi32(int32_t(0xffff0000u));
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i low_byte = _mm512_set1_epi32(0xff);
  const __m512i to_unsigned = _mm512_set1_epi32(int32_t(0x80808080u));  // each byte + 128
  for (int64_t c0 = 0; c0 < d_pad; c0 += 16) {
    const uint16_t* panel = v + c0 * kv_pad;  // (kv_pad / 2, 16, 2)
    // Largest |V| of each column, compared as bits (non-negative floats
    // order as their bits; inf and NaN above every finite value).
    __m512i largest = _mm512_setzero_si512();
    for (int64_t p = 0; p < kv_pad / 2; ++p) {
      const __m512i w = _mm512_load_si512(panel + p * 32);
      largest = _mm512_max_epu32(largest, _mm512_and_si512(_mm512_slli_epi32(w, 16), magnitude));
      largest = _mm512_max_epu32(largest, _mm512_and_si512(w, _mm512_and_si512(keep_high, magnitude)));
    }
    alignas(64) float column_max[16], inverse[16];
    _mm512_store_si512(column_max, largest);
    for (int i = 0; i < 16; ++i) {
      const float m = column_max[i];
      if (m == 0.0f) {
        inverse[i] = v_scale[c0 + i] = 0.0f;
        continue;
      }
      if (!(m >= kLoInt8MinColumn && m < kLoInt8MaxColumn)) return false;
      inverse[i] = 127.0f / m;
      v_scale[c0 + i] = m / 127.0f;
    }
    const __m512 inv = _mm512_load_ps(inverse);
    uint8_t* out = v_q + c0 * kv_pad;  // (kv_pad / 4, 16, 4)
    for (int64_t q = 0; q < kv_pad / 4; ++q) {
      const __m512i w0 = _mm512_load_si512(panel + 2 * q * 32), w1 = _mm512_load_si512(panel + (2 * q + 1) * 32);
      // Keys 4q .. 4q + 3 of the 16 columns, as fp32, scaled and rounded
      // (|x| <= 127 by construction).
      const __m512i k0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), inv));
      const __m512i k1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(w0, keep_high)), inv));
      const __m512i k2 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)), inv));
      const __m512i k3 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(w1, keep_high)), inv));
      const __m512i quad = _mm512_or_si512(
          _mm512_or_si512(_mm512_and_si512(k0, low_byte), _mm512_slli_epi32(_mm512_and_si512(k1, low_byte), 8)),
          _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(k2, low_byte), 16), _mm512_slli_epi32(k3, 24)));
      _mm512_store_si512(out + q * 64, _mm512_xor_si512(quad, to_unsigned));
    }
  }
  return true;
}

// One row of the softmax's exponentials as hi (bf16, rounded to nearest even)
// and lo_q (signed bytes) with its lo_scale and lo_offset (128 x the sum of
// the row's lo_q): P = exp2(s * scale - sub)
// (kScaled; else s - sub) for the row's n scores at s, hi / lo_q k elements
// (P = 0 past n), *sum their fp32 sum in exp2_split_group's order. The fp32
// lo (P - hi, exact) waits in s between the two passes, within the row's n
// elements: the scores are not read after the exponentials. col_scale
// non-null: hi and lo split P times col_scale[c] (exp2_split_group's).
template <bool kScaled>
static inline void exp2_split_row_lo_int8(float* s, int64_t n, int64_t k, float scale, float sub, float* sum,
                                          uint16_t* hi, int8_t* lo_q, float* lo_scale, int32_t* lo_offset,
                                          const float* col_scale) {
  const __m512 scale_v = _mm512_set1_ps(scale), sub_v = _mm512_set1_ps(sub);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  __m512 total = _mm512_setzero_ps(), largest = _mm512_setzero_ps();
  for (int64_t c = 0; c < k; c += 32) {
    const __mmask16 m0 = lanes16(n - c), m1 = lanes16(n - c - 16);
    const __m512 v0 = _mm512_maskz_loadu_ps(m0, s + c), v1 = _mm512_maskz_loadu_ps(m1, s + c + 16);
    const __m512 a0 = kScaled ? _mm512_fmsub_ps(v0, scale_v, sub_v) : _mm512_sub_ps(v0, sub_v);
    const __m512 a1 = kScaled ? _mm512_fmsub_ps(v1, scale_v, sub_v) : _mm512_sub_ps(v1, sub_v);
    __m512 e0 = exp2_table_masked_ps(a0, m0), e1 = exp2_table_masked_ps(a1, m1);
    total = _mm512_add_ps(_mm512_add_ps(total, e0), e1);
    if (col_scale) {
      e0 = _mm512_mul_ps(e0, _mm512_maskz_loadu_ps(m0, col_scale + c));
      e1 = _mm512_mul_ps(e1, _mm512_maskz_loadu_ps(m1, col_scale + c + 16));
    }
    const __m512i h = bf16_bits(_mm512_cvtne2ps_pbh(e1, e0));  // e0's 16 words, then e1's
    _mm512_storeu_si512(hi + c, h);
    const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
    const __m512 h1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
    const __m512 l0 = _mm512_sub_ps(e0, h0), l1 = _mm512_sub_ps(e1, h1);
    // |lo|; a NaN lo leaves largest as it is (its row is cleared).
    const __m512 abs0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(l0), magnitude));
    const __m512 abs1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(l1), magnitude));
    largest = _mm512_max_ps(abs0, _mm512_max_ps(abs1, largest));
    _mm512_mask_storeu_ps(s + c, m0, l0);
    _mm512_mask_storeu_ps(s + c + 16, m1, l1);
  }
  *sum = _mm512_reduce_add_ps(total);
  const float row_largest = _mm512_reduce_max_ps(largest);
  const bool keep = row_largest >= kLoInt8MinRow;
  *lo_scale = keep ? row_largest / 127.0f : 0.0f;
  const __m512 inv = _mm512_set1_ps(keep ? 127.0f / row_largest : 0.0f);
  __m512i q_sum = _mm512_setzero_si512();
  for (int64_t c = 0; c < k; c += 16) {
    // |lo * inv| <= 127 (up to inv's rounding, which rounds back to 127).
    const __m512 l = _mm512_maskz_loadu_ps(lanes16(n - c), s + c);
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(l, inv));
    q_sum = _mm512_add_epi32(q_sum, q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo_q + c), _mm512_cvtepi32_epi8(q));
  }
  alignas(64) int32_t lane_sums[16];
  _mm512_store_si512(lane_sums, q_sum);
  // Summed modulo 2^32: a NaN row's lanes (cvtps2dq's 0x80000000; the row is
  // cleared afterwards) must not overflow a signed sum; real rows stay small.
  uint32_t row_sum = 0;
  for (int i = 0; i < 16; ++i) row_sum += uint32_t(lane_sums[i]);
  *lo_offset = int32_t(128u * row_sum);
}

// C (MR rows x 16 NV columns, row stride ldc) += (A_q (B_q + 128) -
// a_offset[row]) * a_scale[row] * b_scale[column] over k (a multiple of 4)
// keys: A_q rows of signed bytes (stride lda), B_q + 128 quad rows of one
// panel group (b_panel bytes between panels).
template <int MR, int NV>
TILEATTN_LO_INT8_TARGET static inline void lo_int8_block(int64_t k, const int8_t* a, int64_t lda,
                                                         const float* a_scale, const int32_t* a_offset,
                                                         const uint8_t* b, int64_t b_panel, const float* b_scale,
                                                         float* c, int64_t ldc) {
  LoInt8Acc acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = lo_int8_acc(_mm512_setzero_si512());
  for (int64_t q = 0; q < k / 4; ++q) {
    __m512i bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_si512(b + v * b_panel + q * 64);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      std::memcpy(&quad, a + r * lda + 4 * q, sizeof(quad));
      const __m512i ar = _mm512_set1_epi32(quad);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[r][v] = lo_int8_acc(_mm512_dpbusd_epi32(lo_int8_vector(acc[r][v]), bv[v], ar));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const __m512 row_scale = _mm512_set1_ps(a_scale[r]);
    const __m512i row_offset = _mm512_set1_epi32(a_offset[r]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __m512i sum = _mm512_sub_epi32(lo_int8_vector(acc[r][v]), row_offset);
      const __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), row_scale);
      float* out = c + r * ldc + 16 * v;
      _mm512_storeu_ps(out, _mm512_fmadd_ps(part, _mm512_load_ps(b_scale + 16 * v), _mm512_loadu_ps(out)));
    }
  }
}

template <int NV, int R>
TILEATTN_LO_INT8_TARGET static inline void lo_int8_rows_tail(int rows, int64_t k, const int8_t* a, int64_t lda,
                                                             const float* a_scale, const int32_t* a_offset,
                                                             const uint8_t* b, int64_t b_panel, const float* b_scale,
                                                             float* c, int64_t ldc) {
  if constexpr (R > 0) {
    if (rows == R) return lo_int8_block<R, NV>(k, a, lda, a_scale, a_offset, b, b_panel, b_scale, c, ldc);
    lo_int8_rows_tail<NV, R - 1>(rows, k, a, lda, a_scale, a_offset, b, b_panel, b_scale, c, ldc);
  }
}

// All m rows against one group of NV panels, in blocks as bf16_dot_panel's.
template <int NV>
TILEATTN_LO_INT8_TARGET static inline void lo_int8_panel(int64_t m, int64_t k, const int8_t* a, int64_t lda,
                                                         const float* a_scale, const int32_t* a_offset,
                                                         const uint8_t* b, int64_t b_panel, const float* b_scale,
                                                         float* c, int64_t ldc) {
  constexpr int kRows = kBlockRows<NV>;
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows)
    lo_int8_block<kRows, NV>(k, a + i * lda, lda, a_scale + i, a_offset + i, b, b_panel, b_scale, c + i * ldc, ldc);
  lo_int8_rows_tail<NV, kRows - 1>(int(m - i), k, a + i * lda, lda, a_scale + i, a_offset + i, b, b_panel, b_scale,
                                   c + i * ldc, ldc);
}

// C (m, n) += (lo_q (m, k) V_q (k, n)) * a_scale[row] * b_scale[column], from
// lo_q with a_offset (exp2_split_row_lo_int8's) and V_q + 128
// (pack_v_int8's); n a multiple of 16, k of 4; V_q in the quad layout above
// (b_panel = 16 * kv_pad).
TILEATTN_LO_INT8_TARGET __attribute__((noinline)) static void lo_int8_gemm(
    int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale, const int32_t* a_offset,
    const uint8_t* b, int64_t b_panel, const float* b_scale, float* c, int64_t ldc) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64)
    lo_int8_panel<4>(m, k, a, lda, a_scale, a_offset, b + j / 16 * b_panel, b_panel, b_scale + j, c + j, ldc);
  for (; j + 32 <= n; j += 32)
    lo_int8_panel<2>(m, k, a, lda, a_scale, a_offset, b + j / 16 * b_panel, b_panel, b_scale + j, c + j, ldc);
  if (j < n)
    lo_int8_panel<1>(m, k, a, lda, a_scale, a_offset, b + j / 16 * b_panel, b_panel, b_scale + j, c + j, ldc);
}

#undef TILEATTN_LO_INT8_TARGET

}  // namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE
