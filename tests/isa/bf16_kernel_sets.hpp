// The bf16 product kernels (Bf16Packing and bf16_gemm of bf16_kernels.hpp and
// amx_kernels.hpp) behind plain function pointers, so that one test can run
// each of them: emulated (emulated_bf16_kernel_sets.cpp, every machine) and
// native (native_bf16_kernels.cpp, compiled with the AMX flags where the
// compiler has them; runs only where the CPU has the instructions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tileattn::testing {

struct Bf16KernelSet {
  std::string name;  // "emulated_dot", "native_amx", ...
  bool amx = false;  // AmxKernels (k a multiple of 32), else Bf16DotKernels
  void (*copy_row)(const void* src, int64_t d, int64_t stride, uint16_t* dst, int64_t k) = nullptr;
  void (*pack_k)(const void* const* rows, int64_t n, int64_t d, int64_t stride, uint16_t* dst,
                 int64_t k) = nullptr;
  void (*pack_v)(const void* const* rows, int64_t n, int64_t d, int64_t stride, uint16_t* dst,
                 int64_t kv_pad) = nullptr;
  void (*split_rows)(const float* p, int64_t ldp, int64_t m, int64_t n, int64_t k, uint16_t* hi,
                     uint16_t* lo, int64_t ld) = nullptr;
  void (*split_transposed)(const float* p, int64_t ldp, int64_t m, int64_t n, int64_t k, uint16_t* hi,
                           uint16_t* lo, int64_t ld) = nullptr;
  // bf16_begin(); bf16_gemm(...); bf16_end(), as one work item runs them.
  void (*gemm)(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
               const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate) = nullptr;
  // P V's lo on int8 products (isa/avx512bf16/lo_int8.hpp; Bf16DotKernels only,
  // null for AmxKernels, whose lo stays bf16).
  bool (*lo_int8_pack_v)(const uint16_t* v, int64_t kv_pad, int64_t d_pad, uint8_t* v_q, float* v_scale) = nullptr;
  void (*lo_int8_exp_rows)(float* s, int64_t ld, int64_t rows, int64_t n, int64_t k, float scale, const float* sub,
                           float* sums, uint16_t* hi, int64_t ld16, int8_t* lo_q, int64_t ld8, float* lo_scale,
                           int32_t* lo_offset, const float* col_scale) = nullptr;
  void (*lo_int8_products)(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                           const int32_t* a_offset, const uint8_t* b, int64_t b_panel, const float* b_scale, float* c,
                           int64_t ldc) = nullptr;
};

Bf16KernelSet emulated_dot_kernels();
Bf16KernelSet emulated_amx_kernels();

// Whether native_bf16_kernels.cpp was compiled with the instructions (the
// compiler knows -mavx512bf16 -mamx-tile -mamx-bf16); if not, the native_*
// functions below must not be called.
bool native_bf16_compiled();
Bf16KernelSet native_dot_kernels();
Bf16KernelSet native_amx_kernels();

// One vdpbf16ps: out[16] = _mm512_dpbf16_ps(acc[16], a[32], b[32]), natively
// and on the emulation.
void native_dpbf16_ps(const float* acc, const uint16_t* a, const uint16_t* b, float* out);
void emulated_dpbf16_ps(const float* acc, const uint16_t* a, const uint16_t* b, float* out);
// One vcvtne2ps2bf16: out[32] = _mm512_cvtne2ps_pbh(a[16], b[16]) (b's words first).
void native_cvtne2ps_pbh(const float* a, const float* b, uint16_t* out);
void emulated_cvtne2ps_pbh(const float* a, const float* b, uint16_t* out);
// The decode products' fp8 e4m3 -> bf16 conversion on byte permutes
// (E4m3ToBf16, isa/avx512/e4m3_permutes.hpp) on the emulation: out[64] = x[64] as bf16.
// (Natively it runs only inside the decode products, checked by the KV
// cache tests where the CPU has AVX512-VBMI.)
void emulated_e4m3_to_bf16(const uint8_t* x, uint16_t* out);
// vpdpbusd instructions the emulation has run so far (all threads): whether
// the emulated forward took P V's lo on int8 products.
int64_t emulated_int8_dot_count();

// One tdpbf16ps on tiles configured as C (m rows x n fp32), A (m rows x
// k_pairs pairs), B (k_pairs rows x n pairs), loaded from c/a/b (row strides
// in bytes), C stored back to c. Needs AMX permission (amx_bf16_usable()).
struct TileProduct {
  int m = 16, n = 16, k_pairs = 16;
  float* c = nullptr;
  const uint16_t* a = nullptr;
  const uint16_t* b = nullptr;
  int64_t c_stride = 64, a_stride = 64, b_stride = 64;
};
void native_tile_dpbf16ps(const TileProduct& t);
void emulated_tile_dpbf16ps(const TileProduct& t);

}  // namespace tileattn::testing
