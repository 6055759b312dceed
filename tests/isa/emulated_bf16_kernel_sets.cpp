// The emulated bf16 kernel sets and the emulated vdpbf16ps / tdpbf16ps
// (bf16_kernel_sets.hpp). No <immintrin.h> here.
#include "isa/emulated_bf16_kernels.hpp"

#include "isa/bf16_kernel_set_of.hpp"

namespace tileattn::testing {

namespace emulated = detail::bf16_emulated;

Bf16KernelSet emulated_dot_kernels() { return bf16_kernel_set_of<emulated::Bf16DotKernels>("emulated_dot", false); }
Bf16KernelSet emulated_amx_kernels() { return bf16_kernel_set_of<emulated::AmxKernels>("emulated_amx", true); }

void emulated_dpbf16_ps(const float* acc, const uint16_t* a, const uint16_t* b, float* out) {
  using namespace emulated;
  __m512bh va, vb;
  std::memcpy(&va, a, 64);
  std::memcpy(&vb, b, 64);
  _mm512_storeu_ps(out, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), va, vb));
}

void emulated_cvtne2ps_pbh(const float* a, const float* b, uint16_t* out) {
  using namespace emulated;
  const __m512i r = bf16_bits(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(a), _mm512_loadu_ps(b)));
  std::memcpy(out, &r, 64);
}

void emulated_e4m3_to_bf16(const uint8_t* x, uint16_t* out) {
  using namespace emulated;
  __m512i v, k0, k1;
  std::memcpy(&v, x, 64);
  const few_rows_dot::E4m3ToBf16 to_bf16;
  to_bf16(v, k0, k1);
  std::memcpy(out, &k0, 64);
  std::memcpy(out + 32, &k1, 64);
}

int64_t emulated_int8_dot_count() { return emulated::int8_dot_count.load(); }

void emulated_tile_dpbf16ps(const TileProduct& t) {
  using namespace emulated;
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

#ifdef _IMMINTRIN_H_INCLUDED
#error "the emulated bf16 translation units must not include <immintrin.h>"
#endif
