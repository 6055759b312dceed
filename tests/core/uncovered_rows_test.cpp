// Packed rows outside every sequence of cu_seqlens (rows before cu[0] and
// from cu[batch] on) take part in no attention: the forward writes them as
// rows that see no key (O 0, LSE -inf) and the backward's dQ, dK and dV
// there are 0, on every path, instead of what the buffers held.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tileattn/attention.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/machine.hpp"

namespace tileattn {
namespace {

constexpr int64_t kHeads = 2, kDim = 8, kRowsQ = 8, kRowsK = 9;
const std::vector<int32_t> kCuQ = {1, 3, 7};  // rows 0 and 7 uncovered
const std::vector<int32_t> kCuK = {0, 4, 8};  // row 8 uncovered

std::vector<float> values(int64_t n, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& e : x) {
    seed = seed * 1664525u + 1013904223u;
    e = float(int32_t(seed >> 8) % 2001 - 1000) / 1000.0f;
  }
  return x;
}

// [total rows, heads, dim] packed (FlashAttention's varlen layout).
std::array<int64_t, 4> packed() { return {0, kDim, kHeads * kDim, 1}; }
bool row_is(const std::vector<float>& x, int64_t row, float value) {
  for (int64_t i = row * kHeads * kDim; i < (row + 1) * kHeads * kDim; ++i)
    if (x[size_t(i)] != value) return false;
  return true;
}

TEST(UncoveredRows, ForwardAndBackwardWriteRowsThatSeeNoKey) {
  std::vector<Isa> isas = {Isa::reference};
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    if (isa_available(isa)) isas.push_back(isa);
  const std::vector<float> q = values(kRowsQ * kHeads * kDim, 1), k = values(kRowsK * kHeads * kDim, 2),
                           v = values(kRowsK * kHeads * kDim, 3), d_o = values(kRowsQ * kHeads * kDim, 4);
  for (Isa isa : isas) {
    SCOPED_TRACE(isa_name(isa));
    std::vector<float> o(q.size(), 42.0f), lse(size_t(kRowsQ * kHeads), 42.0f);
    ForwardArgs f;
    f.shape = {2, kHeads, kHeads, kRowsQ, kRowsK, kDim};
    f.q = {q.data(), packed()};
    f.k = {k.data(), packed()};
    f.v = {v.data(), packed()};
    f.o = {o.data(), packed()};
    f.lse = lse.data();
    f.lse_stride = {0, 1, kHeads};
    f.cu_seqlens_q = kCuQ.data();
    f.cu_seqlens_k = kCuK.data();
    f.isa = isa;
    f.threads = 1;
    attention_forward(f);
    for (int64_t row : {0, 7}) {
      EXPECT_TRUE(row_is(o, row, 0.0f)) << "O row " << row;
      for (int64_t h = 0; h < kHeads; ++h) EXPECT_EQ(lse[size_t(row * kHeads + h)], -INFINITY) << row;
    }
    for (int64_t row = 1; row < 7; ++row) {
      EXPECT_FALSE(row_is(o, row, 42.0f)) << "O row " << row << " not computed";
      EXPECT_TRUE(std::isfinite(lse[size_t(row * kHeads)])) << row;
    }

    std::vector<float> dq(q.size(), 42.0f), dk(k.size(), 42.0f), dv(v.size(), 42.0f);
    BackwardArgs b;
    b.forward = f;
    b.o = {o.data(), packed()};
    b.d_o = {d_o.data(), packed()};
    b.lse = lse.data();
    b.lse_stride = f.lse_stride;
    b.dq = {dq.data(), packed()};
    b.dk = {dk.data(), packed()};
    b.dv = {dv.data(), packed()};
    attention_backward(b);
    for (int64_t row : {0, 7}) EXPECT_TRUE(row_is(dq, row, 0.0f)) << "dQ row " << row;
    EXPECT_TRUE(row_is(dk, 8, 0.0f)) << "dK row 8";
    EXPECT_TRUE(row_is(dv, 8, 0.0f)) << "dV row 8";
    for (int64_t row = 0; row < 8; ++row) EXPECT_FALSE(row_is(dk, row, 42.0f)) << "dK row " << row << " not computed";
  }
}

}  // namespace
}  // namespace tileattn
