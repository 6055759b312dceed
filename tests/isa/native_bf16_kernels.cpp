// The native bf16 kernel sets and one native vdpbf16ps / tdpbf16ps
// (bf16_kernel_sets.hpp): bf16_kernels.hpp and amx_kernels.hpp compiled as the
// library compiles them, in a namespace of their own. tests.cmake gives this
// file the AMX flags where the compiler has them; otherwise it defines stubs
// and native_bf16_compiled() says so.
#include "isa/bf16_kernel_sets.hpp"

#if defined(__AVX512BF16__) && defined(__AMX_BF16__) && defined(__AMX_TILE__)

#include <immintrin.h>

#define TILEATTN_AVX512_NAMESPACE bf16_native_test
#include "isa/amx/amx_kernels.hpp"
#include "isa/bf16_kernel_set_of.hpp"

namespace tileattn::testing {

namespace native = detail::bf16_native_test;

bool native_bf16_compiled() { return true; }
Bf16KernelSet native_dot_kernels() { return bf16_kernel_set_of<native::Bf16DotKernels>("native_dot", false); }
Bf16KernelSet native_amx_kernels() { return bf16_kernel_set_of<native::AmxKernels>("native_amx", true); }

void native_dpbf16_ps(const float* acc, const uint16_t* a, const uint16_t* b, float* out) {
  const __m512bh va = (__m512bh)_mm512_loadu_si512(a), vb = (__m512bh)_mm512_loadu_si512(b);
  _mm512_storeu_ps(out, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), va, vb));
}

void native_cvtne2ps_pbh(const float* a, const float* b, uint16_t* out) {
  _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(a), _mm512_loadu_ps(b)));
}

void native_tile_dpbf16ps(const TileProduct& t) {
  const TileProductConfig config(t);
  _tile_loadconfig(config.bytes);
  _tile_loadd(0, t.c, t.c_stride);
  _tile_loadd(1, t.a, t.a_stride);
  _tile_loadd(2, t.b, t.b_stride);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, t.c, t.c_stride);
  _tile_release();
}

}  // namespace tileattn::testing

#else

#include <cstdlib>

namespace tileattn::testing {
bool native_bf16_compiled() { return false; }
Bf16KernelSet native_dot_kernels() { std::abort(); }
Bf16KernelSet native_amx_kernels() { std::abort(); }
void native_dpbf16_ps(const float*, const uint16_t*, const uint16_t*, float*) { std::abort(); }
void native_cvtne2ps_pbh(const float*, const float*, uint16_t*) { std::abort(); }
void native_tile_dpbf16ps(const TileProduct&) { std::abort(); }
}  // namespace tileattn::testing

#endif
