// fp8 e4m3 -> bf16 on AVX512-VBMI byte permutes, and the few-rows P V / score
// load policy built on it (E4m3Loads). Every e4m3 value is a bf16 value, so
// the conversion is exact; a bf16 widens to fp32 with one shift or one and.
// Used by the AVX-512 FMA few-rows products (few_rows_vbmi.cpp in this
// directory) and by the vdpbf16ps decode products (isa/avx512bf16/
// few_rows_dot.hpp). The permutes exist only where a file is compiled with
// -mavx512vbmi (or against the emulation): elsewhere only the declaration
// below is seen, and the callers go through entry points compiled in the two
// few_rows_vbmi.cpp (few_rows_vbmi.hpp here, few_rows_dot.hpp's for the dot
// products).
//
// Included INSIDE namespace tileattn::detail::<ISA>: natively from
// few_rows_kernels.hpp (E4m3Loads reads few_rows16's loads), under the
// emulation from kernels.hpp (E4m3ToBf16 only).

#if defined(__AVX512VBMI__) || defined(TILEATTN_AVX512_EMULATION)
#define TILEATTN_E4M3_PERMUTES 1
#endif

namespace few_rows16 {

struct E4m3ToBf16;

#ifdef TILEATTN_E4M3_PERMUTES
// The vpermi2b tables of fp8 e4m3 -> bf16: high and low bytes of the bf16
// bits of each 7-bit magnitude (exponent, mantissa; S.1111.111 is NaN), 64
// entries per vector, and the byte interleaves of 32 (low, high) pairs.
struct E4m3Tables {
  alignas(64) uint8_t high[128], low[128], first[64], second[64];
  E4m3Tables() {
    for (int m = 0; m < 128; ++m) {
      const uint32_t bits = float_to_bits(f8e4m3_to_float(uint8_t(m))) >> 16;  // exact: 4 significant bits
      high[m] = uint8_t(bits >> 8);
      low[m] = uint8_t(bits);
    }
    for (int b = 0; b < 64; ++b) {  // output byte b: pair b / 2's low (even b) or high byte (index bit 6: b)
      first[b] = uint8_t(b / 2 + (b % 2 ? 64 : 0));
      second[b] = uint8_t(32 + b / 2 + (b % 2 ? 64 : 0));
    }
  }
};

// 64 fp8 e4m3 bytes as 64 bf16 (the same values) in order: elements 0..31
// in k0, 32..63 in k1. Two lookups give each magnitude's high and low bytes
// (vpermi2b ignores the sign bit 7), the sign joins the high byte, two byte
// interleaves pair them: five instructions where the fp16 route took twenty
// (the widening, the NaN fixup, four vcvtph2ps and the x 2^8).
struct E4m3ToBf16 {
  __m512i high0, high1, low0, low1, first, second, sign;
  E4m3ToBf16() {
    static const E4m3Tables t;
    high0 = _mm512_load_si512(t.high);
    high1 = _mm512_load_si512(t.high + 64);
    low0 = _mm512_load_si512(t.low);
    low1 = _mm512_load_si512(t.low + 64);
    first = _mm512_load_si512(t.first);
    second = _mm512_load_si512(t.second);
    sign = _mm512_set1_epi32(int32_t(0x80808080u));
  }
  void operator()(__m512i x, __m512i& k0, __m512i& k1) const {
    const __m512i high = _mm512_or_si512(_mm512_permutex2var_epi8(high0, x, high1), _mm512_and_si512(x, sign));
    const __m512i low = _mm512_permutex2var_epi8(low0, x, low1);
    k0 = _mm512_permutex2var_epi8(low, first, high);
    k1 = _mm512_permutex2var_epi8(low, second, high);
  }
};

// How the FMA few-rows products (few_rows16::scores and accumulate) read
// e4m3 rows: 32 or 64 elements at a time as bf16 by E4m3ToBf16, each 32
// widened to fp32 as a bf16 row is (even elements << 16, odd & 0xffff0000:
// chunk order). 64 elements take ten instructions, 32 take seven, where the
// fp16 route (few_rows16::load32) took twenty and ten. Lone 16-element
// vectors (head dims that are not a multiple of 32) take that route. Not
// under the emulation, whose main loop has no 16-lane few-rows products.
#ifndef TILEATTN_AVX512_EMULATION
struct E4m3Loads {
  static constexpr bool kChunkOrder = true;
  static constexpr float kScale = 1.0f;  // exact values (the 16-element fallbacks put back their 2^8)
  E4m3ToBf16 to_bf16;
  static void widen(__m512i k, __m512& even, __m512& odd) {
    even = _mm512_castsi512_ps(_mm512_slli_epi32(k, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(k, _mm512_set1_epi32(int(0xffff0000u))));
  }
  void load32(const char* src, __m512& lo, __m512& hi) const {
    __m512i k0, k1;
    to_bf16(_mm512_maskz_loadu_epi8(__mmask64(0xffffffffu), src), k0, k1);  // reads 32 bytes
    widen(k0, lo, hi);
  }
  void load64(const char* src, __m512& v0, __m512& v1, __m512& v2, __m512& v3) const {
    __m512i k0, k1;
    to_bf16(_mm512_loadu_si512(src), k0, k1);
    widen(k0, v0, v1);
    widen(k1, v2, v3);
  }
  __m512 load16(const char* src) const {
    return _mm512_mul_ps(few_rows16::load16<DType::f8_e4m3>(src), _mm512_set1_ps(kLoadScale<DType::f8_e4m3>));
  }
  __m512 load16_masked(const char* src, __mmask16 mask) const {
    return _mm512_mul_ps(few_rows16::load16_masked<DType::f8_e4m3>(src, mask),
                         _mm512_set1_ps(kLoadScale<DType::f8_e4m3>));
  }
};
#endif
#endif

}  // namespace few_rows16
