// Portable kernels: plain C++ that the compiler may vectorize for the
// baseline x86-64 (SSE2) or any other target. Same contract as the SIMD paths.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/exp2_poly.hpp"
#include "core/half.hpp"
#include "core/row_prefetch.hpp"
#include "isa/generic/few_rows_kernels.hpp"
#include "tileattn/types.hpp"

namespace tileattn::detail::generic {

struct Kernels : FewRowsKernels {  // few-rows products: few_rows_kernels.hpp
  // B(p, j) at b + (j / 16) * b_panel + p * ldb + j % 16 (row-major B:
  // b_panel = 16; panel-major: ldb = 16, b_panel = 16 * k); n a multiple of 16.
  // `prefetch`, if given, is advanced a few lines per row of C.
  static void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate, int64_t b_panel = 16,
                   RowPrefetch* prefetch = nullptr) {
    for (int64_t i = 0; i < m; ++i) {
      if (prefetch) prefetch->issue(4);
      float* ci = c + i * ldc;
      if (!accumulate) std::memset(ci, 0, sizeof(float) * n);
      for (int64_t p = 0; p < k; ++p) {
        const float aip = a[i * lda + p];
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
          const float* bp = b + j0 / 16 * b_panel + p * ldb;
          for (int64_t j = 0; j < 16; ++j) ci[j0 + j] += aip * bp[j];
        }
      }
    }
  }

  // Largest of x[0, n); NaN if any element is NaN.
  static float row_max(const float* x, int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (int64_t j = 0; j < n; ++j) {
      m = x[j] > m ? x[j] : m;
      nan |= x[j] != x[j];
    }
    return nan ? std::numeric_limits<float>::quiet_NaN() : m;
  }

  static float exp2(float x) {
    using namespace exp2_poly;
    if (!(x >= kMinInput)) return x != x ? x : 0.0f;  // NaN stays NaN
    if (x > kMaxInput) x = kMaxInput;
    const float n = std::nearbyint(x);
    const float f = x - n;
    float poly = kC6;
    poly = poly * f + kC5;
    poly = poly * f + kC4;
    poly = poly * f + kC3;
    poly = poly * f + kC2;
    poly = poly * f + kC1;
    poly = poly * f + 1.0f;
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
    return poly * bits_to_float(bits);
  }

  static float exp2_sum(float* x, int64_t n, float sub) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      x[j] = exp2(x[j] - sub);
      sum += x[j];
    }
    return sum;
  }

  // Softmax row passes over `rows` rows of a tile (row r at s + r * ld):
  // row_max and exp2_sum per row (the AVX2 path interleaves rows).
  static void row_max_rows(const float* s, int64_t ld, int64_t rows, int64_t n, float* out) {
    for (int64_t r = 0; r < rows; ++r) out[r] = row_max(s + r * ld, n);
  }
  static void exp2_sum_rows(float* s, int64_t ld, int64_t rows, int64_t n, const float* sub,
                            float* sums) {
    for (int64_t r = 0; r < rows; ++r) sums[r] = exp2_sum(s + r * ld, n, sub[r]);
  }
  // Row r: s := exp2(s * scale - sub[r]), sums[r] = its sum: the softmax of
  // raw scores whose scale the products left out (mainloop.hpp,
  // deferred_score_scale). A multiply and a subtraction (two roundings): this
  // build has no FMA instruction, and std::fma per score, a libm call, made
  // the softmax pass 1.4x slower (Intel Xeon model 207).
  static void exp2_sum_rows_scaled(float* s, int64_t ld, int64_t rows, int64_t n, float scale,
                                   const float* sub, float* sums) {
    for (int64_t r = 0; r < rows; ++r) {
      float* x = s + r * ld;
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        x[j] = exp2(x[j] * scale - sub[r]);
        sum += x[j];
      }
      sums[r] = sum;
    }
  }

  static void scale(float* x, int64_t n, float alpha) {
    for (int64_t j = 0; j < n; ++j) x[j] *= alpha;
  }

  static float load_one(const void* src, DType dtype, int64_t index) {
    switch (dtype) {
      case DType::f32: return static_cast<const float*>(src)[index];
      case DType::f16: return f16_to_float(static_cast<const uint16_t*>(src)[index]);
      case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(src)[index]);
      case DType::i8: return float(static_cast<const int8_t*>(src)[index]);
      case DType::f8_e4m3: return f8e4m3_to_float(static_cast<const uint8_t*>(src)[index]);
    }
    return 0.0f;
  }

  // dst[0, n) = scale * src[0, n) (element stride `stride`); dst is zero-padded
  // up to the next multiple of 16.
  // Element j goes to dst + (j / 16) * panel + j % 16; zero-padded to 16.
  static void load_row(const void* src, DType dtype, int64_t n, int64_t stride, float scale,
                       float* dst, int64_t panel = 16) {
    for (int64_t j = 0; j < n; ++j) dst[j / 16 * panel + j % 16] = scale * load_one(src, dtype, j * stride);
    for (int64_t j = n; j % 16 != 0; ++j) dst[j / 16 * panel + j % 16] = 0.0f;
  }

  static void store_row(const float* src, float scale, int64_t n, DType dtype, void* dst,
                        int64_t stride) {
    for (int64_t j = 0; j < n; ++j) store_element(dst, int(dtype), j * stride, src[j] * scale);
  }

  // dst[c * ld + r] = rows[r][c * stride] for r < n_rows, c < d; columns
  // n_rows .. round_up(n_rows, 16) are zeroed.
  // K^T: rows[r][c * stride] to dst + (r / 16) * panel + c * ld + r % 16.
  static void pack_transposed(const void* const* rows, int64_t n_rows, DType dtype, int64_t d,
                              int64_t stride, float* dst, int64_t ld, int64_t panel = 16) {
    const int64_t n_pad = (n_rows + 15) / 16 * 16;
    for (int64_t c = 0; c < d; ++c) {
      float* out = dst + c * ld;
      for (int64_t r = 0; r < n_rows; ++r) out[r / 16 * panel + r % 16] = load_one(rows[r], dtype, c * stride);
      for (int64_t r = n_rows; r < n_pad; ++r) out[r / 16 * panel + r % 16] = 0.0f;
    }
  }
};

}  // namespace tileattn::detail::generic
