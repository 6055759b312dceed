// The MPI-free half of ring attention: which (query segment, key segment)
// pairs a mask lets through, how each becomes one attention_forward call, and
// the running (O, LSE) that the partial results are merged into. Kept apart
// from the transport so that a single process can replay every rank's work
// (tests/mpi/ring_block_tests.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/band.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/mpi.hpp"

namespace tileattn::mpi::detail {

// The mask in global positions: the library's band (core/band.hpp) with
// offset 0, key j visible to query i when i - left <= j <= i + right.
// causal narrows the right side to 0; -1 means unbounded (kUnbounded, so
// that the band arithmetic needs no special cases).
using tileattn::detail::Band;
using tileattn::detail::make_band;

// A query segment against a key segment, both trimmed to the rows and keys
// the band lets meet, and the band restated in ForwardArgs' bottom-right
// alignment for those trimmed lengths (offset = keys - queries).
struct Block {
  Segment q, k;
  int64_t window_left = -1, window_right = -1;  // -1: that side clips nothing
};
// nullopt when no query of q sees any key of k (causal: k is in the future).
std::optional<Block> plan_block(Segment q, Segment k, Band band);
// (query, key) pairs of the block inside the band.
int64_t visible_pairs(const Block& block);

// The problem as the block walk and its calls see it (one per ring call).
struct RingProblem {
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::f32;
  float scale = 0;  // NaN: 1/sqrt(head_dim)
  int threads = 0;
  Isa isa = Isa::automatic;
  Band band;
};

// Writes a dense fp32 [batch, heads, rows, head_dim] tensor into `out` in
// `dtype` (the one rounding of a gradient).
void write_rounded(const float* dense, int64_t batch, int64_t heads, int64_t rows, int64_t head_dim,
                   DType dtype, OutputView out);

// The address of (batch b, head h, row r) of a view with `esize`-byte elements.
const void* row_at(const InputView& view, int64_t esize, int64_t b, int64_t h, int64_t r);

// One piece's attention_forward arguments, tensors aside: the block's shape
// for the heads sharing one K/V head, its band, and the problem's options,
// with `dtype` the type the call reads (the storage dtype; the calls write
// fp32: fp32_output, fp32_gradients).
ForwardArgs piece_args(const RingProblem& p, const Block& block, DType dtype);

// What the walk counts: blocks computed and skipped, and the (query, key)
// pairs inside the band over all batches and heads.
struct BlockCounts {
  int64_t computed = 0, skipped = 0, visible_pairs = 0;
};

// A planned block and where it sits: q_row is its first row among the rank's
// query rows (q_segments end to end), k_row its first row in the K/V slice
// (kv_segments end to end).
struct PlacedBlock {
  Block block;
  int64_t q_row = 0, k_row = 0;
};

// The walk the forward and the backward share: every (query segment, key
// segment) pair in order, planned with plan_block. A pair the band rules out
// is counted as skipped; any other is counted and handed to
// piece(placed, batch, kv_head) once per (batch, kv head), so that the heads
// sharing a K/V head go together, with `between` after each piece, often
// enough for a caller to keep transfers moving.
template <typename Piece>
void for_each_block(const RingProblem& p, const std::vector<Segment>& q_segments,
                    const std::vector<Segment>& kv_segments, BlockCounts& counts,
                    const std::function<void()>& between, Piece&& piece) {
  int64_t q_row0 = 0;
  for (const Segment& qs : q_segments) {
    int64_t k_row0 = 0;
    for (const Segment& ks : kv_segments) {
      if (const std::optional<Block> block = plan_block(qs, ks, p.band)) {
        ++counts.computed;
        counts.visible_pairs += visible_pairs(*block) * p.batch * p.heads;
        const PlacedBlock placed{*block, q_row0 + (block->q.begin - qs.begin), k_row0 + (block->k.begin - ks.begin)};
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t g = 0; g < p.kv_heads; ++g) {
            piece(placed, b, g);
            if (between) between();
          }
      } else {
        ++counts.skipped;
      }
      k_row0 += ks.size();
    }
    q_row0 += qs.size();
  }
}

// The running result of one rank's queries: fp32 (O, LSE) over every key
// slice absorbed so far. The piece calls read Q and the K/V slices in their
// storage dtype (bf16 keeps its dot products on the bf16 rungs) and write
// their partial O in fp32 (ForwardArgs::fp32_output), so that no partial O
// is rounded to fp16/bf16 before the merges; O is rounded once, in write.
class RingAccumulator {
 public:
  using Problem = RingProblem;
  // q: this rank's queries [batch, heads, rows, head_dim] laid out as
  // q_segments one after another.
  RingAccumulator(const Problem& problem, InputView q, std::vector<Segment> q_segments);

  // Attends the queries to one K/V slice ([batch, kv_heads, rows, head_dim],
  // rows laid out as kv_segments) and merges. Calls `between` after each
  // (block, batch, kv-head) piece, so that a caller can push communication.
  void absorb(InputView k, InputView v, const std::vector<Segment>& kv_segments,
              const std::function<void()>& between);

  // Writes O (in the problem's dtype) and, when lse is not null, the LSE.
  void write(OutputView o, float* lse, std::array<int64_t, 3> lse_stride) const;

  int64_t blocks_computed() const { return counts_.computed; }
  int64_t blocks_skipped() const { return counts_.skipped; }
  int64_t visible_pairs() const { return counts_.visible_pairs; }

 private:
  Problem problem_;
  InputView q_;  // the caller's, in the storage dtype
  std::vector<Segment> q_segments_;
  int64_t rows_ = 0;
  std::vector<float> o_;    // (batch, heads, rows, head_dim)
  std::vector<float> lse_;  // (batch, heads, rows)
  // One piece's partial result: (group, rows, head_dim) and its LSE, group =
  // heads / kv_heads.
  std::vector<float> part_o_;
  std::vector<float> part_lse_;
  BlockCounts counts_;
};

}  // namespace tileattn::mpi::detail
