// A portable model of the AMX tile instructions that src/isa/amx/amx_kernels.hpp
// uses (_tile_loadconfig, _tile_loadd, _tile_stream_loadd, _tile_stored, _tile_zero,
// _tile_dpbf16ps, _tile_release), so that its kernels and the main loop on
// them run on CPUs without AMX.
//
// Use, in a test translation unit that never includes <immintrin.h>, after
// the AVX-512 emulation's two macros (emulated_bf16_kernels.hpp):
//   #define TILEATTN_AMX_EMULATION "isa/amx_emulation.hpp"
//   #include "isa/amx/amx_kernels.hpp"
//
// The state is per thread, as the tile registers are: palette 1, eight tiles,
// each with its configured rows (<= 16) and bytes per row (<= 64, a multiple
// of 4). Faithful where a wrong kernel would show, stopping loudly (abort)
// where the hardware raises #UD or #GP:
//  - any tile instruction but _tile_loadconfig without a loaded configuration
//    (after _tile_release too), and a tile the configuration leaves unused;
//  - a configuration other than palette 1 with rows <= 16 and bytes per row
//    <= 64 in tiles 0-7, and zeros in the reserved bytes and tiles 8-15;
//  - tdpbf16ps on tiles whose shapes do not fit (A's rows != C's rows, A's
//    bytes per row / 4 != B's rows, B's bytes per row != C's), or on tiles
//    that are not three different ones;
//  - loads and stores touch exactly rows x bytes per row at base + r * stride;
//    a load zeroes the rest of the tile, as the hardware does.
// tdpbf16ps computes, per element C[m][n] (the SDM's current pseudo-code, not
// the Intrinsics Guide's older one, which accumulates into C directly):
//   even = odd = +0
//   for each pair k: even += A[m].bf16[2k] * B[k].bf16[2n]      (one rounding)
//                    odd  += A[m].bf16[2k+1] * B[k].bf16[2n+1]  (one rounding)
//   C[m][n] = C[m][n] + (even + odd)
// where `+= x * y` is bf16_dot_semantics::dot_step (exact product, DAZ, FTZ
// after rounding, nearest even) and `+` its add_step (C's NaN first, then
// even's, then odd's). Measured on an Intel Xeon (Sapphire Rapids class),
// 2026-12: 30 million random elements of full 16 x 16 x 32 tiles, with
// denormals, infinities, NaNs, out-of-range products and cancellation, zero
// mismatches, NaN bits included. The Intrinsics Guide's order (C += each
// product in turn, even then odd) disagrees on 38% of those elements, one
// rounding of C + both products per pair on 51%, other NaN priorities on 7%
// (of all elements). amx_tile_model_test.cpp
// repeats a sample, with partial shapes, wherever AMX is usable.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "isa/bf16_dot_semantics.hpp"

#ifndef TILEATTN_AVX512_NAMESPACE
#error "define TILEATTN_AVX512_NAMESPACE (as for the AVX-512 emulation) before including the AMX emulation"
#endif

namespace tileattn::amx_emulation {

[[noreturn]] inline void fault(const char* what) {
  std::fprintf(stderr, "amx emulation: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

constexpr int kTiles = 8, kMaxRows = 16, kMaxBytesPerRow = 64;

struct TileState {
  bool configured = false;
  uint8_t rows[kTiles] = {};
  uint16_t bytes_per_row[kTiles] = {};
  alignas(64) unsigned char data[kTiles][kMaxRows][kMaxBytesPerRow] = {};
};
inline TileState& state() {
  thread_local TileState s;
  return s;
}
// The tile, which must be configured.
inline int checked_tile(int tile, const char* what) {
  const TileState& s = state();
  if (!s.configured) fault(what);
  if (tile < 0 || tile >= kTiles || s.rows[tile] == 0 || s.bytes_per_row[tile] == 0)
    fault("tile not configured (#UD)");
  return tile;
}

// LDTILECFG: the 64-byte configuration (palette 0 releases).
inline void _tile_loadconfig(const void* config) {
  unsigned char c[64];
  std::memcpy(c, config, 64);
  TileState& s = state();
  if (c[0] == 0) {
    s = TileState{};
    return;
  }
  if (c[0] != 1) fault("_tile_loadconfig: palette other than 1 (#GP)");
  for (int i = 2; i < 16; ++i)
    if (c[i]) fault("_tile_loadconfig: reserved bytes 2-15 not zero (#GP)");
  TileState next;
  next.configured = true;
  for (int t = 0; t < 16; ++t) {
    uint16_t bytes;
    std::memcpy(&bytes, c + 16 + 2 * t, 2);
    const uint8_t rows = c[48 + t];
    if (t >= kTiles) {
      if (bytes || rows) fault("_tile_loadconfig: tiles 8-15 configured (#GP)");
      continue;
    }
    if (rows > kMaxRows || bytes > kMaxBytesPerRow || bytes % 4 != 0 || (rows == 0) != (bytes == 0))
      fault("_tile_loadconfig: tile shape out of palette 1's limits (#GP)");
    next.rows[t] = rows;
    next.bytes_per_row[t] = bytes;
  }
  s = next;
}

inline void _tile_release() { state() = TileState{}; }

inline void _tile_zero(int tile) {
  checked_tile(tile, "_tile_zero without a tile configuration (#UD)");
  std::memset(state().data[tile], 0, sizeof state().data[tile]);
}

inline void _tile_loadd(int tile, const void* base, int64_t stride) {
  checked_tile(tile, "_tile_loadd without a tile configuration (#UD)");
  TileState& s = state();
  std::memset(s.data[tile], 0, sizeof s.data[tile]);
  for (int r = 0; r < s.rows[tile]; ++r)
    std::memcpy(s.data[tile][r], static_cast<const char*>(base) + r * stride, s.bytes_per_row[tile]);
}

// TILELOADDT1: the same load with a hint that the data is not reused soon.
inline void _tile_stream_loadd(int tile, const void* base, int64_t stride) { _tile_loadd(tile, base, stride); }

inline void _tile_stored(int tile, void* base, int64_t stride) {
  checked_tile(tile, "_tile_stored without a tile configuration (#UD)");
  const TileState& s = state();
  for (int r = 0; r < s.rows[tile]; ++r)
    std::memcpy(static_cast<char*>(base) + r * stride, s.data[tile][r], s.bytes_per_row[tile]);
}

// TDPBF16PS c, a, b: C (M x N fp32) += A (M x K pairs) B (K pair rows x N pairs).
inline void _tile_dpbf16ps(int c, int a, int b) {
  const char* what = "_tile_dpbf16ps without a tile configuration (#UD)";
  checked_tile(c, what), checked_tile(a, what), checked_tile(b, what);
  if (c == a || c == b || a == b) fault("_tile_dpbf16ps: operands not three different tiles (#UD)");
  TileState& s = state();
  const int m_rows = s.rows[c], n_cols = s.bytes_per_row[c] / 4, k_pairs = s.bytes_per_row[a] / 4;
  if (s.rows[a] != m_rows || s.rows[b] != k_pairs || s.bytes_per_row[b] != s.bytes_per_row[c])
    fault("_tile_dpbf16ps: tile shapes do not fit (#UD)");
  using bf16_dot_semantics::add_step;
  using bf16_dot_semantics::dot_step;
  for (int m = 0; m < m_rows; ++m) {
    uint16_t a_row[kMaxBytesPerRow / 2];
    std::memcpy(a_row, s.data[a][m], sizeof a_row);
    for (int n = 0; n < n_cols; ++n) {
      float even = 0.0f, odd = 0.0f;
      for (int k = 0; k < k_pairs; ++k) {
        uint16_t b_pair[2];
        std::memcpy(b_pair, s.data[b][k] + 4 * n, sizeof b_pair);
        even = dot_step(even, a_row[2 * k], b_pair[0]);
        odd = dot_step(odd, a_row[2 * k + 1], b_pair[1]);
      }
      float acc;
      std::memcpy(&acc, s.data[c][m] + 4 * n, 4);
      acc = add_step(acc, add_step(even, odd));
      std::memcpy(s.data[c][m] + 4 * n, &acc, 4);
    }
  }
}

}  // namespace tileattn::amx_emulation

// The kernels' namespace sees the emulated names by unqualified lookup.
namespace tileattn::detail::TILEATTN_AVX512_NAMESPACE {
using namespace tileattn::amx_emulation;
}
