// reduce16: sixteen 16-lane vectors to one vector of their sums, the
// horizontal sums of the few-rows score products (isa/avx512/few_rows_kernels.hpp
// on FMAs, isa/avx512bf16/few_rows_dot.hpp on vdpbf16ps). Included inside the
// ISA's namespace (kernels.hpp), native or against the AVX-512 emulation.

// Lane i of the result = the sum of v[i]'s 16 lanes. Each level halves the
// vectors and the lanes each one sums over: 16 x 16 -> 8 vectors holding two
// 8-lane partials (128-bit shuffles), -> 4 x four 4-lane partials, -> 2 x
// eight pairs (in-lane shuffles), -> 1 x sixteen sums; lane 4k + m then holds
// v[4m + k], which one permute puts in order. The first level pairs
// [a.lo, b.hi] (a masked move) with [a.hi, b.lo] (one shuffle): the same
// sums as [a.lo, b.lo] + [a.hi, b.hi], bit for bit, with 8 of the 30
// shuffles gone (shuffles, not adds, bound this reduction). `add` sums two
// vectors: fp32 lanes by default; the int8 scores on VNNI pass int32 adds
// (isa/avx512/few_rows_vnni.cpp), the shuffles only move bits.
struct AddPs {
  __m512 operator()(__m512 a, __m512 b) const { return _mm512_add_ps(a, b); }
};
template <class Add = AddPs>
static inline __m512 reduce16(const __m512* v, Add add = {}) {
  __m512 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i)
    w[i] = add(_mm512_mask_mov_ps(v[2 * i], 0xff00, v[2 * i + 1]),
               _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x4e));
  for (int i = 0; i < 4; ++i)
    x[i] = add(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
               _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xdd));
  for (int i = 0; i < 2; ++i)
    y[i] = add(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x88), _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xdd));
  const __m512 z = add(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xdd));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, z);
}


// s[r * lds + c0 + j] = lane r * KJ + j of `sums` for r < M, j < cn <= KJ:
// one masked store per row, at the address where lane r * KJ meets key c0
// (lds >= 16 >= KJ keeps it at or after s + c0; masked-off lanes are not
// written), where copying the sums one float at a time took 2 M KJ moves.
template <int M, int KJ>
static inline void store_sums(__m512 sums, float* s, int64_t lds, int64_t c0, int64_t cn) {
  static_assert(M * KJ <= 16, "one vector of sums");
  const uint32_t keys = (1u << cn) - 1u;
  for (int r = 0; r < M; ++r)
    _mm512_mask_storeu_ps(s + r * lds + c0 - r * KJ, static_cast<__mmask16>(keys << (r * KJ)), sums);
}
