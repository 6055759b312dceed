// Decode products on vdpbf16ps for a few stacked query rows (keys read in
// place): the scores of bf16 and fp8 e4m3 keys, P V with P rounded to bf16
// (bf16_probabilities) of bf16, fp8 e4m3 and int8 values; fp8 becomes bf16 on
// AVX512-VBMI byte permutes (E4m3ToBf16, isa/avx512/e4m3_permutes.hpp).
// Included by bf16_kernels.hpp (the avx512bf16 rung and its emulation). The
// fp8 parts need VBMI, which Cooper Lake lacks: natively they are compiled
// only in few_rows_vbmi.cpp (its flags add -mavx512vbmi) and called through
// the entry points below where CPUID has VBMI; the emulation has the byte
// permutes and compiles them here.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/half.hpp"
#include "core/row_prefetch.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/types.hpp"

namespace tileattn::detail {
// The fp8 e4m3 decode products of few_rows_vbmi.cpp (AVX512-VBMI): the
// contract of few_rows_dot::scores<f8_e4m3, M> for m = 1..8 rows.
void few_rows_dot_scores_e4m3(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                              const void* const* key_rows, float scale, float* s, int64_t lds,
                              const RowsToPrefetch& ahead);
// The same P V with P rounded to bf16 (few_rows_dot::accumulate_bf16_probabilities
// with e4m3 V rows).
void few_rows_dot_accumulate_e4m3(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                  const void* const* value_rows, float* acc, int64_t ldacc,
                                  const RowsToPrefetch& next);
}  // namespace tileattn::detail

namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE {

// Whether the fp8 decode products run on byte permutes here.
#ifdef TILEATTN_AVX512_EMULATION
static inline bool few_rows_dot_vbmi() { return true; }
#else
static inline bool few_rows_dot_vbmi() { return cpu_features().avx512_vbmi; }
#endif

// Decode scores on vdpbf16ps (few stacked query rows, keys read in place):
// s[r, c] = scale * (q[r] . key_rows[c]) for r < M, c < n, with q's fp32
// rows holding bf16 values (the unscaled bf16 queries), so every product is
// exact and summed in fp32, and `scale` applied to the sums. Keys are bf16,
// or fp8 e4m3 turned into the bf16 of the same value in registers (every
// e4m3 value is a bf16 value; the per-head scale stays with the caller). The
// pass structure is few_rows16::scores' (M x KJ accumulator chains reduced
// together by reduce16, the same prefetches of `ahead`), with one vdpbf16ps
// per 32 elements per (row, key) where the fp32 product takes two FMAs per
// row and two instructions per key to widen a bf16 key (ten for fp8).
namespace few_rows_dot {

template <int M>
constexpr int kKeysPerPass = 16 / M;  // 16 accumulator chains (M <= 8: 2 or more keys)

// Elements per load of a key row: one 32-element chunk of bf16, two of fp8
// (one 64-byte load, converted with two table lookups for 64 elements).
template <DType kKType>
constexpr int64_t kStep = kKType == DType::f8_e4m3 ? 64 : 32;

// The first n of 64 byte lanes (none for n <= 0).
static inline __mmask64 tail_mask64(int64_t n) {
  return static_cast<__mmask64>(n >= 64 ? ~uint64_t(0) : n <= 0 ? uint64_t(0) : (uint64_t(1) << n) - 1u);
}

using few_rows16::E4m3ToBf16;  // e4m3 -> bf16 on byte permutes (isa/avx512/e4m3_permutes.hpp)

template <DType kKType, int M>
static void scores(int64_t n, int64_t d, const float* q, int64_t ldq, const void* const* key_rows, float scale,
                   float* s, int64_t lds, const RowsToPrefetch& ahead) {
  static_assert(kKType == DType::bf16 || kKType == DType::f8_e4m3, "bf16 or fp8 keys");
  constexpr int KJ = kKeysPerPass<M>;
  constexpr int64_t kS = kKType == DType::bf16 ? 2 : 1;
  const int64_t steps = (d + kStep<kKType> - 1) / kStep<kKType>;
  const int64_t padded = steps * kStep<kKType>;
  // q once per tile as bf16 pairs (exact: its values are bf16), zero past d.
  static_assert(tileattn::kMaxHeadDim % 64 == 0, "qb holds whole 64-element steps");
  alignas(64) uint16_t qb[M][tileattn::kMaxHeadDim];
  for (int r = 0; r < M; ++r)
    for (int64_t t = 0; t < padded; t += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(lanes16(d - t), q + r * ldq + t);
      const __m512 hi = _mm512_maskz_loadu_ps(lanes16(d - t - 16), q + r * ldq + t + 16);
      _mm512_store_si512(qb[r] + t, bf16_bits(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  const auto prefetch = [&](int64_t i0, int64_t i1) { prefetch_rows<true>(ahead, i0, i1, d * kS); };
  const __m512 scale_v = _mm512_set1_ps(scale);
  struct NoConversion {};
  [[maybe_unused]] const std::conditional_t<kKType == DType::f8_e4m3, E4m3ToBf16, NoConversion> to_bf16{};
  for (int64_t c0 = 0; c0 < n; c0 += KJ) {
    const int64_t cn = n - c0 < KJ ? n - c0 : KJ;
    const int64_t keys_per_step = (cn + steps - 1) / steps;
    // A partial pass repeats its last row; those lanes are not stored.
    const uint8_t* rows[KJ];
    for (int j = 0; j < KJ; ++j) rows[j] = static_cast<const uint8_t*>(key_rows[c0 + (j < cn ? j : cn - 1)]);
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t t = 0; t < padded; t += kStep<kKType>) {
      const int64_t first = c0 + t / kStep<kKType> * keys_per_step;
      prefetch(first, first + keys_per_step < c0 + cn ? first + keys_per_step : c0 + cn);
      for (int j = 0; j < KJ; ++j) {
        if constexpr (kKType == DType::bf16) {
          const __m512bh k = as_bf16_pairs(_mm512_maskz_loadu_epi16(tail_mask32(d - t), rows[j] + t * kS));
          for (int r = 0; r < M; ++r)
            acc[r * KJ + j] = _mm512_dpbf16_ps(acc[r * KJ + j], as_bf16_pairs(_mm512_load_si512(qb[r] + t)), k);
        } else {
          // Past d the bytes load as 0 (bf16 +0, against q's zeros).
          __m512i k0, k1;
          to_bf16(_mm512_maskz_loadu_epi8(tail_mask64(d - t), rows[j] + t), k0, k1);
          for (int r = 0; r < M; ++r) {
            acc[r * KJ + j] = _mm512_dpbf16_ps(acc[r * KJ + j], as_bf16_pairs(_mm512_load_si512(qb[r] + t)),
                                               as_bf16_pairs(k0));
            acc[r * KJ + j] = _mm512_dpbf16_ps(acc[r * KJ + j], as_bf16_pairs(_mm512_load_si512(qb[r] + t + 32)),
                                               as_bf16_pairs(k1));
          }
        }
      }
    }
    store_sums<M, KJ>(_mm512_mul_ps(scale_v, reduce16(acc)), s, lds, c0, cn);
  }
}

// Decode P V on vdpbf16ps with P rounded to bf16 (bf16_probabilities), bf16,
// fp8 e4m3 or int8 V rows read in place (PairRows below; e4m3 and int8 as the
// bf16 of the same values): acc[r, :d] += sum_c bf16(p[r, c]) V[c, :d] for r < M,
// c < n, every product exact and summed in fp32 (vdpbf16ps' denormal rules:
// tests/isa/bf16_dot_semantics.hpp, as in the packed P V). Keys go in pairs:
// a 32-key chunk's P is rounded once per row (vcvtne2ps2bf16, round to
// nearest even; dword j holds keys 2j and 2j + 1 of the chunk), and the two V
// rows of a pair are interleaved by vpunpcklwd / vpunpckhwd, so that one
// vdpbf16ps adds both keys' products to 16 columns. The interleave leaves
// dword j of 128-bit lane L holding column 8L + j (unpacklo) or 8L + 4 + j
// (unpackhi): each pass permutes the accumulator to that order and back
// (to_pair_order). An odd last key pairs with a row of zeros (its P partner
// is 0, and 0 x an inf or NaN of a real row would be NaN). Per key and 64
// columns at 4 rows: 8 vdpbf16ps and 2 interleaves, where the fp32 product
// (few_rows16::accumulate) takes 16 FMAs and 4 widenings (e4m3 adds six
// instructions per key for the conversion either way, int8 five per 32
// columns against four).
// Calls f.template operator()<M>() for M = m (1..8; other m do nothing):
// the dot-product decode kernels' one row-count switch.
template <class F>
static inline void with_rows(int64_t m, F&& f) {
  switch (m) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    case 4: return f.template operator()<4>();
    case 5: return f.template operator()<5>();
    case 6: return f.template operator()<6>();
    case 7: return f.template operator()<7>();
    case 8: return f.template operator()<8>();
    default: return;
  }
}

// Accumulator vectors per row and column pass (M x NV <= 16, as
// few_rows16::accumulate's), even: whole 32-column groups.
template <int M>
constexpr int kPairVectorsPerPass = M == 1 ? 16 : M == 2 ? 8 : M <= 4 ? 4 : 2;
constexpr int64_t kPairKeysPerChunk = 32;  // one vcvtne2ps2bf16 per row; V rows stay in L1 across passes

// (a, b) <- the lanes `first` and `second` pick from a's 16 and b's 16.
static inline void permute_pair(__m512& a, __m512& b, __m512i first, __m512i second) {
  const __m512 x = _mm512_permutex2var_ps(a, first, b);
  b = _mm512_permutex2var_ps(a, second, b);
  a = x;
}
// fp32 columns 0..15 (a) and 16..31 (b) to the interleave's order (a: columns
// 8L + j, b: 8L + 4 + j, j < 4, lanes L) and back.
static inline void to_pair_order(__m512& a, __m512& b) {
  permute_pair(a, b, _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
               _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31));
}
static inline void from_pair_order(__m512& a, __m512& b) {
  permute_pair(a, b, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
               _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31));
}

// The partner row of an odd last key: as many columns as one pass reads.
alignas(64) inline constexpr uint16_t kZeroRow[16 * kPairVectorsPerPass<1>] = {};

// How the pair passes read V rows: NV / 2 groups of 32 columns of two keys'
// rows (r0, r1, already at the pass's first column), interleaved into v[u]
// (unpacklo) and v[u + 1] (unpackhi) for each group u. bf16 rows load as
// they are; fp8 e4m3 rows (VBMI byte permutes) become the bf16 of the same
// values through E4m3ToBf16, 64 columns per conversion where the pass is
// that wide (six instructions per row and 64 columns), else 32; int8 rows
// through fp32 (vpmovsxbd, vcvtdq2ps, vcvtne2ps2bf16).
template <DType kVType>
struct PairRows;

template <>
struct PairRows<DType::bf16> {
  static constexpr int64_t kSize = 2;
  template <int NV, bool kMasked>
  void load(const uint8_t* r0, const uint8_t* r1, __mmask32 words, __m512i* v) const {
    for (int u = 0; u < NV; u += 2) {
      const __m512i x0 = kMasked ? _mm512_maskz_loadu_epi16(words, r0) : _mm512_loadu_si512(r0 + 32 * u);
      const __m512i x1 = kMasked ? _mm512_maskz_loadu_epi16(words, r1) : _mm512_loadu_si512(r1 + 32 * u);
      v[u] = _mm512_unpacklo_epi16(x0, x1);
      v[u + 1] = _mm512_unpackhi_epi16(x0, x1);
    }
  }
};

// int8 rows (a quantized cache; the per-key scales are on P already): every
// int8 value is a bf16 value (|x| <= 128 needs 8 significant bits), so 16
// bytes at a time widen to int32 (vpmovsxbd), become fp32 exactly
// (vcvtdq2ps) and bf16 exactly (vcvtne2ps2bf16): five instructions per row
// and 32 columns, where the fp32 product widens with four and, at 4 rows,
// takes 8 FMAs against 4 vdpbf16ps here. No VBMI needed.
template <>
struct PairRows<DType::i8> {
  static constexpr int64_t kSize = 1;
  // 32 int8 columns of `row` as 32 bf16 in order; past a masked `columns`
  // they load as 0 (bf16 +0).
  template <bool kMasked>
  static __m512i bf16_of(const uint8_t* row, __mmask32 columns) {
    const __m128i b0 = kMasked ? _mm_maskz_loadu_epi8(__mmask16(columns), row)
                               : _mm_loadu_si128(reinterpret_cast<const __m128i*>(row));
    const __m128i b1 = kMasked ? _mm_maskz_loadu_epi8(__mmask16(columns >> 16), row + 16)
                               : _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16));
    return bf16_bits(_mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b1)),
                                         _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b0))));
  }
  template <int NV, bool kMasked>
  void load(const uint8_t* r0, const uint8_t* r1, __mmask32 words, __m512i* v) const {
    for (int u = 0; u < NV; u += 2) {
      const __m512i a = bf16_of<kMasked>(r0 + 16 * u, words);
      const __m512i b = bf16_of<kMasked>(r1 + 16 * u, words);
      v[u] = _mm512_unpacklo_epi16(a, b);
      v[u + 1] = _mm512_unpackhi_epi16(a, b);
    }
  }
};

#ifdef TILEATTN_E4M3_PERMUTES
template <>
struct PairRows<DType::f8_e4m3> {
  static constexpr int64_t kSize = 1;
  E4m3ToBf16 to_bf16;
  template <int NV, bool kMasked>
  void load(const uint8_t* r0, const uint8_t* r1, __mmask32 words, __m512i* v) const {
    if constexpr (NV % 4 == 0 && !kMasked) {
      for (int u = 0; u < NV; u += 4) {
        __m512i a0, a1, b0, b1;
        to_bf16(_mm512_loadu_si512(r0 + 16 * u), a0, a1);
        to_bf16(_mm512_loadu_si512(r1 + 16 * u), b0, b1);
        v[u] = _mm512_unpacklo_epi16(a0, b0);
        v[u + 1] = _mm512_unpackhi_epi16(a0, b0);
        v[u + 2] = _mm512_unpacklo_epi16(a1, b1);
        v[u + 3] = _mm512_unpackhi_epi16(a1, b1);
      }
    } else {
      // 32 bytes a group (a masked 64-byte load reads only those); past d
      // they load as 0 (bf16 +0).
      const __mmask64 bytes = kMasked ? __mmask64(words) : __mmask64(0xffffffffu);
      for (int u = 0; u < NV; u += 2) {
        __m512i a0, a1, b0, b1;
        to_bf16(_mm512_maskz_loadu_epi8(bytes, r0 + 16 * u), a0, a1);
        to_bf16(_mm512_maskz_loadu_epi8(bytes, r1 + 16 * u), b0, b1);
        v[u] = _mm512_unpacklo_epi16(a0, b0);
        v[u + 1] = _mm512_unpackhi_epi16(a0, b0);
      }
    }
  }
};
#endif

// One column pass of keys [c0, c1) (c1 - c0 <= 32, their P pairs in
// `pairs`): columns [t, t + 16 NV), or with kMasked (NV == 2) the d - t < 32
// columns left. kAsk: each key pair also asks for the lines of its two
// next.rows (NextRows) that hold this pass's columns.
template <int M, int NV, bool kMasked, DType kVType, bool kAsk = false>
static inline void accumulate_pairs_pass(int64_t c0, int64_t c1, int64_t t, int64_t d, const uint32_t (*pairs)[16],
                                         const void* const* value_rows, float* acc, int64_t ldacc,
                                         const PairRows<kVType>& rows, NextRows next = {}) {
  static_assert(NV % 2 == 0 && (!kMasked || NV == 2), "whole 32-column groups; one masked group");
  constexpr int64_t kS = PairRows<kVType>::kSize;
  const __mmask16 m0 = kMasked ? lanes16(d - t) : __mmask16(0xffff);
  const __mmask16 m1 = kMasked ? lanes16(d - t - 16) : __mmask16(0xffff);
  const __mmask32 words = kMasked ? tail_mask32(d - t) : __mmask32(0xffffffffu);
  __m512 o[M][NV];
  for (int r = 0; r < M; ++r) {
    const float* row = acc + r * ldacc + t;
    for (int u = 0; u < NV; u += 2) {
      o[r][u] = kMasked ? _mm512_maskz_loadu_ps(m0, row) : _mm512_loadu_ps(row + 16 * u);
      o[r][u + 1] = kMasked ? _mm512_maskz_loadu_ps(m1, row + 16) : _mm512_loadu_ps(row + 16 * u + 16);
      to_pair_order(o[r][u], o[r][u + 1]);
    }
  }
  for (int64_t c = c0; c < c1; c += 2) {
    const uint8_t* r0 = static_cast<const uint8_t*>(value_rows[c]) + t * kS;
    const uint8_t* r1 = c + 1 < c1 ? static_cast<const uint8_t*>(value_rows[c + 1]) + t * kS
                                   : reinterpret_cast<const uint8_t*>(kZeroRow);
    if constexpr (kAsk) {
      ask_next_row(next, c, t * kS, 16 * NV * kS);
      ask_next_row(next, c + 1, t * kS, 16 * NV * kS);
    }
    __m512i v[NV];
    rows.template load<NV, kMasked>(r0, r1, words, v);
    const int64_t j = (c - c0) / 2;
    for (int r = 0; r < M; ++r) {
      const __m512bh pr = as_bf16_pairs(_mm512_set1_epi32(int32_t(pairs[r][j])));
      for (int u = 0; u < NV; ++u) o[r][u] = _mm512_dpbf16_ps(o[r][u], pr, as_bf16_pairs(v[u]));
    }
  }
  for (int r = 0; r < M; ++r) {
    float* row = acc + r * ldacc + t;
    for (int u = 0; u < NV; u += 2) {
      from_pair_order(o[r][u], o[r][u + 1]);
      if constexpr (kMasked) {
        _mm512_mask_storeu_ps(row, m0, o[r][u]);
        _mm512_mask_storeu_ps(row + 16, m1, o[r][u + 1]);
      } else {
        _mm512_storeu_ps(row + 16 * u, o[r][u]);
        _mm512_storeu_ps(row + 16 * u + 16, o[r][u + 1]);
      }
    }
  }
}

// accumulate_bf16_probabilities' body; kAsk: next.count > 0.
template <int M, DType kVType, bool kAsk>
static void accumulate_pairs_asking(int64_t n, int64_t d, const float* p, int64_t ldp,
                                    const void* const* value_rows, float* acc, int64_t ldacc,
                                    NextRows next) {
  constexpr int NV = kPairVectorsPerPass<M>;
  constexpr int64_t kKeys = kPairKeysPerChunk;
  const PairRows<kVType> rows{};
  alignas(64) uint32_t pairs[M][16];
  for (int64_t c0 = 0; c0 < n; c0 += kKeys) {
    const int64_t c1 = n - c0 < kKeys ? n : c0 + kKeys;
    for (int r = 0; r < M; ++r) {
      const __m512 lo = _mm512_maskz_loadu_ps(lanes16(c1 - c0), p + r * ldp + c0);
      const __m512 hi = _mm512_maskz_loadu_ps(lanes16(c1 - c0 - 16), p + r * ldp + c0 + 16);
      _mm512_store_si512(pairs[r], bf16_bits(_mm512_cvtne2ps_pbh(hi, lo)));
    }
    int64_t t = 0;
    for (; t + 16 * NV <= d; t += 16 * NV)
      accumulate_pairs_pass<M, NV, false, kVType, kAsk>(c0, c1, t, d, pairs, value_rows, acc, ldacc, rows, next);
    // What is left is < 16 NV columns (NV a power of two): each narrower
    // pass runs at most once, then one masked 32-column group.
    if constexpr (NV > 8)
      if (t + 128 <= d)
        accumulate_pairs_pass<M, 8, false, kVType, kAsk>(c0, c1, t, d, pairs, value_rows, acc, ldacc, rows, next),
            t += 128;
    if constexpr (NV > 4)
      if (t + 64 <= d)
        accumulate_pairs_pass<M, 4, false, kVType, kAsk>(c0, c1, t, d, pairs, value_rows, acc, ldacc, rows, next),
            t += 64;
    if constexpr (NV > 2)
      if (t + 32 <= d)
        accumulate_pairs_pass<M, 2, false, kVType, kAsk>(c0, c1, t, d, pairs, value_rows, acc, ldacc, rows, next),
            t += 32;
    if (t < d) accumulate_pairs_pass<M, 2, true, kVType, kAsk>(c0, c1, t, d, pairs, value_rows, acc, ldacc, rows, next);
  }
}

// The next step's V rows, where given (next.count > 0), asked for as the
// passes go (decode_pv_asks_next_v, core/row_prefetch.hpp).
template <int M, DType kVType = DType::bf16>
static void accumulate_bf16_probabilities(int64_t n, int64_t d, const float* p, int64_t ldp,
                                          const void* const* value_rows, float* acc, int64_t ldacc,
                                          NextRows next = {}) {
  if (next.count > 0)
    return accumulate_pairs_asking<M, kVType, true>(n, d, p, ldp, value_rows, acc, ldacc, next);
  accumulate_pairs_asking<M, kVType, false>(n, d, p, ldp, value_rows, acc, ldacc, next);
}

}  // namespace few_rows_dot

}  // namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE
