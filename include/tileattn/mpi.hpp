// Context-parallel ("ring") attention over MPI: the sequence is split across
// the ranks of a communicator, every rank keeps its own slice of Q, K, V and
// O, and the K/V slices travel once around the ring. Each rank attends its
// queries to the slice it holds now while the next slice is in flight, and
// folds the partial (O, LSE) into a running result with merge_states.
//
// Self-attention only: queries and keys share global positions 0..seqlen-1,
// so a causal mask means key position <= query position.
// See docs/ring_attention.md for the split, the traffic and its scaling.
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tileattn/attention.hpp"

namespace tileattn::mpi {

// Consecutive global sequence positions [begin, end).
struct Segment {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// How the sequence is cut across ranks.
//  contiguous: rank r holds the r-th of P equal slices.
//  zigzag:     the sequence is cut into 2P chunks and rank r holds chunks r
//              and 2P-1-r, so under a causal mask every rank has the same
//              amount of visible work at every ring step.
enum class ShardLayout : int { contiguous = 0, zigzag = 1 };
const char* shard_layout_name(ShardLayout layout);
ShardLayout parse_shard_layout(const std::string& name);  // throws Error

// Which global rows each rank holds (the same rows of Q, K, V and O). A rank's
// local row 0 is the first position of its first segment; segments follow
// each other in local-row order. Sizes differ by at most one row per chunk
// when seqlen does not divide; a rank may hold no rows (seqlen < chunks).
class ShardPlan {
 public:
  ShardPlan(int64_t seqlen, int ranks, ShardLayout layout);
  int ranks() const { return int(segments_.size()); }
  int64_t seqlen() const { return seqlen_; }
  ShardLayout layout() const { return layout_; }
  const std::vector<Segment>& segments(int rank) const { return segments_.at(size_t(rank)); }
  int64_t rows(int rank) const;
  int64_t max_rows() const;
  // Global position of a rank's local row.
  int64_t global_row(int rank, int64_t local_row) const;

 private:
  int64_t seqlen_;
  ShardLayout layout_;
  std::vector<std::vector<Segment>> segments_;
};

struct RingArgs {
  MPI_Comm comm = MPI_COMM_WORLD;
  ShardLayout layout = ShardLayout::zigzag;
  // Global shape: seqlen_q == seqlen_k == the whole sequence.
  AttentionShape shape;
  DType dtype = DType::f32;
  // This rank's slices, rows = ShardPlan(...).rows(rank), any strides:
  InputView q;  // [batch, heads, rows, head_dim]
  InputView k;  // [batch, kv_heads, rows, head_dim]
  InputView v;  // [batch, kv_heads, rows, head_dim]
  OutputView o;  // [batch, heads, rows, head_dim]
  float* lse = nullptr;  // optional, [batch, heads, rows], natural log, -inf: no visible key
  std::array<int64_t, 3> lse_stride{0, 0, 1};
  // Mask in global positions: key j is visible to query i when
  // i - window_left <= j <= i + window_right (-1: unbounded); causal == window_right 0.
  bool causal = false;
  int64_t window_left = -1;
  int64_t window_right = -1;
  float scale = std::numeric_limits<float>::quiet_NaN();  // NaN: 1/sqrt(head_dim)
  int threads = 0;           // per rank, as ForwardArgs::threads
  Isa isa = Isa::automatic;
};

// What one rank did, for reports and scaling estimates.
struct RingStats {
  int steps = 0;                // ring steps (= ranks)
  int64_t blocks_computed = 0;  // (query segment, key segment) pairs attended
  int64_t blocks_skipped = 0;   // pairs entirely outside the mask (causal: in the future)
  int64_t visible_pairs = 0;    // (query, key) pairs inside the mask, summed over heads and batch
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  double total_s = 0;    // the whole call
  double compute_s = 0;  // attention and merging
  double wait_s = 0;     // blocked waiting for the next K/V slice (communication not hidden)
};

// Collective over args.comm: every rank calls it with its own slices and the
// same shape, mask, layout and dtype. Arguments are checked, the path
// (`isa`, TILEATTN_ISA) resolved and every buffer allocated on every rank
// before any data moves; when any rank fails, every rank throws, so none is
// left waiting: the failing rank its own exception (Error naming the
// argument, NotSupported for a path or feature it lacks, std::bad_alloc),
// the others the same kind with "rank R: " and its message. An exception
// during the compute is held until the ring ends and then thrown the same
// way on every rank. Nothing is written when it throws. MPI errors abort,
// as MPI's default error handler does.
RingStats ring_attention_forward(const RingArgs& args);

// The backward of ring_attention_forward: dQ, dK and dV of this rank's rows,
// from its rows of O, dO and LSE (the forward's outputs). The K/V slices
// travel the ring as in the forward, each with an fp32 dK/dV accumulator one
// step behind; dQ stays. Equals single-process attention_backward up to
// rounding. Collective and checked like the forward (every rank throws when
// any rank's arguments are bad).
struct RingBackwardArgs {
  // The forward call's arguments: comm, layout, shape, dtype, q, k, v, mask,
  // scale, threads, isa. forward.o and forward.lse are not used.
  RingArgs forward;
  InputView o;    // [batch, heads, rows, head_dim]: this rank's rows of the forward's O
  InputView d_o;  // same shape: gradient of the loss with respect to O
  const float* lse = nullptr;  // [batch, heads, rows], the forward's LSE (required)
  std::array<int64_t, 3> lse_stride{0, 0, 1};
  OutputView dq;  // [batch, heads, rows, head_dim]
  OutputView dk;  // [batch, kv_heads, rows, head_dim]
  OutputView dv;  // [batch, kv_heads, rows, head_dim]
};
RingStats ring_attention_backward(const RingBackwardArgs& args);

}  // namespace tileattn::mpi
