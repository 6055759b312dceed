// AVX2 peak loop: two FMA pipes x 8 lanes with an FMA latency of 4-5 cycles,
// so at least 10 independent accumulators keep both pipes busy; 12 are used.
// Written in inline assembly because the compiler spilled an accumulator
// array to the stack (a store-forwarding chain that measured 7x too slow).
#include "core/peak_kernels.hpp"

namespace tileattn::detail {

namespace {
constexpr int kAccumulators = 12;
constexpr int kLanes = 8;
}  // namespace

double fma_loop_avx2(int64_t iterations, float* sink) {
  if (iterations <= 0) return 0;
  // acc -> acc * a + b converges to b / (1 - a) = 1: no overflow, no denormals.
  const float a = 0.9999f, b = 0.0001f;
  float lane0 = 0;
  int64_t count = iterations;
  __asm__ volatile(
      "vbroadcastss %[a], %%ymm15\n\t"
      "vbroadcastss %[b], %%ymm14\n\t"
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
      "vmovaps %%ymm0, %%ymm1\n\t"
      "vmovaps %%ymm0, %%ymm2\n\t"
      "vmovaps %%ymm0, %%ymm3\n\t"
      "vmovaps %%ymm0, %%ymm4\n\t"
      "vmovaps %%ymm0, %%ymm5\n\t"
      "vmovaps %%ymm0, %%ymm6\n\t"
      "vmovaps %%ymm0, %%ymm7\n\t"
      "vmovaps %%ymm0, %%ymm8\n\t"
      "vmovaps %%ymm0, %%ymm9\n\t"
      "vmovaps %%ymm0, %%ymm10\n\t"
      "vmovaps %%ymm0, %%ymm11\n\t"
      "1:\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm0\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm1\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm2\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm3\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm4\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm5\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm6\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm7\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm8\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm9\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm10\n\t"
      "vfmadd132ps %%ymm15, %%ymm14, %%ymm11\n\t"
      "dec %[count]\n\t"
      "jnz 1b\n\t"
      "vaddps %%ymm1, %%ymm0, %%ymm0\n\t"
      "vaddps %%ymm11, %%ymm0, %%ymm0\n\t"
      "vmovss %%xmm0, %[lane0]\n\t"
      "vzeroupper\n\t"
      : [count] "+r"(count), [lane0] "=m"(lane0)
      : [a] "m"(a), [b] "m"(b)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm14", "xmm15", "cc");
  *sink += lane0;
  return double(iterations) * kAccumulators * kLanes * 2;
}

}  // namespace tileattn::detail
