// AVX-512 tile products for a few stacked query rows (decode: the query heads
// of one GQA group, one new token each); the same contract as the AVX2 ones
// (isa/avx2/few_rows_kernels.hpp, which explains why few rows read K/V in
// place), written for 16 lanes and 32 registers:
//
// * Scores: each pass scores KJ keys for all M rows (M x KJ <= 16 accumulator
//   chains, one per (row, key)); the M x KJ 16-lane partial vectors of a pass
//   are reduced together (reduce16: 15 adds, 22 in-lane or 128-bit shuffles,
//   8 masked moves and one permute for up to 16 scores) instead of one
//   horizontal sum each.
// * P V: M x NV <= 16 accumulator vectors per column pass (NV = 16 / M
//   rounded down to a power of two), P broadcast per (row, key), 32 keys per
//   chunk so their V rows stay in L1 across the passes.
// * bf16: one 512-bit load of 32 elements gives the even elements (<< 16) and
//   the odd ones (& 0xffff0000) as fp32 with two instructions; q (per tile) and
//   the accumulator (per 32-key chunk) are permuted to that order and back.
//   fp16 converts with vcvtph2ps, fp32 loads directly.
// * Head dims: 32-element chunks, then 16-element blocks, then one masked
//   block (masked loads: no element-by-element tail loop).
// * P V sums every column over the keys in key order with one FMA per key,
//   like the AVX2 product (whose scalar tail columns, past the last multiple
//   of 8, are fused only where the compiler contracts them); the scores'
//   summation order differs (16 lanes, then the reduction tree).
//
// Included INSIDE namespace tileattn::detail::avx512 (avx512/kernels.hpp),
// after isa/avx2/few_rows_kernels.hpp (whose element-strided fallbacks, in
// few_rows::, this file reuses). Needs AVX-512 F/BW/VL (masked 16-bit loads).
//
// Measured (Llama-3-8B decode, bf16 cache of 8192 tokens): see
// docs/inference.md, "AVX-512 few-rows products".

namespace few_rows16 {

template <DType kType>
constexpr int64_t kSize = few_rows::kElementSize<kType>;

// fp8 e4m3 values sign-extended to 16-bit lanes as the fp16 bits of value /
// 2^8 (few_rows::fp8_as_scaled_f16 explains the bits), 16 and 32 lanes.
static inline __m256i fp8_as_scaled_f16(__m256i x) {
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16(int16_t(0xbf80)));
  const __m256i fields = _mm256_set1_epi16(0x3f80);
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, fields), fields);
  return _mm256_mask_blend_epi16(nan, h, _mm256_or_si256(h, _mm256_set1_epi16(0x7c00)));
}
static inline __m512i fp8_as_scaled_f16(__m512i x) {
  const __m512i h = _mm512_and_si512(_mm512_slli_epi16(x, 7), _mm512_set1_epi16(int16_t(0xbf80)));
  const __m512i fields = _mm512_set1_epi16(0x3f80);
  const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, fields), fields);
  return _mm512_mask_blend_epi16(nan, h, _mm512_or_si512(h, _mm512_set1_epi16(0x7c00)));
}

// 16 fp8 e4m3 bytes as fp32 value / 2^8 (the fp16 route, without its x 2^8).
static inline __m512 fp8x16_to_ps(__m128i bytes) {
  return _mm512_cvtph_ps(fp8_as_scaled_f16(_mm256_cvtepi8_epi16(bytes)));
}

// What the loads below give, over the element's value (few_rows::kLoadScale:
// fp8 e4m3 as value / 2^8; the products put the 2^8 back once per pass's
// score sums and per 32-key chunk's P, two multiplies per 32 elements fewer).
using few_rows::kLoadScale;

// 16 contiguous elements of kType at src as fp32, in order (int8 and fp8
// without their scale; fp8 divided by kLoadScale).
template <DType kType>
static inline __m512 load16(const char* src) {
  if constexpr (kType == DType::f32) {
    return _mm512_loadu_ps(src);
  } else if constexpr (kType == DType::i8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
  } else if constexpr (kType == DType::f8_e4m3) {
    return fp8x16_to_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    if constexpr (kType == DType::f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// The same for the lanes of `mask` (the others 0; masked lanes are not read).
template <DType kType>
static inline __m512 load16_masked(const char* src, __mmask16 mask) {
  if constexpr (kType == DType::f32) {
    return _mm512_maskz_loadu_ps(mask, src);
  } else if constexpr (kType == DType::i8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, src)));
  } else if constexpr (kType == DType::f8_e4m3) {
    return fp8x16_to_ps(_mm_maskz_loadu_epi8(mask, src));
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, src);
    if constexpr (kType == DType::f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// 32 elements as two fp32 vectors in "chunk order": for bf16 the even and the
// odd elements (one load, a shift and an and), else elements 0..15 and 16..31.
template <DType kType>
static inline void load32(const char* src, __m512& lo, __m512& hi) {
  if constexpr (kType == DType::bf16) {
    const __m512i x = _mm512_loadu_si512(src);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(int(0xffff0000u))));
  } else if constexpr (kType == DType::f8_e4m3) {
    // 32 bytes in one: sign-extend to 16 bits, the fp16 bits, two conversions.
    const __m512i h =
        fp8_as_scaled_f16(_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
    lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  } else {
    lo = load16<kType>(src);
    hi = load16<kType>(src + 16 * kSize<kType>);
  }
}

// fp32 elements 0..15 (a) and 16..31 (b) to chunk order and back.
template <bool kChunkOrder>
static inline void to_chunk_order(__m512& a, __m512& b) {
  if constexpr (kChunkOrder) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512 e = _mm512_permutex2var_ps(a, even, b);
    b = _mm512_permutex2var_ps(a, odd, b);
    a = e;
  }
}
template <bool kChunkOrder>
static inline void from_chunk_order(__m512& a, __m512& b) {
  if constexpr (kChunkOrder) {
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512 x = _mm512_permutex2var_ps(a, first, b);
    b = _mm512_permutex2var_ps(a, second, b);
    a = x;
  }
}

// How P V reads V rows of kType (the default policy): in chunk order where
// load32 gives it (bf16), else in order. Another policy (E4m3Loads: e4m3 on
// byte permutes, e4m3_permutes.hpp) may also read 64 elements at once
// (load64: two chunks, chunk order).
template <DType kType>
struct Loads {
  static constexpr bool kChunkOrder = kType == DType::bf16;
  static constexpr float kScale = kLoadScale<kType>;  // loaded values x kScale = the elements
  void load32(const char* src, __m512& lo, __m512& hi) const { few_rows16::load32<kType>(src, lo, hi); }
  __m512 load16(const char* src) const { return few_rows16::load16<kType>(src); }
  __m512 load16_masked(const char* src, __mmask16 mask) const {
    return few_rows16::load16_masked<kType>(src, mask);
  }
};

// Keys scored per pass: M x KJ <= 16 accumulator chains, every one an
// independent FMA chain (2 FMA pipes x 4 cycles of latency need >= 8).
template <int M>
constexpr int kKeysPerPass = M == 1 ? 8 : 16 / M;
// P V: accumulator vectors per row and column pass (a power of two, so
// whole 32-element chunks); M x NV <= 16.
template <int M>
constexpr int kVectorsPerPass = M == 1 ? 16 : M == 2 ? 8 : M <= 4 ? 4 : 2;

constexpr int64_t kKeysPerChunk = 32;  // P V: keys whose V rows stay in L1 across column passes

// One pass of the few-rows scores: keys [c0, c0 + cn), cn <= KJ, their rows
// (a partial pass repeats its last row; those lanes are not stored), and the
// pass's share of the next step's prefetches that each 32-element chunk of
// the d32 whole ones issues: a few keys per chunk, not all at the pass's
// start (few_rows16::scores has the measurement).
template <int KJ>
struct ScorePass {
  int64_t c0, cn, keys_per_chunk;
  const char* rows[KJ];
  ScorePass(const void* const* key_rows, int64_t n, int64_t first, int64_t d32)
      : c0(first), cn(n - first < KJ ? n - first : KJ) {
    const int64_t chunks = d32 / 32 > 0 ? d32 / 32 : 1;
    keys_per_chunk = (cn + chunks - 1) / chunks;
    for (int j = 0; j < KJ; ++j) rows[j] = static_cast<const char*>(key_rows[c0 + (j < cn ? j : cn - 1)]);
  }
  // The keys whose rows `prefetch` asks for with `count` chunks from element t.
  template <class Prefetch>
  void prefetch_chunks(const Prefetch& prefetch, int64_t t, int64_t count) const {
    const int64_t first = c0 + t / 32 * keys_per_chunk, last = first + count * keys_per_chunk;
    prefetch(first, last < c0 + cn ? last : c0 + cn);
  }
};

// s[r, c] = q[r, :d] . key_rows[c][:d] for r < M, c < n (contiguous rows),
// keys read through `load` (Loads<kType> by default; a policy with load64
// takes 64 elements per step where it can); prefetches the rows of `ahead`
// (one K row and one V row per key scored, as the AVX2 product does; see
// there and mainloop.hpp).
template <DType kType, int M, class Load = Loads<kType>>
static void scores(int64_t n, int64_t d, const float* q, int64_t ldq, const void* const* key_rows,
                   float* s, int64_t lds, const RowsToPrefetch& ahead, const Load& load = {}) {
  constexpr int KJ = kKeysPerPass<M>;
  constexpr int64_t kS = kSize<kType>;
  const int64_t d32 = d / 32 * 32, d16 = d / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (d - d16)) - 1u);
  // q once per tile: chunk order over [0, d32), then in order, zero past d.
  alignas(64) float qc[M][tileattn::kMaxHeadDim];  // (M, head_dim) Q rows
  for (int r = 0; r < M; ++r) {
    const float* qr = q + r * ldq;
    for (int64_t t = 0; t < d32; t += 32) {
      __m512 a = _mm512_loadu_ps(qr + t), b = _mm512_loadu_ps(qr + t + 16);
      to_chunk_order<Load::kChunkOrder>(a, b);  // K's order (load32)
      _mm512_store_ps(qc[r] + t, a);
      _mm512_store_ps(qc[r] + t + 16, b);
    }
    for (int64_t t = d32; t < d16; t += 16) _mm512_store_ps(qc[r] + t, _mm512_loadu_ps(qr + t));
    if (tail) _mm512_store_ps(qc[r] + d16, _mm512_maskz_loadu_ps(tail, qr + d16));
  }
  // The rows of `ahead` with index i in [i0, i1): all their lines.
  const auto prefetch = [&](int64_t i0, int64_t i1) { prefetch_rows<true>(ahead, i0, i1, d * kS); };
  // A pass's keys' prefetches go out a few keys per 32-element chunk, not
  // all at its start: against the burst, Llama-3-8B decode (8192 tokens,
  // bf16, 2 threads, paired) took 0.93-0.97 of the time with K/V in L3 and
  // the same cold. (Until 2026-12-01 this lambda's prefetches were compiled
  // away, see prefetch_line; the measurements before then saw none.)
  for (int64_t c0 = 0; c0 < n; c0 += KJ) {
    const ScorePass<KJ> pass(key_rows, n, c0, d32);
    const int64_t cn = pass.cn;
    const char* const* rows = pass.rows;
    if (d32 == 0) prefetch(c0, c0 + cn);
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    // This chunk's keys' prefetches, or both chunks' of a 64-element step.
    const auto prefetch_chunks = [&](int64_t t, int64_t count) { pass.prefetch_chunks(prefetch, t, count); };
    int64_t t = 0;
    constexpr bool kWide = requires(__m512 v) { load.load64(rows[0], v, v, v, v); };
    if constexpr (kWide)
      for (; t + 64 <= d32; t += 64) {
        prefetch_chunks(t, 2);
        for (int j = 0; j < KJ; ++j) {
          __m512 v[4];
          load.load64(rows[j] + t * kS, v[0], v[1], v[2], v[3]);
          for (int r = 0; r < M; ++r)
            for (int u = 0; u < 4; ++u)
              acc[r * KJ + j] = _mm512_fmadd_ps(_mm512_load_ps(qc[r] + t + 16 * u), v[u], acc[r * KJ + j]);
        }
      }
    for (; t < d32; t += 32) {
      prefetch_chunks(t, 1);
      for (int j = 0; j < KJ; ++j) {
        __m512 lo, hi;
        load.load32(rows[j] + t * kS, lo, hi);
        for (int r = 0; r < M; ++r) {
          acc[r * KJ + j] = _mm512_fmadd_ps(_mm512_load_ps(qc[r] + t), lo, acc[r * KJ + j]);
          acc[r * KJ + j] = _mm512_fmadd_ps(_mm512_load_ps(qc[r] + t + 16), hi, acc[r * KJ + j]);
        }
      }
    }
    for (int64_t t = d32; t < d16; t += 16)
      for (int j = 0; j < KJ; ++j) {
        const __m512 k = load.load16(rows[j] + t * kS);
        for (int r = 0; r < M; ++r)
          acc[r * KJ + j] = _mm512_fmadd_ps(_mm512_load_ps(qc[r] + t), k, acc[r * KJ + j]);
      }
    if (tail)
      for (int j = 0; j < KJ; ++j) {
        const __m512 k = load.load16_masked(rows[j] + d16 * kS, tail);
        for (int r = 0; r < M; ++r)
          acc[r * KJ + j] = _mm512_fmadd_ps(_mm512_load_ps(qc[r] + d16), k, acc[r * KJ + j]);
      }
    __m512 sums = reduce16(acc);
    if constexpr (Load::kScale != 1.0f) sums = _mm512_mul_ps(sums, _mm512_set1_ps(Load::kScale));
    store_sums<M, KJ>(sums, s, lds, c0, cn);
  }
}

// acc[r, t, t + 16 NVP) += sum_{c in [c0, c1)} p[r, c - c0] value_rows[c][t, ...):
// one column pass. Even NVP: whole 32-element chunks, in `load`'s order
// (Load::kChunkOrder: chunk order); NVP = 1 with kMasked: the lanes of
// `last` only. kAsk: key c also asks for the lines of next.rows[c] that
// hold this pass's columns.
template <DType kType, int M, int NVP, bool kMasked = false, bool kAsk = false, class Load>
static inline void accumulate_pass(int64_t c0, int64_t c1, int64_t t, const float* p, int64_t ldp,
                                   const void* const* value_rows, float* acc, int64_t ldacc, const Load& load,
                                   __mmask16 last = 0xffff, NextRows next = {}) {
  static_assert(!kMasked || NVP == 1, "only a single vector is masked");
  constexpr bool kChunks = NVP % 2 == 0;
  constexpr bool kOrder = kChunks && Load::kChunkOrder;
  constexpr int64_t kS = kSize<kType>;
  __m512 o[M][NVP];
  for (int r = 0; r < M; ++r) {
    float* row = acc + r * ldacc + t;
    for (int u = 0; u < NVP; ++u)
      o[r][u] = kMasked ? _mm512_maskz_loadu_ps(last, row + 16 * u) : _mm512_loadu_ps(row + 16 * u);
    if constexpr (kChunks)
      for (int u = 0; u < NVP; u += 2) to_chunk_order<kOrder>(o[r][u], o[r][u + 1]);
  }
  for (int64_t c = c0; c < c1; ++c) {
    const char* row = static_cast<const char*>(value_rows[c]) + t * kS;
    __m512 v[NVP];
    if constexpr (kChunks && NVP % 4 == 0 && requires { load.load64(row, v[0], v[1], v[2], v[3]); }) {
      for (int u = 0; u < NVP; u += 4) load.load64(row + 16 * u * kS, v[u], v[u + 1], v[u + 2], v[u + 3]);
    } else if constexpr (kChunks) {
      for (int u = 0; u < NVP; u += 2) load.load32(row + 16 * u * kS, v[u], v[u + 1]);
    } else if constexpr (kMasked) {
      v[0] = load.load16_masked(row, last);
    } else {
      for (int u = 0; u < NVP; ++u) v[u] = load.load16(row + 16 * u * kS);
    }
    if constexpr (kAsk) ask_next_row(next, c, t * kS, 16 * NVP * kS);
    for (int r = 0; r < M; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * ldp + (c - c0)]);
      for (int u = 0; u < NVP; ++u) o[r][u] = _mm512_fmadd_ps(pr, v[u], o[r][u]);
    }
  }
  for (int r = 0; r < M; ++r) {
    if constexpr (kChunks)
      for (int u = 0; u < NVP; u += 2) from_chunk_order<kOrder>(o[r][u], o[r][u + 1]);
    float* row = acc + r * ldacc + t;
    for (int u = 0; u < NVP; ++u) {
      if constexpr (kMasked) _mm512_mask_storeu_ps(row + 16 * u, last, o[r][u]);
      else _mm512_storeu_ps(row + 16 * u, o[r][u]);
    }
  }
}

// accumulate's body; kAsk: next.count > 0.
template <DType kType, int M, bool kAsk, class Load>
static void accumulate_asking(int64_t n, int64_t d, const float* p, int64_t ldp, const void* const* value_rows,
                              float* acc, int64_t ldacc, const Load& load, NextRows next) {
  constexpr int NV = kVectorsPerPass<M>;
  const int64_t d16 = d / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (d - d16)) - 1u);
  // Loads that divide V by Load::kScale take P times it: a chunk's P scaled
  // once into p_scaled (the passes take P from the chunk's first key).
  constexpr bool kScaledP = Load::kScale != 1.0f;
  alignas(64) float p_scaled[kScaledP ? M : 1][kScaledP ? kKeysPerChunk : 1];
  for (int64_t c0 = 0; c0 < n; c0 += kKeysPerChunk) {
    const int64_t c1 = n - c0 < kKeysPerChunk ? n : c0 + kKeysPerChunk;
    if constexpr (kScaledP) {
      for (int r = 0; r < M; ++r)
        for (int64_t j = 0; j < c1 - c0; j += 16) {
          const __mmask16 keys = tail_mask(c1 - c0 - j);
          _mm512_mask_storeu_ps(p_scaled[r] + j, keys,
                                _mm512_mul_ps(_mm512_maskz_loadu_ps(keys, p + r * ldp + c0 + j),
                                              _mm512_set1_ps(Load::kScale)));
        }
    }
    const float* pc = kScaledP ? &p_scaled[0][0] : p + c0;  // key c0 + j of row r at pc[r * ldc + j]
    const int64_t ldc = kScaledP ? kKeysPerChunk : ldp;
    int64_t t = 0;
    for (; t + 16 * NV <= d; t += 16 * NV)
      accumulate_pass<kType, M, NV, false, kAsk>(c0, c1, t, pc, ldc, value_rows, acc, ldacc, load, 0xffff, next);
    // What is left is < 16 NV columns (NV a power of two): each narrower
    // pass runs at most once.
    if constexpr (NV > 8)
      if (t + 128 <= d)
        accumulate_pass<kType, M, 8, false, kAsk>(c0, c1, t, pc, ldc, value_rows, acc, ldacc, load, 0xffff, next),
            t += 128;
    if constexpr (NV > 4)
      if (t + 64 <= d)
        accumulate_pass<kType, M, 4, false, kAsk>(c0, c1, t, pc, ldc, value_rows, acc, ldacc, load, 0xffff, next),
            t += 64;
    if constexpr (NV > 2)
      if (t + 32 <= d)
        accumulate_pass<kType, M, 2, false, kAsk>(c0, c1, t, pc, ldc, value_rows, acc, ldacc, load, 0xffff, next),
            t += 32;
    if (t + 16 <= d)
      accumulate_pass<kType, M, 1, false, kAsk>(c0, c1, t, pc, ldc, value_rows, acc, ldacc, load, 0xffff, next),
          t += 16;
    if (tail) accumulate_pass<kType, M, 1, true, kAsk>(c0, c1, t, pc, ldc, value_rows, acc, ldacc, load, tail, next);
  }
}

// acc[r, :d] += sum_c p[r, c] value_rows[c][:d] for r < M, c < n (contiguous
// rows), V read through `load` (Loads<kType> by default); with next.count > 0
// each key also asks for its share of the next step's V rows (NextRows).
template <DType kType, int M, class Load = Loads<kType>>
static void accumulate(int64_t n, int64_t d, const float* p, int64_t ldp, const void* const* value_rows,
                       float* acc, int64_t ldacc, const Load& load = {}, NextRows next = {}) {
  if (next.count > 0) return accumulate_asking<kType, M, true>(n, d, p, ldp, value_rows, acc, ldacc, load, next);
  accumulate_asking<kType, M, false>(n, d, p, ldp, value_rows, acc, ldacc, load, next);
}

}  // namespace few_rows16

#include "isa/avx512/e4m3_permutes.hpp"

// The few-rows products of the AVX-512 main loop (same interface as the AVX2
// FewRowsKernels). Kernels derives from this. An fp8 e4m3 cache read with
// unit stride converts through bf16 on byte permutes where CPUID has
// AVX512-VBMI (E4m3Loads; compiled in few_rows_vbmi.cpp, which alone has the
// flag), else through fp16 (Loads<f8_e4m3>): Llama-3-8B decode on an Intel
// Xeon without AMX, 0.92-0.95 of the time hot, 0.97-0.98 cold (docs/
// inference.md, "fp8 on byte permutes in the FMA products").
struct FewRows16Kernels {
  static constexpr int kFewRowsMax = 8;
  static_assert(kFewRowsMax == few_rows::kDispatchedRows, "with_rows must reach every row count");

  static bool e4m3_on_permutes() {
#ifdef TILEATTN_E4M3_PERMUTES
    return true;
#else
    return cpu_features().avx512_vbmi;
#endif
  }

  static void few_rows_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                              const void* const* key_rows, DType dtype, int64_t stride, float* s,
                              int64_t lds, const RowsToPrefetch& ahead = {}) {
    if (stride != 1) return few_rows::scores_strided(m, n, d, q, ldq, key_rows, dtype, stride, s, lds);
    if (dtype == DType::f8_e4m3 && e4m3_on_permutes()) {
#ifdef TILEATTN_E4M3_PERMUTES
      const few_rows16::E4m3Loads load{};
      auto run = [&]<DType kType, int M>() {
        few_rows16::scores<kType, M>(n, d, q, ldq, key_rows, s, lds, ahead, load);
      };
      return few_rows::with_rows<DType::f8_e4m3>(m, run);
#else
      return few_rows_scores_e4m3(m, n, d, q, ldq, key_rows, s, lds, ahead);
#endif
    }
    few_rows::with_type_and_rows(dtype, m, [&]<DType kType, int M>() {
      few_rows16::scores<kType, M>(n, d, q, ldq, key_rows, s, lds, ahead);
    });
  }

  // Few-rows scores of an int8 cache on AVX512-VNNI (few_rows_vnni.hpp), in
  // the opt-in of reduced precision (bf16_probabilities, bf16 queries) where
  // CPUID has VNNI: the main loop rounds a work item's query rows to 16-bit
  // integers once (few_rows_int8_split; rows of q16_row_stride(d), one step
  // each) and scores keys on vpdpwssd. Not by default: Q's rounding moves the LSE by
  // more than the accuracy rule allows (docs/inference.md, "int8 scores on
  // VNNI", with the measurements).
  static constexpr bool kFewRowsInt8Scores = true;
  static bool few_rows_int8_usable(DType query, bool bf16_probabilities, int64_t /*d: any*/) {
    return bf16_probabilities && query == DType::bf16 && cpu_features().avx512_vnni;
  }
  static int64_t few_rows_q16_stride(int64_t d) { return q16_row_stride(d); }
  static bool few_rows_int8_split(int64_t m, int64_t d, const float* q, int64_t ldq, int16_t* q16,
                                  float* steps) {
    return few_rows_split_q16(m, d, q, ldq, q16, q16_row_stride(d), steps, 1);
  }
  static void few_rows_int8_scores(int64_t m, int64_t n, int64_t d, const int16_t* q16, const float* steps,
                                   const void* const* key_rows, float* s, int64_t lds,
                                   const RowsToPrefetch& ahead = {}) {
    few_rows_int8_scores_vnni(m, n, d, q16, q16_row_stride(d), steps, 1, key_rows, s, lds, ahead);
  }
  // Decode P V of an int8 cache with bf16_probabilities, where CPUID has VNNI:
  // P rounded to 16-bit integers (one step per row and 32 keys) on vpdpwssd
  // (few_rows_vnni.hpp). The avx512bf16 rung takes it too (Bf16DotKernels::
  // few_rows_dot_int8_on_vnni); the amx rung's take hides it (fp32 P).
  static constexpr bool kFewRowsDotProbabilities = true;
  static bool few_rows_dot_probabilities_take(DType value_type) {
    return value_type == DType::i8 && cpu_features().avx512_vnni;
  }
  // It asks for the next step's K rows itself (few_rows_vnni.hpp), where the
  // main loop then leaves them out of the scores' prefetches.
  static bool few_rows_dot_accumulate_prefetches_k(DType value_type) {
    return few_rows_dot_probabilities_take(value_type);
  }
  static void few_rows_dot_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                      const void* const* value_rows, DType /*value_type: i8*/, float* acc,
                                      int64_t ldacc, const RowsToPrefetch& ahead) {
    few_rows_int8_accumulate_vnni(m, n, d, p, ldp, value_rows, acc, ldacc, ahead);
  }

  // `next`: the next step's V rows (next.v_rows, next.v_count) that the
  // product asks for toward L2 as it goes, where the main loop chooses so
  // (decode_pv_asks_next_v; unit element stride).
  static constexpr bool kFewRowsAccumulateAsksNextV = true;
  static void few_rows_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                  const void* const* value_rows, DType dtype, int64_t stride,
                                  float* acc, int64_t ldacc, const RowsToPrefetch& next = {}) {
    if (stride != 1)
      return few_rows::accumulate_strided(m, n, d, p, ldp, value_rows, dtype, stride, acc, ldacc);
    const NextRows ahead = NextRows::values_of(next);
    if (dtype == DType::f8_e4m3 && e4m3_on_permutes()) {
#ifdef TILEATTN_E4M3_PERMUTES
      const few_rows16::E4m3Loads load{};
      auto run = [&]<DType kType, int M>() {
        few_rows16::accumulate<kType, M>(n, d, p, ldp, value_rows, acc, ldacc, load, ahead);
      };
      return few_rows::with_rows<DType::f8_e4m3>(m, run);
#else
      return few_rows_accumulate_e4m3(m, n, d, p, ldp, value_rows, acc, ldacc, next);
#endif
    }
    few_rows::with_type_and_rows(dtype, m, [&]<DType kType, int M>() {
      few_rows16::accumulate<kType, M>(n, d, p, ldp, value_rows, acc, ldacc, {}, ahead);
    });
  }
};
