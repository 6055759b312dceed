// Bf16KernelSet (bf16_kernel_sets.hpp) filled from a Kernels type with the
// bf16 products (Bf16DotKernels or AmxKernels, emulated or native), and the
// tile configuration of one tdpbf16ps (C, A and B in tiles 0, 1 and 2).
// Included by the translation units that define the sets.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "isa/bf16_kernel_sets.hpp"

namespace tileattn::testing {

template <class K>
Bf16KernelSet bf16_kernel_set_of(std::string name, bool amx) {
  Bf16KernelSet s;
  s.name = std::move(name);
  s.amx = amx;
  s.copy_row = [](const void* src, int64_t d, int64_t stride, uint16_t* dst, int64_t k) {
    K::bf16_copy_row(src, d, stride, dst, k);
  };
  s.pack_k = [](const void* const* rows, int64_t n, int64_t d, int64_t stride, uint16_t* dst, int64_t k) {
    K::bf16_pack_k(rows, n, d, stride, dst, k);
  };
  s.pack_v = [](const void* const* rows, int64_t n, int64_t d, int64_t stride, uint16_t* dst, int64_t kv_pad) {
    K::bf16_pack_v(rows, n, d, stride, dst, kv_pad);
  };
  s.split_rows = [](const float* p, int64_t ldp, int64_t m, int64_t n, int64_t k, uint16_t* hi, uint16_t* lo,
                    int64_t ld) { K::bf16_split_rows(p, ldp, m, n, k, hi, lo, ld); };
  s.split_transposed = [](const float* p, int64_t ldp, int64_t m, int64_t n, int64_t k, uint16_t* hi, uint16_t* lo,
                          int64_t ld) { K::bf16_split_transposed(p, ldp, m, n, k, hi, lo, ld); };
  s.gemm = [](int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
              const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate) {
    K::bf16_begin();
    K::bf16_gemm(m, n, k, a, a_lo, lda, b, b_panel, c, ldc, accumulate);
    K::bf16_end();
  };
  if constexpr (K::kLoOnInt8) {
    s.lo_int8_pack_v = [](const uint16_t* v, int64_t kv_pad, int64_t d_pad, uint8_t* v_q, float* v_scale) {
      return K::lo_int8_pack_v(v, kv_pad, d_pad, v_q, v_scale);
    };
    s.lo_int8_exp_rows = [](float* sc, int64_t ld, int64_t rows, int64_t n, int64_t k, float scale, const float* sub,
                            float* sums, uint16_t* hi, int64_t ld16, int8_t* lo_q, int64_t ld8, float* lo_scale,
                            int32_t* lo_offset, const float* col_scale) {
      K::exp2_split_rows_lo_int8(sc, ld, rows, n, k, scale, sub, sums, hi, ld16, lo_q, ld8, lo_scale, lo_offset,
                                 col_scale);
    };
    s.lo_int8_products = [](int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                            const int32_t* a_offset, const uint8_t* b, int64_t b_panel, const float* b_scale, float* c,
                            int64_t ldc) {
      K::lo_int8_products(m, n, k, a, lda, a_scale, a_offset, b, b_panel, b_scale, c, ldc);
    };
  }
  return s;
}

// The 64-byte palette-1 configuration of TileProduct's three tiles.
struct alignas(64) TileProductConfig {
  unsigned char bytes[64] = {};
  explicit TileProductConfig(const TileProduct& t) {
    bytes[0] = 1;
    const uint16_t colsb[3] = {uint16_t(4 * t.n), uint16_t(4 * t.k_pairs), uint16_t(4 * t.n)};
    const uint8_t rows[3] = {uint8_t(t.m), uint8_t(t.m), uint8_t(t.k_pairs)};
    for (int i = 0; i < 3; ++i) {
      std::memcpy(bytes + 16 + 2 * i, &colsb[i], 2);
      bytes[48 + i] = rows[i];
    }
  }
};

}  // namespace tileattn::testing
