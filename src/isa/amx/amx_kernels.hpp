// The amx rung: the AVX-512 Kernels plus bf16 products on AMX-BF16 tiles.
// Included by forward_amx.cpp (compiled with the AVX-512, AVX512-BF16 and
// AMX flags); tests compile it against a portable model of the tile
// instructions instead (TILEATTN_AMX_EMULATION).
//
// Tiles: 0-3 hold a 32 x 32 block of C (fp32, 16 x 16 each), 4-5 two A
// tiles (16 rows x 32 bf16), 6-7 two B tiles (16 pair rows x 16 columns x
// 2 bf16), all configured as 16 rows of 64 bytes (amx_tile_config). One
// tdpbf16ps is 16 x 16 x 32 multiply-adds; a 32 x 32 block does four per
// two A and two B loads. The B layout is bf16_kernels.hpp's pair layout,
// whose pair rows are 64 bytes: a B tile is 16 consecutive pair rows.
#pragma once

#include <cmath>
#include <cstring>

#include "core/bf16_block.hpp"
#include "tileattn/machine.hpp"
#include "isa/amx/tile_config.hpp"
#include "isa/avx512bf16/bf16_kernels.hpp"

#ifndef TILEATTN_AMX_EMULATION
#include <immintrin.h>
#else
#include TILEATTN_AMX_EMULATION
#endif

namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE {

// C tiles (RT x CT of 16 x 16 at c, row stride ldc_bytes) (+)= A (RT row
// tiles) B (CT column panels) over k (a multiple of 32) [+ A_lo B], one
// step of 32 k per call (amx_block runs them all).
//
// Steps of 32 k (with A_lo, each k twice: A then A_lo, on the same B). Tile
// registers are not renamed: a tile load waits for every tdpbf16ps still
// reading the tile, and a tdpbf16ps for the loads it reads. So each operand
// tile of the next step is loaded right after the last tdpbf16ps of this step
// that reads it, while the others still multiply. Measured (AMX Xeon, 1
// thread, 2x2 blocks with k = 128, operands in L1, TSC ticks per tdpbf16ps):
// all four loads before the four products 54-58; this order 16-21; no loads
// at all 15-16.
// Step 0 also loads (or zeroes) C and the first operands, the last step
// stores C: between the steps of one block the tile registers hold its
// state, so a caller may run vector code between them (Bf16Operands'
// exponentials do) but no other tile code.
template <int RT, int CT, bool kLo>
static inline void amx_block_step(int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                                  const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                                  int64_t s) {
  const int64_t a_stride = lda * 2, c_stride = ldc * 4;
  constexpr int64_t kParts = kLo ? 2 : 1;
  const int64_t steps = k / 32 * kParts;
  // Step s: k offset 32 * (s / kParts), A for s % kParts == 0, else A_lo.
  const auto a_of = [&](int64_t t) { return (kLo && t % kParts ? a_lo : a) + t / kParts * 32; };
  const auto b_of = [&](int64_t t) { return b + t / kParts * 32 * 16; };
  const auto load_a0 = [&](int64_t t) { _tile_loadd(4, a_of(t), a_stride); };
  const auto load_a1 = [&](int64_t t) { _tile_loadd(5, a_of(t) + 16 * lda, a_stride); };
  const auto load_b0 = [&](int64_t t) { _tile_loadd(6, b_of(t), 64); };
  const auto load_b1 = [&](int64_t t) { _tile_loadd(7, b_of(t) + b_panel, 64); };
  if (s == 0) {
    if (accumulate) {
      _tile_loadd(0, c, c_stride);
      if constexpr (CT > 1) _tile_loadd(1, c + 16, c_stride);
      if constexpr (RT > 1) _tile_loadd(2, c + 16 * ldc, c_stride);
      if constexpr (RT > 1 && CT > 1) _tile_loadd(3, c + 16 * ldc + 16, c_stride);
    } else {
      _tile_zero(0);
      if constexpr (CT > 1) _tile_zero(1);
      if constexpr (RT > 1) _tile_zero(2);
      if constexpr (RT > 1 && CT > 1) _tile_zero(3);
    }
    load_a0(0);
    load_b0(0);
    if constexpr (CT > 1) load_b1(0);
    if constexpr (RT > 1) load_a1(0);
  }
  const bool next = s + 1 < steps;                      // a step follows
  const bool next_b = next && (s + 1) % kParts == 0;  // ... with new B tiles
  _tile_dpbf16ps(0, 4, 6);
  if constexpr (CT == 1) {
    if (next) load_a0(s + 1);
    if (RT == 1 && next_b) load_b0(s + 1);
  } else {
    _tile_dpbf16ps(1, 4, 7);
    if (next) load_a0(s + 1);
    if (RT == 1 && next_b) load_b1(s + 1);
    if (RT == 1 && next_b) load_b0(s + 1);
  }
  if constexpr (RT > 1) {
    _tile_dpbf16ps(2, 5, 6);
    if (next_b) load_b0(s + 1);
    if constexpr (CT == 1) {
      if (next) load_a1(s + 1);
    } else {
      _tile_dpbf16ps(3, 5, 7);
      if (next) load_a1(s + 1);
      if (next_b) load_b1(s + 1);
    }
  }
  if (!next) {
    _tile_stored(0, c, c_stride);
    if constexpr (CT > 1) _tile_stored(1, c + 16, c_stride);
    if constexpr (RT > 1) _tile_stored(2, c + 16 * ldc, c_stride);
    if constexpr (RT > 1 && CT > 1) _tile_stored(3, c + 16 * ldc + 16, c_stride);
  }
}

// The whole block: every step of amx_block_step.
template <int RT, int CT, bool kLo>
static inline void amx_block(int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda, const uint16_t* b,
                             int64_t b_panel, float* c, int64_t ldc, bool accumulate) {
  const int64_t steps = k / 32 * (kLo ? 2 : 1);
  for (int64_t s = 0; s < steps; ++s) amx_block_step<RT, CT, kLo>(k, a, a_lo, lda, b, b_panel, c, ldc, accumulate, s);
}

// One band of rows (RT row tiles) across every column panel.
template <int RT, bool kLo>
static inline void amx_rows(int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                            const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate) {
  int64_t j = 0;
  for (; j + 32 <= n; j += 32)
    amx_block<RT, 2, kLo>(k, a, a_lo, lda, b + j / 16 * b_panel, b_panel, c + j, ldc, accumulate);
  if (j < n) amx_block<RT, 1, kLo>(k, a, a_lo, lda, b + j / 16 * b_panel, b_panel, c + j, ldc, accumulate);
}

template <bool kLo>
static inline void amx_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                            const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                            RowPrefetch* prefetch) {
  constexpr int64_t kPrefetchLinesPerBand = 16;
  int64_t i = 0;
  for (; i + 32 <= m; i += 32) {
    amx_rows<2, kLo>(n, k, a + i * lda, kLo ? a_lo + i * lda : nullptr, lda, b, b_panel, c + i * ldc, ldc,
                     accumulate);
    if (prefetch) prefetch->issue(kPrefetchLinesPerBand);
  }
  if (i + 16 <= m) {
    amx_rows<1, kLo>(n, k, a + i * lda, kLo ? a_lo + i * lda : nullptr, lda, b, b_panel, c + i * ldc, ldc,
                     accumulate);
    i += 16;
  }
  if (i == m) return;
  // The last m - i < 16 rows: C goes through a 16-row block on the stack, 16
  // columns at a time (a tile store writes all 16 rows, and the rows after
  // m belong to other heads or lie past the buffer). The A operands carry
  // 16 slack rows (ForwardScratchLayout), whose products are discarded.
  const int64_t rows = m - i;
  alignas(64) float block[16 * 16];
  for (int64_t j = 0; j < n; j += 16) {
    for (int64_t r = 0; r < 16; ++r)
      _mm512_store_ps(block + r * 16, accumulate && r < rows ? _mm512_loadu_ps(c + (i + r) * ldc + j)
                                                             : _mm512_setzero_ps());
    amx_block<1, 1, kLo>(k, a + i * lda, kLo ? a_lo + i * lda : nullptr, lda, b + j / 16 * b_panel, b_panel, block,
                         16, accumulate);
    for (int64_t r = 0; r < rows; ++r) _mm512_storeu_ps(c + (i + r) * ldc + j, _mm512_load_ps(block + r * 16));
  }
}

// Decode scores of an int8 cache on AMX-INT8 tiles (tdpbssd: int8 x int8
// products summed exactly in int32).
//
// Each fp32 query row (pre-scaled, as the few-rows products take it) is split
// once per work item into kPieces int8 rows: q = sum_p steps[p] a_p + e with
// steps[0] = max|q| / 127, steps[p + 1] = steps[p] / 254, every a_p in
// [-127, 127] and |e| <= steps[3] / 2 < 2.5e-10 max|q|, far below the rounding
// of fp32 products (2^-24 ~ 6e-8 of each). The int32 sums
// C_p[c] = a_p . key_c are exact (|C_p| <= 127 x 127 x 576 < 2^24, so they
// also convert to fp32 exactly); a score is sum_p steps[p] C_p[c] in fp32,
// smallest piece first: the dot product of the fp32 row with the int8 key,
// rounded a few times at the end instead of once per element (docs/inference.md).
//
// The tile product: A = the pieces (16 rows: 4 query rows x 4 pieces, 64
// bytes of d), B = 16 keys' 64 bytes of d transposed by dwords (the layout
// tdpbssd reads: B[i][c] = bytes 4i..4i+3 of key c), C = 16 (row, piece) x 16
// keys int32. Keys come through the row table, so paged caches and partial
// groups take the same path (missing keys load as zeros).
namespace int8_tiles {

constexpr int kPieces = 4;
constexpr int64_t kChunk = 64;  // bytes of d per tdpbssd
// Bytes between piece rows: d rounded up to whole tiles.
static inline int64_t piece_row_bytes(int64_t d) { return (d + kChunk - 1) / kChunk * kChunk; }
// Piece rows a query row takes, and the slack after the last (a tile load
// reads 16 rows from any row group's first).
constexpr int64_t kSlackPieceRows = 16;

// x rounded to the nearest integer, ties to even, for |x| < 2^22.
static inline float round_small(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 x 2^23: the sum's last bit is the units
  return (x + kMagic) - kMagic;
}

// Splits rows [0, m) of q (row stride ldq, d elements) into pieces (rows of
// piece_row_bytes(d), zero past d) and steps (m x kPieces). false when a row
// is not finite (the caller then takes the fp32 products, which carry NaN and
// infinity as the reference does).
static inline bool split_rows(int64_t m, int64_t d, const float* q, int64_t ldq, int8_t* pieces, float* steps) {
  const int64_t stride = piece_row_bytes(d);
  for (int64_t r = 0; r < m; ++r) {
    const float* row = q + r * ldq;
    float max_abs;
    if (!max_abs_if_finite(row, d, max_abs)) return false;
    float* st = steps + r * kPieces;
    float inverse[kPieces];
    st[0] = max_abs / 127.0f;
    for (int p = 1; p < kPieces; ++p) st[p] = st[p - 1] / 254.0f;
    for (int p = 0; p < kPieces; ++p) inverse[p] = max_abs == 0.0f ? 0.0f : 1.0f / st[p];
    int8_t* out = pieces + r * kPieces * stride;
    // The reciprocals round, so a piece may be off by a unit; the next
    // piece's residual absorbs it (|residual| stays near 127 of the next
    // step; the clamp keeps the bytes in range either way).
    float residual[tileattn::kMaxHeadDim];
    for (int64_t t = 0; t < d; ++t) residual[t] = row[t];
    for (int p = 0; p < kPieces; ++p) {
      int8_t* piece = out + p * stride;
      for (int64_t t = 0; t < d; ++t) {
        float a = round_small(residual[t] * inverse[p]);
        a = a > 127.0f ? 127.0f : a;
        a = a < -127.0f ? -127.0f : a;
        piece[t] = int8_t(int32_t(a));
        residual[t] = std::fma(-a, st[p], residual[t]);
      }
    }
    for (int p = 0; p < kPieces; ++p) std::memset(out + p * stride + d, 0, size_t(stride - d));
  }
  return true;
}

// c[0..15] lanes: dwords of 16 rows transposed (out[j] lane k = in[k] lane j).
static inline void transpose16(__m512* r) {
  __m512 t[16], u[16];
  for (int a = 0; a < 8; ++a) {
    t[2 * a] = _mm512_unpacklo_ps(r[2 * a], r[2 * a + 1]);
    t[2 * a + 1] = _mm512_unpackhi_ps(r[2 * a], r[2 * a + 1]);
  }
  // u[4b + e], lane L: rows 4b..4b+3 of column 4L + e.
  for (int b = 0; b < 4; ++b) {
    const __m512 lo0 = t[4 * b], hi0 = t[4 * b + 1], lo1 = t[4 * b + 2], hi1 = t[4 * b + 3];
    u[4 * b + 0] = _mm512_shuffle_ps(lo0, lo1, 0x44);
    u[4 * b + 1] = _mm512_shuffle_ps(lo0, lo1, 0xee);
    u[4 * b + 2] = _mm512_shuffle_ps(hi0, hi1, 0x44);
    u[4 * b + 3] = _mm512_shuffle_ps(hi0, hi1, 0xee);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512 x01_lo = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x44);
    const __m512 x01_hi = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xee);
    const __m512 x23_lo = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x44);
    const __m512 x23_hi = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xee);
    r[e] = _mm512_shuffle_f32x4(x01_lo, x23_lo, 0x88);
    r[4 + e] = _mm512_shuffle_f32x4(x01_lo, x23_lo, 0xdd);
    r[8 + e] = _mm512_shuffle_f32x4(x01_hi, x23_hi, 0x88);
    r[12 + e] = _mm512_shuffle_f32x4(x01_hi, x23_hi, 0xdd);
  }
}

// B for 16 keys (c0 + j, j < cn; the others zero) and chunk k: their dwords
// [16k, 16k + 16) (past d: zero) transposed into b (16 rows of 64 bytes).
static inline void store_b_tile(const void* const* key_rows, int64_t c0, int64_t cn, int64_t d, int64_t k,
                                int8_t* b) {
  const int64_t dwords = (d - k * kChunk) / 4 < 16 ? (d - k * kChunk) / 4 : 16;
  const __mmask16 mask = static_cast<__mmask16>((1u << dwords) - 1u);
  __m512 rows[16];
  for (int j = 0; j < 16; ++j)
    rows[j] = j < cn ? _mm512_maskz_loadu_ps(mask, static_cast<const char*>(key_rows[c0 + j]) + k * kChunk)
                     : _mm512_setzero_ps();
  transpose16(rows);
  for (int j = 0; j < 16; ++j) _mm512_store_ps(reinterpret_cast<float*>(b + 64 * j), rows[j]);
}

// s[r, c] = q[r] . key_rows[c] for r < m <= 8, c < n, from split_rows's
// pieces (piece row stride piece_row_bytes(d), kSlackPieceRows after row m's)
// and steps; int8 keys of d bytes (d a multiple of 4) with unit element
// stride. Prefetches the rows of `ahead` as the FMA scores do.
//
// 32 keys at a time, in three phases: every B tile of the 32 keys is
// transposed and stored first, then the tile products run, then the sums are
// combined. A tile load waits until the vector stores it reads have left the
// store buffer (no forwarding), and the vector loads of a stored C tile wait
// likewise: interleaved per chunk, a hot profile (Llama-3-8B decode, 900
// tokens, 1 thread) showed half of this function's samples on the B load and
// the tdpbssd after it. Tiles: C 0-1 (keys 0-15, query rows 0-3 and 4-7),
// 2-3 (keys 16-31), A 4-5, B 6 (amx_tile_config, loaded by the caller).
static inline void scores(int64_t m, int64_t n, int64_t d, const int8_t* pieces, const float* steps,
                          const void* const* key_rows, float* s, int64_t lds, const RowsToPrefetch& ahead) {
  const int64_t stride = piece_row_bytes(d);
  const int64_t chunks = stride / kChunk;
  const bool two_row_tiles = m > 4;
  constexpr int64_t kMaxChunks = (tileattn::kMaxHeadDim + kChunk - 1) / kChunk;
  alignas(64) int8_t b_tiles[2][kMaxChunks][16 * 64];  // (key group, chunk) B tiles
  alignas(64) int32_t c_tiles[2][2][16 * 16];             // (key group, row tile) C tiles
  for (int64_t c0 = 0; c0 < n; c0 += 32) {
    const int64_t cn = n - c0 < 32 ? n - c0 : 32;
    const int groups = cn > 16 ? 2 : 1;
    for (int g = 0; g < groups; ++g) {
      const int64_t gn = cn - 16 * g < 16 ? cn - 16 * g : 16;
      for (int64_t k = 0; k < chunks; ++k) store_b_tile(key_rows, c0 + 16 * g, gn, d, k, b_tiles[g][k]);
    }
    // The next step's rows of these keys (a step ahead, as the FMA scores),
    // a share per chunk while the tile products run.
    const int64_t per_chunk = (cn + chunks - 1) / chunks;
    _tile_zero(0);
    if (two_row_tiles) _tile_zero(1);
    if (groups > 1) {
      _tile_zero(2);
      if (two_row_tiles) _tile_zero(3);
    }
    for (int64_t k = 0; k < chunks; ++k) {
      _tile_loadd(4, pieces + k * kChunk, stride);
      if (two_row_tiles) _tile_loadd(5, pieces + 16 * stride + k * kChunk, stride);
      for (int g = 0; g < groups; ++g) {
        _tile_loadd(6, b_tiles[g][k], 64);
        // Tile numbers are immediates: one branch per (group, row tile).
        if (g == 0) {
          _tile_dpbssd(0, 4, 6);
          if (two_row_tiles) _tile_dpbssd(1, 5, 6);
        } else {
          _tile_dpbssd(2, 4, 6);
          if (two_row_tiles) _tile_dpbssd(3, 5, 6);
        }
      }
      const int64_t i0 = c0 + k * per_chunk;
      prefetch_rows<true>(ahead, i0, i0 + per_chunk < c0 + cn ? i0 + per_chunk : c0 + cn, d);
    }
    _tile_stored(0, c_tiles[0][0], 64);
    if (two_row_tiles) _tile_stored(1, c_tiles[0][1], 64);
    if (groups > 1) {
      _tile_stored(2, c_tiles[1][0], 64);
      if (two_row_tiles) _tile_stored(3, c_tiles[1][1], 64);
    }
    for (int g = 0; g < groups; ++g) {
      const int64_t gn = cn - 16 * g < 16 ? cn - 16 * g : 16;
      const __mmask16 keys = static_cast<__mmask16>((1u << gn) - 1u);
      for (int64_t r = 0; r < m; ++r) {
        const int32_t* c = c_tiles[g][r / 4] + (r % 4) * kPieces * 16;
        const float* st = steps + r * kPieces;
        __m512 sum = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 3 * 16)), _mm512_set1_ps(st[3]));
        for (int p = kPieces - 2; p >= 0; --p)
          sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + p * 16)), _mm512_set1_ps(st[p]), sum);
        _mm512_mask_storeu_ps(s + r * lds + c0 + 16 * g, keys, sum);
      }
    }
  }
}

}  // namespace int8_tiles

struct AmxKernels : Kernels, Bf16Packing {
  static constexpr bool kBf16Products = true;
  // The tile unit runs a block's tdpbf16ps while the core goes on with the
  // vector instructions after it (up to its reorder window), so the main loop
  // queues 32-row blocks and runs them a step at a time between pieces of
  // the softmax's exponentials (bf16_block_step).
  static constexpr bool kAsyncProducts = true;
  static int64_t bf16_block_steps(const Bf16Block& j) { return j.k / 32 * (j.a_lo ? 2 : 1); }
  // Step s of block j (amx_block_step): steps 0 .. bf16_block_steps(j) - 1
  // in order, with no other tile code between them.
  static void bf16_block_step(const Bf16Block& j, int64_t s) {
    if (j.a_lo) {
      if (j.cols == 32) amx_block_step<2, 2, true>(j.k, j.a, j.a_lo, j.lda, j.b, j.b_panel, j.c, j.ldc, j.accumulate, s);
      else amx_block_step<2, 1, true>(j.k, j.a, j.a_lo, j.lda, j.b, j.b_panel, j.c, j.ldc, j.accumulate, s);
    } else {
      if (j.cols == 32) amx_block_step<2, 2, false>(j.k, j.a, nullptr, j.lda, j.b, j.b_panel, j.c, j.ldc, j.accumulate, s);
      else amx_block_step<2, 1, false>(j.k, j.a, nullptr, j.lda, j.b, j.b_panel, j.c, j.ldc, j.accumulate, s);
    }
  }
  // A work item's products run between these: the tile configuration is
  // loaded per item, since other code on the thread (oneDNN under PyTorch)
  // may load its own between our calls, and released after it.
  static void bf16_begin() { _tile_loadconfig(&amx_tile_config()); }
  static void bf16_end() { _tile_release(); }
  // Decode scores of an int8 cache on tiles (int8_tiles above): the main
  // loop splits each work item's query rows once (few_rows_int8_split) and
  // loads the tile configuration for the item (bf16_begin / bf16_end).
  static constexpr bool kFewRowsInt8Tiles = true;
  static constexpr bool kFewRowsInt8Scores = true;  // the main loop's hooks (hide FewRows16Kernels' VNNI ones)
  static bool few_rows_int8_usable(DType /*query: any*/, bool /*bf16_probabilities: exact either way*/, int64_t d) {
    if (d % 4 != 0) return false;  // whole dwords of keys
#ifdef TILEATTN_AMX_EMULATION
    return true;
#else
    return cpu_features().amx_int8;  // the amx rung has AMX-BF16; AMX-INT8 is its own CPUID bit
#endif
  }
  static bool few_rows_int8_split(int64_t m, int64_t d, const float* q, int64_t ldq, int8_t* pieces,
                                  float* steps) {
    return int8_tiles::split_rows(m, d, q, ldq, pieces, steps);
  }
  static void few_rows_int8_scores(int64_t m, int64_t n, int64_t d, const int8_t* pieces, const float* steps,
                                   const void* const* key_rows, float* s, int64_t lds,
                                   const RowsToPrefetch& ahead = {}) {
    int8_tiles::scores(m, n, d, pieces, steps, key_rows, s, lds, ahead);
  }
  static void few_rows_int8_begin() { bf16_begin(); }
  static void few_rows_int8_end() { bf16_end(); }
  // The few-rows P V keeps P at fp32 precision on this rung, with or without
  // bf16_probabilities: this hides FewRows16Kernels' VNNI P V.
  static bool few_rows_dot_probabilities_take(DType /*value_type*/) { return false; }
  static bool few_rows_dot_accumulate_prefetches_k(DType /*value_type*/) { return false; }
  // bf16_kernels.hpp's Bf16DotKernels::bf16_gemm on tiles; k a multiple of 32.
  static void bf16_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                        const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                        RowPrefetch* prefetch = nullptr) {
    if (a_lo) amx_gemm<true>(m, n, k, a, a_lo, lda, b, b_panel, c, ldc, accumulate, prefetch);
    else amx_gemm<false>(m, n, k, a, nullptr, lda, b, b_panel, c, ldc, accumulate, prefetch);
  }
};

}  // namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE
