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

#include "tileattn/attention.hpp"
#include "tileattn/mpi.hpp"

namespace tileattn::mpi::detail {

// Larger than any sequence; stands for "-1: unbounded" so that the band
// arithmetic needs no special cases.
inline constexpr int64_t kUnboundedSide = int64_t{1} << 60;

// The mask in global positions: key j is visible to query i when
// i - left <= j <= i + right.
struct Band {
  int64_t left = kUnboundedSide;
  int64_t right = kUnboundedSide;
};
// causal narrows the right side to 0; -1 means unbounded.
Band make_band(bool causal, int64_t window_left, int64_t window_right);

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

// The running result of one rank's queries: fp32 (O, LSE) over every key
// slice absorbed so far.
class RingAccumulator {
 public:
  struct Problem {
    int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0;
    DType dtype = DType::f32;
    float scale = 0;  // NaN: 1/sqrt(head_dim)
    int threads = 0;
    Isa isa = Isa::automatic;
    Band band;
  };
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

  int64_t blocks_computed() const { return blocks_computed_; }
  int64_t blocks_skipped() const { return blocks_skipped_; }
  int64_t visible_pairs() const { return visible_pairs_; }

 private:
  Problem problem_;
  InputView q_;
  std::vector<Segment> q_segments_;
  int64_t rows_ = 0;
  std::vector<float> o_;    // (batch, heads, rows, head_dim)
  std::vector<float> lse_;  // (batch, heads, rows)
  // One piece's partial result: (group, rows, head_dim) in the storage dtype,
  // its fp32 copy and its LSE, group = heads / kv_heads.
  std::vector<unsigned char> part_storage_;
  std::vector<float> part_o_;
  std::vector<float> part_lse_;
  int64_t blocks_computed_ = 0, blocks_skipped_ = 0, visible_pairs_ = 0;
};

}  // namespace tileattn::mpi::detail
