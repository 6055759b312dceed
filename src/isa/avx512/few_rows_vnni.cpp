// The few-rows decode products of an int8 cache on AVX512-VNNI, scores and
// P V (few_rows_vnni.hpp), which bf16_probabilities takes.
// This file alone of the directory gets -mavx512vnni (CMakeLists.txt), in a
// namespace of its own, so no other AVX-512 code can pick up VNNI
// instructions; FewRows16Kernels calls these only where CPUID has VNNI.
//
// The scores keep the FMA product's shape (few_rows16::scores): M x KJ
// accumulator chains per pass, one per (row, key), reduced together by
// reduce16, here on int32 lanes (exact). Per 32 elements of a key: one
// sign-extending load (vpmovsxbw) for all M rows and one vpdpwssd per row,
// where the FMA product takes two int8 -> fp32 conversions per 16 elements
// and two FMAs per row.
#define TILEATTN_AVX512_NAMESPACE avx512_vnni
#include "isa/avx512/kernels.hpp"
#include "isa/avx512/few_rows_vnni.hpp"

namespace tileattn::detail {
namespace avx512_vnni {
namespace {

// x x inverse rounded to nearest, ties to even (vcvtps2dq under the default
// MXCSR), clamped to [-limit, limit] (|x| x inverse exceeds limit only by
// inverse's rounding), as 16 int16: Q's and P's rounding alike.
static inline __m256i round_to_int16(__m512 x, __m512 inverse, int32_t limit) {
  const __m512i rounded = _mm512_cvtps_epi32(_mm512_mul_ps(x, inverse));
  const __m512i clamped =
      _mm512_max_epi32(_mm512_min_epi32(rounded, _mm512_set1_epi32(limit)), _mm512_set1_epi32(-limit));
  return _mm512_cvtepi32_epi16(clamped);
}

// acc += the word pair products of a and b (vpdpwssd), accumulated in place.
// GCC 12 compiles _mm512_dpwssd_epi32 on an array of accumulators with a
// register copy in and out of every one per use (two vmovdqa per vpdpwssd
// in both loops below, some through the stack), which took port 0 and 5
// slots from the products; the "+v" operand keeps each sum in its register.
// Intel Xeon model 207, Llama-3-8B decode of an int8 cache (8192 tokens,
// bf16_probabilities, in cache, one thread, paired): 0.92-0.94 of the time;
// cold on two threads unchanged (the step waits on memory there).
static inline void dpwssd(__m512i& acc, __m512i a, __m512i b) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

// reduce16's adds on int32 lanes (the vectors carry int32 bits).
struct AddEpi32 {
  __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
};

template <int M>
void int8_scores(int64_t n, int64_t d, const int16_t* q16, int64_t ldq16, const float* steps, int64_t step_stride,
                 const void* const* key_rows, float* s, int64_t lds, const RowsToPrefetch& ahead) {
  constexpr int KJ = few_rows16::kKeysPerPass<M>;
  const int64_t d32 = d / 32 * 32;
  const __mmask32 tail = static_cast<__mmask32>((uint64_t(1) << (d - d32)) - 1u);
  // Lane r * KJ + j of a pass's sums belongs to row r: its step.
  alignas(64) float lane_steps[16] = {};
  for (int r = 0; r < M; ++r)
    for (int j = 0; j < KJ; ++j) lane_steps[r * KJ + j] = steps[r * step_stride];
  const __m512 step_lanes = _mm512_load_ps(lane_steps);
  const auto prefetch = [&](int64_t i0, int64_t i1) { prefetch_rows<true>(ahead, i0, i1, d); };
  for (int64_t c0 = 0; c0 < n; c0 += KJ) {
    // The keys, their rows and their prefetches as in the FMA scores.
    const few_rows16::ScorePass<KJ> pass(key_rows, n, c0, d32);
    const int64_t cn = pass.cn;
    const char* const* rows = pass.rows;
    if (d32 == 0) prefetch(c0, c0 + cn);
    __m512i acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_si512();
    for (int64_t t = 0; t < d32; t += 32) {
      pass.prefetch_chunks(prefetch, t, 1);
      for (int j = 0; j < KJ; ++j) {
        const __m512i k = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + t)));
        for (int r = 0; r < M; ++r)
          dpwssd(acc[r * KJ + j], _mm512_loadu_si512(q16 + r * ldq16 + t), k);
      }
    }
    if (tail)
      for (int j = 0; j < KJ; ++j) {
        const __m512i k = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(tail, rows[j] + d32));
        for (int r = 0; r < M; ++r)
          dpwssd(acc[r * KJ + j], _mm512_loadu_si512(q16 + r * ldq16 + d32), k);
      }
    __m512 lanes[16];
    for (int i = 0; i < 16; ++i) lanes[i] = _mm512_castsi512_ps(acc[i]);
    const __m512i sums = _mm512_castps_si512(reduce16(lanes, AddEpi32{}));
    store_sums<M, KJ>(_mm512_mul_ps(_mm512_cvtepi32_ps(sums), step_lanes), s, lds, c0, cn);
  }
}

// P V: acc[r, :d] += sum_c p[r, c] value_rows[c][:d] with P rounded to
// 16-bit integers, one step per (row, 32-key chunk): p ~ step x p16, step =
// max_c |p[r, c]| / 32767 over the chunk. A pair of keys (c, c + 1) takes one
// vpdpwssd per row and 16 columns: their V rows, sign-extended to 16 bits and
// interleaved by word (vpunpck{l,h}wd: per 128-bit lane, columns 0-3 into the
// low result and 4-7 into the high one), against the dword (p16[c], p16[c +
// 1]) broadcast. The int32 sums of a chunk (|sum| <= 32 x 32767 x 128 < 2^31)
// convert once, times the step, back to column order into acc.

// Output lane j of the two permutes: column j (then 16 + j) of a 32-column
// group, from the low (index < 16) or the high (index >= 16) sums.
static inline __m512 low_columns(__m512 low, __m512 high) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  return _mm512_permutex2var_ps(low, first, high);
}
static inline __m512 high_columns(__m512 low, __m512 high) {
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  return _mm512_permutex2var_ps(low, second, high);
}

// The K rows of `ahead` a chunk's column pass asks for, a key pair at a
// time: key first + 2 pair + j for each j whose bit is set in `keys` (and
// below the table's count), all ahead.k_row_bytes of it. Its own line loop
// with the table's bounds taken once per pass (docs/inference.md: walking
// both tables through prefetch_rows per key pair costs a hot step 5-10%).
struct PairPrefetch {
  const void* const* rows;
  int64_t count, row_bytes;
  bool to_l2;
  int64_t first;
  unsigned keys;
  PairPrefetch(const RowsToPrefetch& ahead, int64_t first_key, unsigned key_bits)
      : rows(ahead.k_rows), count(ahead.k_count), row_bytes(ahead.k_row_bytes), to_l2(ahead.to_l2),
        first(first_key), keys(key_bits) {}
  inline void operator()(int64_t pair) const {
    for (int j = 0; j < 2; ++j) {
      const int64_t i = first + 2 * pair + j;
      if (!(keys >> j & 1u) || i >= count) continue;
      const char* row = static_cast<const char*>(rows[i]);
      for (int64_t off = 0; off < row_bytes; off += 64) {
        if (to_l2) prefetch_line<false>(row + off);
        else prefetch_line<true>(row + off);
      }
    }
  }
};

// One column pass of a chunk: GP groups of 32 columns from t0 (kMasked: one
// group of the `left` < 32 columns left), M x GP x 2 int32 sums in registers.
template <int M, int GP, bool kMasked>
static inline void accumulate_pass(int64_t key_pairs, const char* const* rows, const int32_t (*pairs)[16],
                                   const float* steps, int64_t t0, int64_t left, float* acc, int64_t ldacc,
                                   const PairPrefetch& prefetch) {
  static_assert(!kMasked || GP == 1, "only a single group is masked");
  const __mmask32 cols = kMasked ? static_cast<__mmask32>((uint64_t(1) << left) - 1u) : ~__mmask32(0);
  __m512i sums[M][GP][2];
  for (int r = 0; r < M; ++r)
    for (int g = 0; g < GP; ++g) sums[r][g][0] = sums[r][g][1] = _mm512_setzero_si512();
  for (int64_t pair = 0; pair < key_pairs; ++pair) {
    if (prefetch.keys) prefetch(pair);
    const char* v0 = rows[2 * pair] + t0;
    const char* v1 = rows[2 * pair + 1] + t0;
    __m512i low[GP], high[GP];
    for (int g = 0; g < GP; ++g) {
      const __m512i x = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(cols, v0 + 32 * g));
      const __m512i y = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(cols, v1 + 32 * g));
      low[g] = _mm512_unpacklo_epi16(x, y);
      high[g] = _mm512_unpackhi_epi16(x, y);
    }
    for (int r = 0; r < M; ++r) {
      const __m512i pp = _mm512_set1_epi32(pairs[r][pair]);
      for (int g = 0; g < GP; ++g) {
        dpwssd(sums[r][g][0], pp, low[g]);
        dpwssd(sums[r][g][1], pp, high[g]);
      }
    }
  }
  const __mmask16 m0 = kMasked ? tail_mask(left) : __mmask16(0xffff);
  const __mmask16 m1 = kMasked ? tail_mask(left > 16 ? left - 16 : 0) : __mmask16(0xffff);
  for (int r = 0; r < M; ++r) {
    const __m512 step = _mm512_set1_ps(steps[r]);
    for (int g = 0; g < GP; ++g) {
      const __m512 low = _mm512_mul_ps(_mm512_cvtepi32_ps(sums[r][g][0]), step);
      const __m512 high = _mm512_mul_ps(_mm512_cvtepi32_ps(sums[r][g][1]), step);
      float* o = acc + r * ldacc + t0 + 32 * g;
      _mm512_mask_storeu_ps(o, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, o), low_columns(low, high)));
      _mm512_mask_storeu_ps(o + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, o + 16), high_columns(low, high)));
    }
  }
}

template <int M>
void int8_accumulate(int64_t n, int64_t d, const float* p, int64_t ldp, const void* const* value_rows, float* acc,
                     int64_t ldacc, const RowsToPrefetch& ahead) {
  // 32-column groups per pass: M x G x 2 <= 16 int32 sums.
  constexpr int G = M <= 2 ? 4 : M <= 4 ? 2 : 1;
  // Column passes per chunk; the first asks for the even keys' K rows of
  // `ahead` and the second for the odd ones' (a lone pass for both), so that
  // the next step's K streams in while P V multiplies. Issued by the scores
  // instead (with this step's V), every line of a step was asked for in its
  // first half and memory idled through P V: Llama-3-8B decode, int8 cache
  // of 8192 tokens with bf16_probabilities, cold, paired (Intel Xeon model
  // 207): 2 threads 0.87-0.97 of the time, 1 thread 0.86-0.96. The FMA P V
  // of the default int8 path (whose scores are slower) lost the same way,
  // 1.06-1.14x.
  const int64_t passes = d / (32 * G) + d % (32 * G) / 32 + (d % 32 != 0);
  const unsigned first_pass_keys = passes == 1 ? 3u : 1u;
  constexpr int64_t kChunk = few_rows16::kKeysPerChunk;
  static_assert(kChunk == 32, "16 dwords of key pairs per row");
  alignas(64) int32_t pairs[M][16];  // (p16[c], p16[c + 1]) per row and key pair
  float steps[M];
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t cn = n - c0 < kChunk ? n - c0 : kChunk;
    const __mmask16 first16 = tail_mask(cn), next16 = tail_mask(cn > 16 ? cn - 16 : 0);
    for (int r = 0; r < M; ++r) {
      const float* pr = p + r * ldp + c0;
      float max_abs;
      if (!max_abs_if_finite(pr, cn, max_abs) || (max_abs != 0.0f && max_abs < 0x1p-100f)) {
        // A NaN or infinite P (a V scale of NaN: a non-finite value in that
        // V row), or one so small that 32767 / max |P| would overflow: this
        // row's chunk in fp32, in key order, so NaN and infinity reach acc as
        // the FMA product carries them; its pairs then add nothing.
        for (int64_t c = 0; c < cn; ++c) {
          const int8_t* v = static_cast<const int8_t*>(value_rows[c0 + c]);
          for (int64_t t = 0; t < d; ++t) acc[r * ldacc + t] += pr[c] * float(v[t]);
        }
        steps[r] = 0.0f;
        _mm512_store_si512(pairs[r], _mm512_setzero_si512());
        continue;
      }
      const __m512 inverse = _mm512_set1_ps(max_abs == 0.0f ? 0.0f : 32767.0f / max_abs);
      steps[r] = max_abs / 32767.0f;
      // 32 words in key order (past cn: zero) = 16 dwords of key pairs.
      const __m256i a = round_to_int16(_mm512_maskz_loadu_ps(first16, pr), inverse, 32767);
      const __m256i b = round_to_int16(_mm512_maskz_loadu_ps(next16, pr + 16), inverse, 32767);
      _mm512_store_si512(pairs[r], _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
    }
    // An odd count's last pair reads its one key twice (P 0 for the second).
    const char* rows[kChunk];
    for (int64_t c = 0; c < kChunk; ++c) rows[c] = static_cast<const char*>(value_rows[c0 + (c < cn ? c : cn - 1)]);
    const int64_t key_pairs = (cn + 1) / 2;
    // Pass k's share of the prefetches (none past the second pass; past cn
    // the pairs repeat a row, and keys of `ahead` past its count are skipped).
    int64_t pass = 0;
    const auto prefetch = [&]() {
      const unsigned keys = pass == 0 ? first_pass_keys : pass == 1 ? 2u : 0u;
      ++pass;
      return PairPrefetch{ahead, c0, keys};
    };
    int64_t t = 0;
    for (; t + 32 * G <= d; t += 32 * G)
      accumulate_pass<M, G, false>(key_pairs, rows, pairs, steps, t, 32 * G, acc, ldacc, prefetch());
    for (; t + 32 <= d; t += 32)
      accumulate_pass<M, 1, false>(key_pairs, rows, pairs, steps, t, 32, acc, ldacc, prefetch());
    if (t < d) accumulate_pass<M, 1, true>(key_pairs, rows, pairs, steps, t, d - t, acc, ldacc, prefetch());
  }
}

}  // namespace
}  // namespace avx512_vnni

bool few_rows_split_q16(int64_t m, int64_t d, const float* q, int64_t ldq, int16_t* q16, int64_t ldq16,
                        float* steps, int64_t step_stride) {
  const float q_max = float(kQ16Max(d));
  const int64_t padded = (d + 31) / 32 * 32;
  for (int64_t r = 0; r < m; ++r) {
    const float* row = q + r * ldq;
    float max_abs;
    if (!avx512_vnni::max_abs_if_finite(row, d, max_abs)) return false;
    // Below 2^-100 the reciprocal could overflow: such rows take the fp32
    // products (their scores are ~0 anyway).
    if (max_abs != 0.0f && max_abs < 0x1p-100f) return false;
    const float inverse = max_abs == 0.0f ? 0.0f : q_max / max_abs;
    steps[r * step_stride] = max_abs / q_max;
    int16_t* out = q16 + r * ldq16;
    for (int64_t t = 0; t < padded; t += 16) {
      const __m512 x = _mm512_maskz_loadu_ps(avx512_vnni::tail_mask(d - t > 0 ? d - t : 0), row + t);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t),
                          avx512_vnni::round_to_int16(x, _mm512_set1_ps(inverse), int32_t(q_max)));
    }
  }
  return true;
}

void few_rows_int8_scores_vnni(int64_t m, int64_t n, int64_t d, const int16_t* q16, int64_t ldq16,
                               const float* steps, int64_t step_stride, const void* const* key_rows, float* s,
                               int64_t lds, const RowsToPrefetch& ahead) {
  auto run = [&]<DType kType, int M>() {
    avx512_vnni::int8_scores<M>(n, d, q16, ldq16, steps, step_stride, key_rows, s, lds, ahead);
  };
  avx512_vnni::few_rows::with_rows<DType::i8>(m, run);
}

void few_rows_int8_accumulate_vnni(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                   const void* const* value_rows, float* acc, int64_t ldacc,
                                   const RowsToPrefetch& ahead) {
  auto run = [&]<DType kType, int M>() {
    avx512_vnni::int8_accumulate<M>(n, d, p, ldp, value_rows, acc, ldacc, ahead);
  };
  avx512_vnni::few_rows::with_rows<DType::i8>(m, run);
}

}  // namespace tileattn::detail
