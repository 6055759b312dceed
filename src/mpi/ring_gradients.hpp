// The MPI-free half of the ring backward: one rank's share of dQ, dK and dV
// for one K/V slice. Each (query segment, key segment) block that the mask
// lets through (the forward's walk, for_each_block) becomes attention_backward
// calls with this rank's O, dO and the GLOBAL log-sum-exp: with the global
// LSE the recomputed P of a block is exactly the block of the full softmax,
// and D = rowsum(dO o O) is the full row's, so each call returns exactly that
// block's terms of dQ (summed here), dK and dV (summed into the travelling
// fp32 accumulator of the slice). Kept apart from the transport so that a
// single process can replay every rank's work (tests/mpi/ring_block_tests.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "mpi/ring_block.hpp"

namespace tileattn::mpi::detail {

class RingGradients {
 public:
  using Problem = RingAccumulator::Problem;
  // This rank's rows, laid out as q_segments one after another: q, o and d_o
  // [batch, heads, rows, head_dim] in the problem's dtype; lse (fp32, natural
  // log) [batch, heads, rows] as ring_attention_forward wrote it.
  RingGradients(const Problem& problem, InputView q, InputView o, InputView d_o, const float* lse,
                std::array<int64_t, 3> lse_stride, std::vector<Segment> q_segments);

  // Sizes the per-piece dK / dV of absorb for K/V slices of up to
  // max_kv_rows rows up front (absorb grows them otherwise), so that a ring
  // allocates before its first message.
  void reserve(int64_t max_kv_rows);

  // Adds this rank's queries' contribution for one K/V slice: to the local
  // dQ, and to `dk` and `dv`, fp32 [batch, kv_heads, slice rows, head_dim]
  // dense (+=). k and v: [batch, kv_heads, slice rows, head_dim] in the
  // problem's dtype, any strides, rows laid out as kv_segments. Calls `between` after each (block, batch, kv-head)
  // piece, so that a caller can push communication.
  void absorb(InputView k, InputView v, const std::vector<Segment>& kv_segments, float* dk, float* dv,
              const std::function<void()>& between);

  // Writes dQ in the problem's dtype (rounded once, here).
  void write_dq(OutputView dq) const;

  int64_t rows() const { return rows_; }
  int64_t blocks_computed() const { return counts_.computed; }
  int64_t blocks_skipped() const { return counts_.skipped; }
  int64_t visible_pairs() const { return counts_.visible_pairs; }

 private:
  Problem problem_;
  std::vector<Segment> q_segments_;
  int64_t rows_ = 0;
  // The block calls read Q, O, dO and the slices in the storage dtype (bf16
  // keeps its dot products on the bf16 rungs) and write fp32 gradients
  // (BackwardArgs::fp32_gradients), so that no per-block gradient is rounded
  // to fp16/bf16 before the sums.
  InputView q_view_, o_view_, d_o_view_;  // the caller's, (batch, heads, rows, head_dim)
  std::vector<float> lse_;          // (batch, heads, rows)
  std::vector<float> dq_;           // (batch, heads, rows, head_dim) running sum
  // One piece's gradients: dQ (group, rows, head_dim), dK and dV (rows, head_dim).
  std::vector<float> part_dq_, part_dk_, part_dv_;
  BlockCounts counts_;
};

}  // namespace tileattn::mpi::detail
