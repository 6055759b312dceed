// AVX2 tile products for a few stacked query rows (decode: the query heads of
// one GQA group, one new token each). The packed path converts and transposes
// every K/V tile into fp32 before a register-blocked GEMM; with 1..8 rows that
// packing costs as much as the product. Here K and V rows are read straight
// from the source (contiguous cache, page, or any row table) and converted
// to fp32 in registers, each converted vector shared by all the rows; the
// score product also prefetches the next tile's rows as it goes.
//
// Written once, compiled once per ISA that uses it: every AVX-512 CPU has
// AVX2, FMA and F16C, so the AVX-512 path reuses these products. Like
// core/mainloop.hpp this file has no namespace and no includes of its own: it
// is included INSIDE namespace tileattn::detail::<isa> (avx2/kernels.hpp,
// avx512/kernels.hpp), after <immintrin.h>, <cstdint>, "core/half.hpp" and
// "tileattn/types.hpp". Each copy is then a distinct symbol compiled with its
// own ISA's flags; one shared namespace would give the AVX2 and AVX-512
// translation units the same inline (COMDAT) functions, and the linker could
// keep the AVX-512-compiled copy for the AVX2 path. Needs -mavx2 -mfma -mf16c.

namespace few_rows {

template <DType kType>
constexpr int64_t kElementSize = kType == DType::f32 ? 4 : kType == DType::i8 || kType == DType::f8_e4m3 ? 1 : 2;

// 8 fp8 e4m3 values, sign-extended to 16-bit lanes, as the fp16 bits of
// value / 2^8: shifted left by 7 the exponent and mantissa land in fp16's
// fields (e4m3's bias 7 against fp16's 15: the value comes out 2^-8 of
// itself, subnormals included) and the sign (replicated by the extension) in
// bits 14 and 15, of which the and keeps 15; S.1111.111 (NaN) then gets an
// all-ones exponent. Scaled by 2^8 after the conversion to fp32 (exact), this
// gives f8e4m3_to_float's bits (half.hpp), NaN payload included. Three
// operations and the NaN test (three more) per vector of 16-bit lanes.
static inline __m128i fp8_as_scaled_f16(__m128i x) {
  const __m128i h = _mm_and_si128(_mm_slli_epi16(x, 7), _mm_set1_epi16(int16_t(0xbf80)));
  const __m128i fields = _mm_set1_epi16(0x3f80);
  const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, fields), fields);
  return _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7c00)));
}

// What load8 / load16 give, over the element's value: fp8 e4m3 comes as
// value / 2^8 (exactly), and the products put the 2^8 back once, on a pass's
// score sums and on a 32-key chunk's P, instead of once per 8 elements.
// Powers of two, so the sums are those of the true values bit for bit (short
// of products below fp32's normal range); the element-by-element column
// tails read exact values (load_element) and take P and the sums unscaled.
template <DType kType>
constexpr float kLoadScale = kType == DType::f8_e4m3 ? 256.0f : 1.0f;

// 8 contiguous elements of kType at src as fp32 (int8 and fp8 without their
// scale; fp8 divided by kLoadScale).
template <DType kType>
static inline __m256 load8(const char* src) {
  if constexpr (kType == DType::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(src));
  } else if constexpr (kType == DType::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  } else if constexpr (kType == DType::i8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src))));
  } else if constexpr (kType == DType::f8_e4m3) {
    const __m128i bytes = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
    return _mm256_cvtph_ps(fp8_as_scaled_f16(bytes));
  } else {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
}

// Lane c of the result = horizontal sum of v[c]: eight dot products finished
// with 6 hadds and one cross-lane add instead of eight separate reductions.
static inline __m256 sum_each(const __m256* v) {
  const __m256 t01 = _mm256_hadd_ps(v[0], v[1]), t23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t45 = _mm256_hadd_ps(v[4], v[5]), t67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t01, t23), u1 = _mm256_hadd_ps(t45, t67);
  // u0 = [v0..v3 low-half sums | v0..v3 high-half sums], u1 the same for v4..v7.
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// 16 elements as two fp32 vectors in "chunk order". fp32 and fp16: elements
// 0..7 and 8..15. bf16: the even and the odd elements, which one 256-bit
// load yields with one shift and one and (a bf16 is the top half of its
// fp32), instead of two widening loads and two shifts.
template <DType kType>
static inline void load16(const char* src, __m256& lo, __m256& hi) {
  if constexpr (kType == DType::bf16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(int(0xffff0000u))));
  } else {
    lo = load8<kType>(src);
    hi = load8<kType>(src + 8 * kElementSize<kType>);
  }
}

// fp32 elements 0..7 (a) and 8..15 (b) to chunk order and back.
template <DType kType>
static inline void to_chunk_order(__m256& a, __m256& b) {
  if constexpr (kType == DType::bf16) {
    const __m256 even = _mm256_shuffle_ps(a, b, 0x88);  // a0 a2 b0 b2 | a4 a6 b4 b6
    const __m256 odd = _mm256_shuffle_ps(a, b, 0xdd);   // a1 a3 b1 b3 | a5 a7 b5 b7
    a = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xd8));
    b = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xd8));
  }
}
template <DType kType>
static inline void from_chunk_order(__m256& a, __m256& b) {
  if constexpr (kType == DType::bf16) {
    const __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
    a = _mm256_permute2f128_ps(lo, hi, 0x20);
    b = _mm256_permute2f128_ps(lo, hi, 0x31);
  }
}

// Register blocking, so that accumulators + loaded vectors fit the 16 ymm
// registers and at least 6 independent FMA chains hide the FMA latency.
template <int M>
constexpr int kKeysPerPass = M == 1 ? 4 : M == 2 ? 2 : 1;  // scores: keys sharing q loads
template <int M>
constexpr int kChainsPerRow = M >= 2 && M <= 4 ? 2 : 1;  // scores: accumulators per (row, key)
template <int M>
constexpr int kChunksPerPass = M <= 2 ? 2 : 1;  // P V (M <= 4): 16-column chunks per pass

constexpr int64_t kKeysPerChunk = 32;  // P V: keys whose V rows stay in L1 across column passes

// s[r, c] = q[r, :d] . key_rows[c][:d] for r < M, c < n (contiguous rows).
// Meanwhile the rows of `ahead` are prefetched toward L1, one K row and one
// V row per key scored (which V rows: mainloop.hpp). Spread over
// the tile this way, the prefetches keep the memory stream busy without the
// burst of a whole tile at once (CPU time at 8192 tokens, one thread:
// contiguous -25..30%, paged -30%, against no software prefetch and a
// whole-tile burst respectively). One key at a time, not eight keys' rows
// per group of eight: a decode step at 8192 cached tokens (bf16, 32/8 heads)
// took 23-25% less time, contiguous and paged (page 16), 1 and 2 threads, 4%
// less with the cache in L3 (paired medians of 20-40 interleaved calls,
// caches evicted between calls). 64 prefetches at once overflow the core's
// miss buffers; with a contiguous cache the hardware prefetcher had covered
// part of what was lost, with 4 KB pages nothing did (paged ran 0.77 of
// contiguous). Toward L1 (T0) rather than L2 (T1): within the noise with
// this spread; 3-4.5% less time with the burst.
template <DType kType, int M>
static void scores(int64_t n, int64_t d, const float* q, int64_t ldq, const void* const* key_rows,
                   float* s, int64_t lds, const RowsToPrefetch& ahead) {
  constexpr int KJ = kKeysPerPass<M>, S = kChainsPerRow<M>;
  constexpr int64_t kSize = kElementSize<kType>;
  const int64_t d16 = d / 16 * 16, d8 = d / 8 * 8;
  // q over [0, d16) in chunk order, once per tile.
  alignas(32) float qc[M][tileattn::kMaxHeadDim];  // (M, head_dim) Q rows
  for (int r = 0; r < M; ++r)
    for (int64_t t = 0; t < d16; t += 16) {
      __m256 a = _mm256_loadu_ps(q + r * ldq + t), b = _mm256_loadu_ps(q + r * ldq + t + 8);
      to_chunk_order<kType>(a, b);
      _mm256_store_ps(qc[r] + t, a);
      _mm256_store_ps(qc[r] + t + 8, b);
    }
  for (int64_t c0 = 0; c0 < n; c0 += 8) {
    const int64_t cn = n - c0 < 8 ? n - c0 : 8;
    // A partial group repeats its last row; those lanes are not stored.
    const char* rows[8];
    for (int i = 0; i < 8; ++i) rows[i] = static_cast<const char*>(key_rows[c0 + (i < cn ? i : cn - 1)]);
    __m256 partial[M][8];
    for (int k0 = 0; k0 < 8; k0 += KJ) {
      prefetch_rows<true>(ahead, c0 + k0, c0 + k0 + KJ, d * kSize);
      __m256 acc[M][KJ][S];
      for (int r = 0; r < M; ++r)
        for (int j = 0; j < KJ; ++j)
          for (int h = 0; h < S; ++h) acc[r][j][h] = _mm256_setzero_ps();
#pragma GCC unroll 2
      for (int64_t t = 0; t < d16; t += 16) {
        __m256 lo[KJ], hi[KJ];
        for (int j = 0; j < KJ; ++j) load16<kType>(rows[k0 + j] + t * kSize, lo[j], hi[j]);
        for (int r = 0; r < M; ++r) {
          const __m256 q_lo = _mm256_load_ps(qc[r] + t), q_hi = _mm256_load_ps(qc[r] + t + 8);
          for (int j = 0; j < KJ; ++j) {
            acc[r][j][0] = _mm256_fmadd_ps(q_lo, lo[j], acc[r][j][0]);
            acc[r][j][S - 1] = _mm256_fmadd_ps(q_hi, hi[j], acc[r][j][S - 1]);
          }
        }
      }
      if (d16 < d8) {  // one 8-element block in natural order
        for (int j = 0; j < KJ; ++j) {
          const __m256 k = load8<kType>(rows[k0 + j] + d16 * kSize);
          for (int r = 0; r < M; ++r)
            acc[r][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * ldq + d16), k, acc[r][j][0]);
        }
      }
      for (int r = 0; r < M; ++r)
        for (int j = 0; j < KJ; ++j)
          partial[r][k0 + j] = S == 2 ? _mm256_add_ps(acc[r][j][0], acc[r][j][S - 1]) : acc[r][j][0];
    }
    for (int r = 0; r < M; ++r) {
      __m256 sums = sum_each(partial[r]);
      if constexpr (kLoadScale<kType> != 1.0f) sums = _mm256_mul_ps(sums, _mm256_set1_ps(kLoadScale<kType>));
      if (d8 < d) {  // head_dim not a multiple of 8: the last elements one by one
        alignas(32) float tail[8] = {};
        for (int64_t i = 0; i < cn; ++i)
          for (int64_t t = d8; t < d; ++t)
            tail[i] += q[r * ldq + t] * load_element(rows[i], int(kType), t);
        sums = _mm256_add_ps(sums, _mm256_load_ps(tail));
      }
      float* out = s + r * lds + c0;
      if (cn == 8) {
        _mm256_storeu_ps(out, sums);
      } else {
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, sums);
        for (int64_t i = 0; i < cn; ++i) out[i] = lanes[i];
      }
    }
  }
}

// acc[r, :d] += sum_c p[r, c] value_rows[c][:d] for r < M, c < n (contiguous rows).
template <DType kType, int M>
static void accumulate(int64_t n, int64_t d, const float* p, int64_t ldp, const void* const* value_rows,
                       float* acc, int64_t ldacc) {
  constexpr int64_t kSize = kElementSize<kType>;
  const int64_t d8 = d / 8 * 8;
  // Loads that divide V by kLoadScale take P times it: a chunk's P scaled
  // once into p_scaled for the vector columns (pv: key c0 + j of row r at
  // pv[r * ldv + j]); the element-by-element tail keeps p.
  constexpr bool kScaledP = kLoadScale<kType> != 1.0f;
  alignas(32) float p_scaled[kScaledP ? M : 1][kScaledP ? kKeysPerChunk : 1];
  for (int64_t c0 = 0; c0 < n; c0 += kKeysPerChunk) {
    const int64_t c1 = n - c0 < kKeysPerChunk ? n : c0 + kKeysPerChunk;
    if constexpr (kScaledP)
      for (int r = 0; r < M; ++r)
        for (int64_t c = c0; c < c1; ++c) p_scaled[r][c - c0] = p[r * ldp + c] * kLoadScale<kType>;
    const float* pv = kScaledP ? &p_scaled[0][0] : p + c0;
    const int64_t ldv = kScaledP ? kKeysPerChunk : ldp;
    int64_t t = 0;
    if constexpr (M <= 4) {  // 16-column chunks: two vectors per (row, chunk)
      constexpr int P = kChunksPerPass<M>;
      for (; t + 16 * P <= d8; t += 16 * P) {
        __m256 o[M][2 * P];
        for (int r = 0; r < M; ++r)
          for (int u = 0; u < P; ++u) {
            o[r][2 * u] = _mm256_loadu_ps(acc + r * ldacc + t + 16 * u);
            o[r][2 * u + 1] = _mm256_loadu_ps(acc + r * ldacc + t + 16 * u + 8);
            to_chunk_order<kType>(o[r][2 * u], o[r][2 * u + 1]);
          }
#pragma GCC unroll 2
        for (int64_t c = c0; c < c1; ++c) {
          const char* row = static_cast<const char*>(value_rows[c]) + t * kSize;
          __m256 v[2 * P];
          for (int u = 0; u < P; ++u) load16<kType>(row + 16 * u * kSize, v[2 * u], v[2 * u + 1]);
          for (int r = 0; r < M; ++r) {
            const __m256 pr = _mm256_broadcast_ss(pv + r * ldv + (c - c0));
            for (int u = 0; u < 2 * P; ++u) o[r][u] = _mm256_fmadd_ps(pr, v[u], o[r][u]);
          }
        }
        for (int r = 0; r < M; ++r)
          for (int u = 0; u < P; ++u) {
            from_chunk_order<kType>(o[r][2 * u], o[r][2 * u + 1]);
            _mm256_storeu_ps(acc + r * ldacc + t + 16 * u, o[r][2 * u]);
            _mm256_storeu_ps(acc + r * ldacc + t + 16 * u + 8, o[r][2 * u + 1]);
          }
      }
    }
    for (; t < d8; t += 8) {  // 8-column blocks (all of them for M > 4), natural order
      __m256 o[M];
      for (int r = 0; r < M; ++r) o[r] = _mm256_loadu_ps(acc + r * ldacc + t);
      for (int64_t c = c0; c < c1; ++c) {
        const __m256 v = load8<kType>(static_cast<const char*>(value_rows[c]) + t * kSize);
        for (int r = 0; r < M; ++r) o[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(pv + r * ldv + (c - c0)), v, o[r]);
      }
      for (int r = 0; r < M; ++r) _mm256_storeu_ps(acc + r * ldacc + t, o[r]);
    }
    for (; t < d; ++t)  // head_dim not a multiple of 8
      for (int r = 0; r < M; ++r) {
        float sum = acc[r * ldacc + t];
        for (int64_t c = c0; c < c1; ++c) sum += p[r * ldp + c] * load_element(value_rows[c], int(kType), t);
        acc[r * ldacc + t] = sum;
      }
  }
}

// Strided rows (element stride != 1): plain loops, same results contract.
static inline void scores_strided(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                                  const void* const* key_rows, DType dtype, int64_t stride, float* s,
                                  int64_t lds) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      float sum = 0.0f;
      for (int64_t t = 0; t < d; ++t) sum += q[r * ldq + t] * load_element(key_rows[c], int(dtype), t * stride);
      s[r * lds + c] = sum;
    }
}

static inline void accumulate_strided(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                      const void* const* value_rows, DType dtype, int64_t stride,
                                      float* acc, int64_t ldacc) {
  for (int64_t c = 0; c < n; ++c)
    for (int64_t t = 0; t < d; ++t) {
      const float v = load_element(value_rows[c], int(dtype), t * stride);
      for (int64_t r = 0; r < m; ++r) acc[r * ldacc + t] += p[r * ldp + c] * v;
    }
}

constexpr int kDispatchedRows = 8;  // with_rows reaches M = 1..8

// Calls f.template operator()<kType, M>() for dtype's kType and M = m
// (1..kDispatchedRows; other m do nothing): the one place the products'
// template arguments are chosen, for this file's products and the AVX-512
// ones (isa/avx512/few_rows_kernels.hpp).
template <DType kType, class F>
static inline void with_rows(int64_t m, F& f) {
  switch (m) {
    case 1: f.template operator()<kType, 1>(); break;
    case 2: f.template operator()<kType, 2>(); break;
    case 3: f.template operator()<kType, 3>(); break;
    case 4: f.template operator()<kType, 4>(); break;
    case 5: f.template operator()<kType, 5>(); break;
    case 6: f.template operator()<kType, 6>(); break;
    case 7: f.template operator()<kType, 7>(); break;
    case 8: f.template operator()<kType, 8>(); break;
    default: break;
  }
}

template <class F>
static inline void with_type_and_rows(DType dtype, int64_t m, F&& f) {
  switch (dtype) {
    case DType::f32: with_rows<DType::f32>(m, f); break;
    case DType::f16: with_rows<DType::f16>(m, f); break;
    case DType::bf16: with_rows<DType::bf16>(m, f); break;
    case DType::i8: with_rows<DType::i8>(m, f); break;
    case DType::f8_e4m3: with_rows<DType::f8_e4m3>(m, f); break;
  }
}

}  // namespace few_rows

// The few-rows tile products the main loop uses when a work item stacks at
// most kFewRowsMax query rows (see mainloop.hpp). Kernels derives from this.
struct FewRowsKernels {
  static constexpr int kFewRowsMax = 8;
  static_assert(kFewRowsMax == few_rows::kDispatchedRows, "with_rows must reach every row count");

  // s[r * lds + c] = sum_t q[r * ldq + t] * key_rows[c][t * stride], r < m <= 8, c < n, t < d;
  // prefetches the rows of `ahead` on the way.
  static void few_rows_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                              const void* const* key_rows, DType dtype, int64_t stride, float* s,
                              int64_t lds, const RowsToPrefetch& ahead = {}) {
    if (stride != 1) return few_rows::scores_strided(m, n, d, q, ldq, key_rows, dtype, stride, s, lds);
    few_rows::with_type_and_rows(dtype, m, [&]<DType kType, int M>() {
      few_rows::scores<kType, M>(n, d, q, ldq, key_rows, s, lds, ahead);
    });
  }

  // acc[r * ldacc + t] += sum_c p[r * ldp + c] * value_rows[c][t * stride], r < m <= 8, c < n, t < d.
  static void few_rows_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                  const void* const* value_rows, DType dtype, int64_t stride,
                                  float* acc, int64_t ldacc) {
    if (stride != 1)
      return few_rows::accumulate_strided(m, n, d, p, ldp, value_rows, dtype, stride, acc, ldacc);
    few_rows::with_type_and_rows(dtype, m, [&]<DType kType, int M>() {
      few_rows::accumulate<kType, M>(n, d, p, ldp, value_rows, acc, ldacc);
    });
  }
};
