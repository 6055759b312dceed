// The amx rung: the avx512bf16 rung's kernels plus bf16 products on AMX-BF16 tiles.
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
                                  int64_t s, int64_t a_step = 32) {
  const int64_t a_stride = lda * 2, c_stride = ldc * 4;
  constexpr int64_t kParts = kLo ? 2 : 1;
  const int64_t steps = k / 32 * kParts;
  // Step s: k offset 32 * (s / kParts), A for s % kParts == 0, else A_lo.
  const auto a_of = [&](int64_t t) { return (kLo && t % kParts ? a_lo : a) + t / kParts * a_step; };
  const auto b_of = [&](int64_t t) { return b + t / kParts * 32 * 16; };
  const auto load_a0 = [&](int64_t t) { _tile_loadd(4, a_of(t), a_stride); };
  const auto load_a1 = [&](int64_t t) { _tile_loadd(5, a_of(t) + 16 * lda, a_stride); };
  // B (the packed K or V tile, 64 KiB at 256 keys x D 128) by TILELOADDT1,
  // the load that hints its lines are not reused soon: the tile is read once
  // per 32-row band from L2 anyway, and kept out of L1 it leaves L1 to the
  // band's S, P and O rows, whose tile stores otherwise wait for their lines
  // to come back from L2. Measured (AMX Xeon model 167, bf16, 2 threads,
  // alternating, 3 rounds): H8 N4096 D128 0.95-0.98 of the time, causal
  // 0.95-0.98, causal GQA 32/8 N2048 0.90-0.98, H16 N4096 D64 0.97-1.0, the
  // backward (1 thread) even; a micro-benchmark of a band's Q K^T blocks
  // 19.2 against 24.9 TSC ticks per tdpbf16ps. The A operands (Q, P hi/lo,
  // reused across a band's column blocks) streamed too took 1.02-1.07x.
  const auto load_b0 = [&](int64_t t) { _tile_stream_loadd(6, b_of(t), 64); };
  const auto load_b1 = [&](int64_t t) { _tile_stream_loadd(7, b_of(t) + b_panel, 64); };
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
                             int64_t b_panel, float* c, int64_t ldc, bool accumulate, int64_t a_step) {
  const int64_t steps = k / 32 * (kLo ? 2 : 1);
  for (int64_t s = 0; s < steps; ++s)
    amx_block_step<RT, CT, kLo>(k, a, a_lo, lda, b, b_panel, c, ldc, accumulate, s, a_step);
}

// One band of rows (RT row tiles) across every column panel.
template <int RT, bool kLo>
static inline void amx_rows(int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                            const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                            int64_t a_step) {
  int64_t j = 0;
  for (; j + 32 <= n; j += 32)
    amx_block<RT, 2, kLo>(k, a, a_lo, lda, b + j / 16 * b_panel, b_panel, c + j, ldc, accumulate, a_step);
  if (j < n) amx_block<RT, 1, kLo>(k, a, a_lo, lda, b + j / 16 * b_panel, b_panel, c + j, ldc, accumulate, a_step);
}

template <bool kLo>
static inline void amx_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                            const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                            RowPrefetch* prefetch, int64_t a_step) {
  constexpr int64_t kPrefetchLinesPerBand = 16;
  int64_t i = 0;
  for (; i + 32 <= m; i += 32) {
    amx_rows<2, kLo>(n, k, a + i * lda, kLo ? a_lo + i * lda : nullptr, lda, b, b_panel, c + i * ldc, ldc,
                     accumulate, a_step);
    if (prefetch) prefetch->issue(kPrefetchLinesPerBand);
  }
  if (i + 16 <= m) {
    amx_rows<1, kLo>(n, k, a + i * lda, kLo ? a_lo + i * lda : nullptr, lda, b, b_panel, c + i * ldc, ldc,
                     accumulate, a_step);
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
                         16, accumulate, a_step);
    for (int64_t r = 0; r < rows; ++r) _mm512_storeu_ps(c + (i + r) * ldc + j, _mm512_load_ps(block + r * 16));
  }
}

// The amx rung: the avx512bf16 rung's kernels (its packing, and its few-rows
// decode scores of bf16 and fp8 caches on vdpbf16ps) with the packed bf16
// products on tiles.
struct AmxKernels : Bf16DotKernels {
  static constexpr bool kBf16Products = true;
  // P V's lo stays bf16 on the tiles (lo_int8.hpp is vdpbf16ps' companion).
  static constexpr bool kLoOnInt8 = false;
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
      if (j.cols == 32) amx_block_step<2, 2, true>(j.k, j.a, j.a_lo, j.lda, j.b, j.b_panel, j.c, j.ldc, j.accumulate, s, j.a_step);
      else amx_block_step<2, 1, true>(j.k, j.a, j.a_lo, j.lda, j.b, j.b_panel, j.c, j.ldc, j.accumulate, s, j.a_step);
    } else {
      if (j.cols == 32) amx_block_step<2, 2, false>(j.k, j.a, nullptr, j.lda, j.b, j.b_panel, j.c, j.ldc, j.accumulate, s, j.a_step);
      else amx_block_step<2, 1, false>(j.k, j.a, nullptr, j.lda, j.b, j.b_panel, j.c, j.ldc, j.accumulate, s, j.a_step);
    }
  }
  // A work item's products run between these: the tile configuration is
  // loaded per item, since other code on the thread (oneDNN under PyTorch)
  // may load its own between our calls, and released after it.
  static void bf16_begin() { _tile_loadconfig(&amx_tile_config()); }
  static void bf16_end() { _tile_release(); }
  // The few-rows P V keeps P at fp32 precision on this rung, with or without
  // bf16_probabilities (FMA products): measured on an AMX Xeon (family 6
  // model 167, `tileattn decode --prompt 8192 --steps 32 --threads 2
  // --bf16-probabilities`, 3 rounds), the vdpbf16ps P V took 1.08x the time
  // of the FMA P V with an fp8 cache and 1.05x with a bf16 one; an int8
  // cache's VNNI P V was even with the FMA one (docs/inference.md).
  static bool few_rows_dot_probabilities_take(DType /*value_type*/) { return false; }
  // Decode scores on vdpbf16ps for fp8 keys only: a bf16 key widens to fp32
  // with two instructions, and here one vdpbf16ps holds both FMA ports for
  // two cycles (8 vdpbf16ps + 8 FMAs take 20 cycles, 8 vdpbf16ps alone 16):
  // bf16 steps in cache take 0.95x the time, cold ones even (docs/inference.md).
  static bool few_rows_dot_scores_take(DType key_type) {
    return key_type == DType::f8_e4m3 && few_rows_dot_vbmi();
  }
  // bf16_kernels.hpp's Bf16DotKernels::bf16_gemm on tiles; k a multiple of 32.
  // a_step: as Bf16Block's (64: A and A_lo interleaved by 32-element pieces).
  static void bf16_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                        const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                        RowPrefetch* prefetch = nullptr, int64_t a_step = 32) {
    if (a_lo) amx_gemm<true>(m, n, k, a, a_lo, lda, b, b_panel, c, ldc, accumulate, prefetch, a_step);
    else amx_gemm<false>(m, n, k, a, nullptr, lda, b, b_panel, c, ldc, accumulate, prefetch, a_step);
  }
};

}  // namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE
