// Portable peak loop: baseline x86-64 has SSE2 (4 lanes) and no FMA, so a
// multiply and an add (2 flops per lane) stand in for one FMA; 12 independent
// accumulators cover the multiply + add latency. Inline assembly keeps them
// in registers (see peak_avx2.cpp).
#include "core/peak_kernels.hpp"

namespace tileattn::detail {

namespace {
constexpr int kAccumulators = 12;
constexpr int kLanes = 4;
}  // namespace

#define TILEATTN_MUL_ADD(r) "mulps %%xmm15, %%xmm" #r "\n\taddps %%xmm14, %%xmm" #r "\n\t"

double fma_loop_generic(int64_t iterations, float* sink) {
  if (iterations <= 0) return 0;
  // acc -> acc * a + b converges to b / (1 - a) = 1: no overflow, no denormals.
  const float a = 0.9999f, b = 0.0001f;
  float lane0 = 0;
  int64_t count = iterations;
  __asm__ volatile(
      "movss %[a], %%xmm15\n\t"
      "shufps $0, %%xmm15, %%xmm15\n\t"
      "movss %[b], %%xmm14\n\t"
      "shufps $0, %%xmm14, %%xmm14\n\t"
      "xorps %%xmm0, %%xmm0\n\t"
      "movaps %%xmm0, %%xmm1\n\t"
      "movaps %%xmm0, %%xmm2\n\t"
      "movaps %%xmm0, %%xmm3\n\t"
      "movaps %%xmm0, %%xmm4\n\t"
      "movaps %%xmm0, %%xmm5\n\t"
      "movaps %%xmm0, %%xmm6\n\t"
      "movaps %%xmm0, %%xmm7\n\t"
      "movaps %%xmm0, %%xmm8\n\t"
      "movaps %%xmm0, %%xmm9\n\t"
      "movaps %%xmm0, %%xmm10\n\t"
      "movaps %%xmm0, %%xmm11\n\t"
      "1:\n\t"
      TILEATTN_MUL_ADD(0) TILEATTN_MUL_ADD(1) TILEATTN_MUL_ADD(2) TILEATTN_MUL_ADD(3)
      TILEATTN_MUL_ADD(4) TILEATTN_MUL_ADD(5) TILEATTN_MUL_ADD(6) TILEATTN_MUL_ADD(7)
      TILEATTN_MUL_ADD(8) TILEATTN_MUL_ADD(9) TILEATTN_MUL_ADD(10) TILEATTN_MUL_ADD(11)
      "dec %[count]\n\t"
      "jnz 1b\n\t"
      "addps %%xmm1, %%xmm0\n\t"
      "addps %%xmm11, %%xmm0\n\t"
      "movss %%xmm0, %[lane0]\n\t"
      : [count] "+r"(count), [lane0] "=m"(lane0)
      : [a] "m"(a), [b] "m"(b)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm14", "xmm15", "cc");
  *sink += lane0;
  return double(iterations) * kAccumulators * kLanes * 2;
}

#undef TILEATTN_MUL_ADD

}  // namespace tileattn::detail
