// A scalar emulation of exactly the AVX-512 (F/BW/DQ/VL) intrinsics that
// src/isa/avx512/kernels.hpp uses, and the AVX512-BF16 ones (with the few
// integer intrinsics) that src/isa/avx512bf16/bf16_kernels.hpp adds, so that its kernels and the main loop built
// on them can be tested on CPUs without AVX-512 (the project's development
// machines had none until 2026-12-01, and a CI machine may have none; QEMU
// does not implement AVX-512 and Intel SDE is not here).
//
// Use, in a test translation unit that never includes <immintrin.h>:
//   #define TILEATTN_AVX512_EMULATION "isa/avx512_emulation.hpp"
//   #define TILEATTN_AVX512_NAMESPACE avx512_emulated
//   #include "isa/avx512/kernels.hpp"
// kernels.hpp then includes this file instead of <immintrin.h> and puts its
// Kernels in tileattn::detail::avx512_emulated, away from the library's real
// tileattn::detail::avx512 (no ODR clash).
//
// Faithful where a wrong kernel would show:
//  - aligned loads/stores fault (abort) unless 64-byte aligned;
//  - masked loads/stores never touch masked-off lanes (fault suppression), so
//    a guard page after the data catches any unmasked over-read;
//  - max/min return the SECOND operand on NaN and on equal zeros;
//  - fmadd is fused (one rounding), roundscale rounds to nearest-even,
//    scalef follows the SDM's special cases, cvtps_ph rounds to nearest-even;
//  - dpbf16_ps is bit-exact with the hardware (bf16_dot_semantics.hpp says
//    what that is and where it was measured: not quite Intel's pseudo-code);
//  - reduce_add / reduce_max combine lanes in the order GCC's
//    avx512fintrin.h does (upper 256 op lower 256, then 128-bit halves, then
//    lanes {0,1} op {2,3}, then lane 0 op lane 1). Clang's order may differ.
// Not emulated: floating-point exceptions and MXCSR modes (DAZ/FTZ are
// assumed off, rounding nearest), and anything kernels.hpp does not call, which
// is then a compile error here rather than a silent guess.
//
// The names below are the intrinsics' reserved names on purpose: kernels.hpp
// must compile unchanged. They live in namespace tileattn::avx512_emulation
// and are made visible only inside TILEATTN_AVX512_NAMESPACE.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "isa/avx512_lane_semantics.hpp"
#include "isa/bf16_dot_semantics.hpp"

#ifndef TILEATTN_AVX512_NAMESPACE
#error "define TILEATTN_AVX512_NAMESPACE (not avx512) before including the AVX-512 emulation"
#endif

// immintrin.h's constants (same values), unless something included it anyway.
#ifndef _MM_FROUND_TO_NEAREST_INT
#define _MM_FROUND_TO_NEAREST_INT 0x00
#define _MM_FROUND_TO_NEG_INF 0x01
#define _MM_FROUND_TO_POS_INF 0x02
#define _MM_FROUND_TO_ZERO 0x03
#define _MM_FROUND_CUR_DIRECTION 0x04
#define _MM_FROUND_NO_EXC 0x08
#endif
#ifndef _CMP_EQ_OQ
#define _CMP_EQ_OQ 0x00
#define _CMP_LT_OS 0x01
#define _CMP_LE_OS 0x02
#define _CMP_UNORD_Q 0x03
#define _CMP_NEQ_UQ 0x04
#define _CMP_NLT_US 0x05
#define _CMP_NLE_US 0x06
#define _CMP_ORD_Q 0x07
#define _CMP_NLT_UQ 0x15
#define _CMP_LT_OQ 0x11
#define _CMP_LE_OQ 0x12
#define _CMP_GE_OQ 0x1d
#define _CMP_GT_OQ 0x1e
#endif

namespace tileattn::avx512_emulation {

struct __m512 {
  float f32[16];
};
struct __m512i {
  int32_t i32[16];
};
// Plain arrays (no alignas: values are passed by value everywhere, and the
// real registers' alignment only matters for memory, checked by the loads).
// The kernels use 256-bit integer vectors only as 16 fp16/bf16 values.
struct __m256i {
  uint16_t u16[16];
};
using __mmask16 = uint16_t;
using __mmask32 = uint32_t;
// 32 bf16 values (the dot-product instructions' operand type).
struct __m512bh {
  uint16_t u16[32];
};

namespace memory {
inline void require_aligned(const void* p, uintptr_t alignment, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) fault(what);
}
inline bool active(uint32_t k, int i) { return (k >> i) & 1u; }
}  // namespace memory

template <class Op>
inline __m512 per_lane(Op op) {
  __m512 r;
  for (int i = 0; i < 16; ++i) r.f32[i] = op(i);
  return r;
}

// ---- set, move, mask-move
inline __m512 _mm512_set1_ps(float x) {
  return per_lane([&](int) { return x; });
}
inline __m512 _mm512_setzero_ps() { return _mm512_set1_ps(0.0f); }
inline __m512i _mm512_setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6, int e7,
                                 int e8, int e9, int e10, int e11, int e12, int e13, int e14,
                                 int e15) {
  return __m512i{{e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15}};
}
inline __m512 _mm512_mask_mov_ps(__m512 src, __mmask16 k, __m512 a) {
  return per_lane([&](int i) { return memory::active(k, i) ? a.f32[i] : src.f32[i]; });
}
inline __m512 _mm512_maskz_mov_ps(__mmask16 k, __m512 a) {
  return per_lane([&](int i) { return memory::active(k, i) ? a.f32[i] : 0.0f; });
}
inline __m512 _mm512_castsi512_ps(__m512i a) {
  __m512 r;
  std::memcpy(&r, &a, sizeof r);
  return r;
}

// ---- loads and stores
inline __m512 _mm512_load_ps(const void* p) {
  memory::require_aligned(p, 64, "_mm512_load_ps: address not 64-byte aligned (#GP)");
  __m512 r;
  std::memcpy(r.f32, p, 64);
  return r;
}
inline void _mm512_store_ps(void* p, __m512 a) {
  memory::require_aligned(p, 64, "_mm512_store_ps: address not 64-byte aligned (#GP)");
  std::memcpy(p, a.f32, 64);
}
inline __m512 _mm512_loadu_ps(const void* p) {
  __m512 r;
  std::memcpy(r.f32, p, 64);
  return r;
}
inline void _mm512_storeu_ps(void* p, __m512 a) { std::memcpy(p, a.f32, 64); }

// Masked forms: a masked-off lane's memory is never read or written.
inline __m512 _mm512_mask_loadu_ps(__m512 src, __mmask16 k, const void* p) {
  const char* bytes = static_cast<const char*>(p);
  for (int i = 0; i < 16; ++i)
    if (memory::active(k, i)) std::memcpy(&src.f32[i], bytes + 4 * i, 4);
  return src;
}
inline __m512 _mm512_maskz_loadu_ps(__mmask16 k, const void* p) {
  return _mm512_mask_loadu_ps(_mm512_setzero_ps(), k, p);
}
inline void _mm512_mask_storeu_ps(void* p, __mmask16 k, __m512 a) {
  char* bytes = static_cast<char*>(p);
  for (int i = 0; i < 16; ++i)
    if (memory::active(k, i)) std::memcpy(bytes + 4 * i, &a.f32[i], 4);
}
inline __m256i _mm256_maskz_loadu_epi16(__mmask16 k, const void* p) {
  __m256i r{};
  const char* bytes = static_cast<const char*>(p);
  for (int i = 0; i < 16; ++i)
    if (memory::active(k, i)) std::memcpy(&r.u16[i], bytes + 2 * i, 2);
  return r;
}
inline void _mm256_mask_storeu_epi16(void* p, __mmask16 k, __m256i a) {
  char* bytes = static_cast<char*>(p);
  for (int i = 0; i < 16; ++i)
    if (memory::active(k, i)) std::memcpy(bytes + 2 * i, &a.u16[i], 2);
}
// VGATHERDPS, all lanes: element i from base + sign-extended index[i] * scale.
inline __m512 _mm512_i32gather_ps(__m512i index, const void* base, int scale) {
  if (scale != 1 && scale != 2 && scale != 4 && scale != 8) fault("i32gather_ps: scale not 1/2/4/8");
  const char* bytes = static_cast<const char*>(base);
  return per_lane([&](int i) {
    float x;
    std::memcpy(&x, bytes + int64_t(index.i32[i]) * scale, 4);
    return x;
  });
}

// ---- arithmetic
inline __m512 _mm512_add_ps(__m512 a, __m512 b) {
  return per_lane([&](int i) { return a.f32[i] + b.f32[i]; });
}
inline __m512 _mm512_sub_ps(__m512 a, __m512 b) {
  return per_lane([&](int i) { return a.f32[i] - b.f32[i]; });
}
inline __m512 _mm512_mul_ps(__m512 a, __m512 b) {
  return per_lane([&](int i) { return a.f32[i] * b.f32[i]; });
}
inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  return per_lane([&](int i) { return std::fma(a.f32[i], b.f32[i], c.f32[i]); });
}
inline __m512 _mm512_fmsub_ps(__m512 a, __m512 b, __m512 c) {
  return per_lane([&](int i) { return std::fma(a.f32[i], b.f32[i], -c.f32[i]); });
}
inline __m512 _mm512_max_ps(__m512 a, __m512 b) {
  return per_lane([&](int i) { return lane::max(a.f32[i], b.f32[i]); });
}
inline __m512 _mm512_min_ps(__m512 a, __m512 b) {
  return per_lane([&](int i) { return lane::min(a.f32[i], b.f32[i]); });
}
inline __m512 _mm512_roundscale_ps(__m512 a, int imm) {
  return per_lane([&](int i) { return lane::round_to_integer(a.f32[i], imm); });
}
inline __m512 _mm512_reduce_ps(__m512 a, int imm) {
  return per_lane([&](int i) { return lane::reduce(a.f32[i], imm); });
}
inline __m512 _mm512_scalef_ps(__m512 a, __m512 b) {
  return per_lane([&](int i) { return lane::scalef(a.f32[i], b.f32[i]); });
}
inline __m512 _mm512_maskz_scalef_ps(__mmask16 k, __m512 a, __m512 b) {
  return per_lane([&](int i) { return memory::active(k, i) ? lane::scalef(a.f32[i], b.f32[i]) : 0.0f; });
}
inline __mmask16 _mm512_mask_cmp_ps_mask(__mmask16 k, __m512 a, __m512 b, int predicate) {
  if (predicate < 0 || predicate > 31) fault("mask_cmp_ps_mask: predicate outside 0..31");
  unsigned r = 0;
  for (int i = 0; i < 16; ++i)
    if (memory::active(k, i) && lane::compare(a.f32[i], b.f32[i], predicate)) r |= 1u << i;
  return static_cast<__mmask16>(r);
}
inline __mmask16 _mm512_cmp_ps_mask(__m512 a, __m512 b, int predicate) {
  if (predicate < 0 || predicate > 31) fault("cmp_ps_mask: predicate outside 0..31");
  unsigned k = 0;
  for (int i = 0; i < 16; ++i)
    if (lane::compare(a.f32[i], b.f32[i], predicate)) k |= 1u << i;
  return static_cast<__mmask16>(k);
}

// ---- reductions, in GCC's order (see the top of this file)
template <class Op>
inline float reduce_like_gcc(const __m512& a, Op op) {
  float t3[8], t6[4];
  for (int i = 0; i < 8; ++i) t3[i] = op(a.f32[8 + i], a.f32[i]);  // upper op lower
  for (int i = 0; i < 4; ++i) t6[i] = op(t3[4 + i], t3[i]);
  const float t8_0 = op(t6[0], t6[2]), t8_1 = op(t6[1], t6[3]);
  return op(t8_0, t8_1);
}
inline float _mm512_reduce_add_ps(__m512 a) {
  return reduce_like_gcc(a, [](float x, float y) { return x + y; });
}
// GCC ends reduce_max with max(T8, shuffle(T8, {1,0,1,0}))[0] = max(T8[0], T8[1]).
inline float _mm512_reduce_max_ps(__m512 a) { return reduce_like_gcc(a, lane::max); }

// ---- conversions and integer shifts
inline __m512 _mm512_cvtph_ps(__m256i a) {
  return per_lane([&](int i) { return lane::half_to_float(a.u16[i]); });
}
inline __m256i _mm512_cvtps_ph(__m512 a, int imm) {
  __m256i r;
  for (int i = 0; i < 16; ++i) r.u16[i] = lane::float_to_half(a.f32[i], imm);
  return r;
}
inline __m512i _mm512_cvtepu16_epi32(__m256i a) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.i32[i] = int32_t(a.u16[i]);
  return r;
}
// VCVTDQ2PS: int32 to fp32, rounded to nearest even (the MXCSR default; the
// kernels convert only sums below 2^24, which are exact).
inline __m512 _mm512_cvtepi32_ps(__m512i a) {
  return per_lane([&](int i) { return static_cast<float>(a.i32[i]); });
}
// ---- shuffles (pure data movement; SDM: UNPCKLPS, UNPCKHPS, SHUFPS, SHUFF32x4)
inline __m512 _mm512_unpacklo_ps(__m512 a, __m512 b) {
  return per_lane([&](int i) {
    const int lane = i / 4 * 4, j = i % 4;
    return (j % 2 == 0 ? a : b).f32[lane + j / 2];
  });
}
inline __m512 _mm512_unpackhi_ps(__m512 a, __m512 b) {
  return per_lane([&](int i) {
    const int lane = i / 4 * 4, j = i % 4;
    return (j % 2 == 0 ? a : b).f32[lane + 2 + j / 2];
  });
}
// Within each 128-bit lane: two elements of a, then two of b, each picked by 2 bits of imm.
inline __m512 _mm512_shuffle_ps(__m512 a, __m512 b, int imm) {
  return per_lane([&](int i) {
    const int lane = i / 4 * 4, j = i % 4;
    return (j < 2 ? a : b).f32[lane + ((imm >> (2 * j)) & 3)];
  });
}
// Lane i = a's lane idx[i] % 16.
inline __m512 _mm512_permutexvar_ps(__m512i idx, __m512 a) {
  return per_lane([&](int i) { return a.f32[idx.i32[i] & 15]; });
}
// 128-bit lanes: two of a, then two of b, each picked by 2 bits of imm.
inline __m512 _mm512_shuffle_f32x4(__m512 a, __m512 b, int imm) {
  return per_lane([&](int i) {
    const int j = i / 4;
    return (j < 2 ? a : b).f32[4 * ((imm >> (2 * j)) & 3) + i % 4];
  });
}

inline __m512i _mm512_slli_epi32(__m512i a, unsigned int count) {
  __m512i r;
  for (int i = 0; i < 16; ++i)
    r.i32[i] = count > 31 ? 0 : int32_t(uint32_t(a.i32[i]) << count);
  return r;
}

// ---- bf16 products and the integer operations around them (bf16_kernels.hpp)
namespace words {
// A 512-bit integer vector as 32 16-bit words, and back.
struct Words {
  uint16_t u16[32];
};
inline Words of(__m512i a) {
  Words w;
  std::memcpy(&w, &a, sizeof w);
  return w;
}
inline __m512i to_vector(const Words& w) {
  __m512i a;
  std::memcpy(&a, &w, sizeof a);
  return a;
}
}  // namespace words

template <class Op>
inline __m512i per_lane_epi32(Op op) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.i32[i] = op(i);
  return r;
}

inline __m512i _mm512_setzero_si512() { return __m512i{}; }
inline __m512i _mm512_set1_epi32(int x) {
  return per_lane_epi32([&](int) { return x; });
}
inline __m512i _mm512_castps_si512(__m512 a) {
  __m512i r;
  std::memcpy(&r, &a, sizeof r);
  return r;
}
inline __m512i _mm512_load_si512(const void* p) {
  memory::require_aligned(p, 64, "_mm512_load_si512: address not 64-byte aligned (#GP)");
  __m512i r;
  std::memcpy(&r, p, 64);
  return r;
}
inline void _mm512_store_si512(void* p, __m512i a) {
  memory::require_aligned(p, 64, "_mm512_store_si512: address not 64-byte aligned (#GP)");
  std::memcpy(p, &a, 64);
}
inline void _mm512_storeu_si512(void* p, __m512i a) { std::memcpy(p, &a, 64); }
inline __m512i _mm512_loadu_si512(const void* p) {
  __m512i r;
  std::memcpy(&r, p, 64);
  return r;
}
inline void _mm256_storeu_si256(__m256i* p, __m256i a) { std::memcpy(p, &a, 32); }
// VMOVDQU16 with zero-masking: a masked-off word's memory is never read.
inline __m512i _mm512_maskz_loadu_epi16(__mmask32 k, const void* p) {
  words::Words w{};
  const char* bytes = static_cast<const char*>(p);
  for (int i = 0; i < 32; ++i)
    if (memory::active(k, i)) std::memcpy(&w.u16[i], bytes + 2 * i, 2);
  return words::to_vector(w);
}
using __mmask64 = uint64_t;
// VMOVDQU8 with zero-masking: a masked-off byte's memory is never read.
inline __m512i _mm512_maskz_loadu_epi8(__mmask64 k, const void* p) {
  uint8_t b[64] = {};
  const char* bytes = static_cast<const char*>(p);
  for (int i = 0; i < 64; ++i)
    if ((k >> i) & 1u) std::memcpy(&b[i], bytes + i, 1);
  __m512i r;
  std::memcpy(&r, b, sizeof r);
  return r;
}
// 128-bit vectors: the kernels use them only as 16 int8 values (widened by
// _mm512_cvtepi8_epi32).
struct __m128i {
  int8_t i8[16];
};
inline __m128i _mm_loadu_si128(const __m128i* p) {
  __m128i r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
// VMOVDQU8 xmm with zero-masking: a masked-off byte's memory is never read.
inline __m128i _mm_maskz_loadu_epi8(__mmask16 k, const void* p) {
  __m128i r{};
  const char* bytes = static_cast<const char*>(p);
  for (int i = 0; i < 16; ++i)
    if (memory::active(k, i)) std::memcpy(&r.i8[i], bytes + i, 1);
  return r;
}
// VPMOVSXBD: 16 int8 sign-extended to int32.
inline __m512i _mm512_cvtepi8_epi32(__m128i a) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.i32[i] = int32_t(a.i8[i]);
  return r;
}
// VPERMT2B (AVX512-VBMI): byte i is byte idx[5:0] of a, or of b where idx
// bit 6 is set; idx bit 7 is ignored. Counted (all threads) for the tests
// that check which decode scores ran (few_rows_dot.hpp's fp8 keys).
inline std::atomic<int64_t> byte_permute_count{0};
inline __m512i _mm512_permutex2var_epi8(__m512i a, __m512i idx, __m512i b) {
  byte_permute_count.fetch_add(1, std::memory_order_relaxed);
  uint8_t ba[64], bi[64], bb[64], r[64];
  std::memcpy(ba, &a, 64);
  std::memcpy(bi, &idx, 64);
  std::memcpy(bb, &b, 64);
  for (int i = 0; i < 64; ++i) r[i] = ((bi[i] >> 6) & 1 ? bb : ba)[bi[i] & 63];
  __m512i v;
  std::memcpy(&v, r, sizeof v);
  return v;
}
// VPERMT2W: word i is word idx[4:0] of a, or of b where idx bit 5 is set.
inline __m512i _mm512_permutex2var_epi16(__m512i a, __m512i idx, __m512i b) {
  const words::Words wa = words::of(a), wi = words::of(idx), wb = words::of(b);
  words::Words r;
  for (int i = 0; i < 32; ++i) r.u16[i] = ((wi.u16[i] >> 5) & 1 ? wb : wa).u16[wi.u16[i] & 31];
  return words::to_vector(r);
}
// VPUNPCKLWD / VPUNPCKHWD: in each 128-bit lane, words 0-3 (lo) or 4-7 (hi)
// of a and b interleaved, a's first.
inline __m512i _mm512_unpacklo_epi16(__m512i a, __m512i b) {
  const words::Words wa = words::of(a), wb = words::of(b);
  words::Words r;
  for (int i = 0; i < 32; ++i) r.u16[i] = (i % 2 ? wb : wa).u16[i / 8 * 8 + i % 8 / 2];
  return words::to_vector(r);
}
inline __m512i _mm512_unpackhi_epi16(__m512i a, __m512i b) {
  const words::Words wa = words::of(a), wb = words::of(b);
  words::Words r;
  for (int i = 0; i < 32; ++i) r.u16[i] = (i % 2 ? wb : wa).u16[i / 8 * 8 + 4 + i % 8 / 2];
  return words::to_vector(r);
}
// VPERMT2PS: lane i takes lane idx[i] & 15 of a, or of b where idx bit 4 is set.
inline __m512 _mm512_permutex2var_ps(__m512 a, __m512i idx, __m512 b) {
  return per_lane([&](int i) { return ((idx.i32[i] >> 4) & 1 ? b : a).f32[idx.i32[i] & 15]; });
}
inline __m512i _mm512_add_epi32(__m512i a, __m512i b) {
  return per_lane_epi32([&](int i) { return int32_t(uint32_t(a.i32[i]) + uint32_t(b.i32[i])); });
}
inline __m512i _mm512_and_si512(__m512i a, __m512i b) {
  return per_lane_epi32([&](int i) { return a.i32[i] & b.i32[i]; });
}
inline __m512i _mm512_or_si512(__m512i a, __m512i b) {
  return per_lane_epi32([&](int i) { return a.i32[i] | b.i32[i]; });
}
inline __m512i _mm512_mask_mov_epi32(__m512i src, __mmask16 k, __m512i a) {
  return per_lane_epi32([&](int i) { return (k >> i) & 1 ? a.i32[i] : src.i32[i]; });
}
inline __m512i _mm512_srli_epi32(__m512i a, unsigned int count) {
  return per_lane_epi32([&](int i) { return count > 31 ? 0 : int32_t(uint32_t(a.i32[i]) >> count); });
}
// VPMOVDW: each dword truncated to its low word.
inline __m256i _mm512_cvtepi32_epi16(__m512i a) {
  __m256i r;
  for (int i = 0; i < 16; ++i) r.u16[i] = uint16_t(uint32_t(a.i32[i]));
  return r;
}
// ---- P V's low part on int8 products (src/isa/avx512bf16/lo_int8.hpp)
inline __m512i _mm512_sub_epi32(__m512i a, __m512i b) {
  return per_lane_epi32([&](int i) { return int32_t(uint32_t(a.i32[i]) - uint32_t(b.i32[i])); });
}
inline __m512i _mm512_xor_si512(__m512i a, __m512i b) {
  return per_lane_epi32([&](int i) { return a.i32[i] ^ b.i32[i]; });
}
// VPMAXUD: unsigned dword max.
inline __m512i _mm512_max_epu32(__m512i a, __m512i b) {
  return per_lane_epi32([&](int i) { return uint32_t(a.i32[i]) > uint32_t(b.i32[i]) ? a.i32[i] : b.i32[i]; });
}
// VCVTPS2DQ: fp32 to int32 rounded to nearest even (MXCSR's default); NaN
// and values outside int32 give the "integer indefinite" 0x80000000.
inline __m512i _mm512_cvtps_epi32(__m512 a) {
  return per_lane_epi32([&](int i) {
    const float x = a.f32[i];
    if (!(x >= -2147483648.0f && x < 2147483648.0f)) return int32_t(INT32_MIN);
    return int32_t(std::nearbyint(x));
  });
}
// VPMOVDB: each dword truncated to its low byte.
inline __m128i _mm512_cvtepi32_epi8(__m512i a) {
  __m128i r;
  for (int i = 0; i < 16; ++i) r.i8[i] = int8_t(uint8_t(uint32_t(a.i32[i])));
  return r;
}
inline void _mm_storeu_si128(__m128i* p, __m128i a) { std::memcpy(p, &a, sizeof a); }
// VPDPBUSD: lane i += the four products of a's unsigned bytes 4i..4i+3 with
// b's signed bytes 4i..4i+3, wrapping (no saturation). Counted (all threads)
// for the tests that check which P V ran.
inline std::atomic<int64_t> int8_dot_count{0};
inline __m512i _mm512_dpbusd_epi32(__m512i src, __m512i a, __m512i b) {
  int8_dot_count.fetch_add(1, std::memory_order_relaxed);
  uint8_t ua[64];
  int8_t sb[64];
  std::memcpy(ua, &a, 64);
  std::memcpy(sb, &b, 64);
  return per_lane_epi32([&](int i) {
    uint32_t sum = uint32_t(src.i32[i]);
    for (int j = 0; j < 4; ++j) sum += uint32_t(int32_t(ua[4 * i + j]) * int32_t(sb[4 * i + j]));
    return int32_t(sum);
  });
}
// bf16_kernels.hpp's cast of a vector of bf16 pairs (a C cast natively).
inline __m512bh as_bf16_pairs(__m512i v) {
  __m512bh r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
// ... and back, for the split of P (bf16_split_rows).
inline __m512i bf16_bits(__m512bh v) {
  __m512i r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
// VCVTNE2PS2BF16: words 0-15 from b, 16-31 from a, each
// bf16_dot_semantics::round_to_bf16 (measured bit-exact).
inline __m512bh _mm512_cvtne2ps_pbh(__m512 a, __m512 b) {
  __m512bh r;
  for (int i = 0; i < 16; ++i) {
    r.u16[i] = bf16_dot_semantics::round_to_bf16(b.f32[i]);
    r.u16[16 + i] = bf16_dot_semantics::round_to_bf16(a.f32[i]);
  }
  return r;
}
// The low 256 bits, and the 256-bit half `imm` (0 or 1), as 16 words.
inline __m256i _mm512_castsi512_si256(__m512i a) {
  __m256i r;
  std::memcpy(&r, &a, sizeof r);
  return r;
}
inline __m256i _mm512_extracti64x4_epi64(__m512i a, int imm) {
  __m256i r;
  std::memcpy(&r, reinterpret_cast<const char*>(&a) + (imm & 1) * 32, sizeof r);
  return r;
}
// VDPBF16PS: lane i += a.bf16[2i+1] * b.bf16[2i+1], then += a.bf16[2i] * b.bf16[2i],
// each step as bf16_dot_semantics::dot_step (measured bit-exact). Counted
// (all threads) for the tests that check which decode scores ran.
inline std::atomic<int64_t> bf16_dot_count{0};
inline __m512 _mm512_dpbf16_ps(__m512 src, __m512bh a, __m512bh b) {
  bf16_dot_count.fetch_add(1, std::memory_order_relaxed);
  using bf16_dot_semantics::dot_step;
  return per_lane([&](int i) {
    return dot_step(dot_step(src.f32[i], a.u16[2 * i + 1], b.u16[2 * i + 1]), a.u16[2 * i], b.u16[2 * i]);
  });
}

}  // namespace tileattn::avx512_emulation

// The kernels' namespace sees the emulated names by unqualified lookup.
namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE {
using namespace tileattn::avx512_emulation;
}
