// Pieces of tileattn-ring shared by its forward (ring_main.cpp) and backward
// (ring_cli_backward.cpp) halves.
#pragma once

#include <cstdint>
#include <functional>

#include "testing/problem_case.hpp"
#include "tileattn/mpi.hpp"

namespace tileattn::mpi::cli {

struct Options {
  testing::Case c;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  ShardLayout layout = ShardLayout::zigzag;
  int threads = 0;
  bool check = false;
  bool backward = false;
  bool help = false;  // --help: print the usage, run nothing
};

// Collective over MPI_COMM_WORLD: runs `work` on this rank, then every rank
// throws when any rank's work threw (mpi/ring_common.hpp's
// agree_on_outcome), so that no rank is left waiting in a later collective
// call for one that failed.
void together(const std::function<void()>& work);

// Copies rows of a [batch, heads, rows, dim] tensor between a full view and a
// rank's slice (dense bhsd both), in either direction.
void copy_rows(const ShardPlan& plan, int rank, int64_t batch, int64_t heads, int64_t dim, size_t esize,
               const unsigned char* from, unsigned char* to, bool full_to_local);

// Gathers every rank's stats on rank 0, which prints one line per rank
// ("<prefix>rank R rows ... bytes_received B") and then
// "<prefix>ms <slowest rank> gflops <flops_per_pair x visible pairs / ms>".
void print_report(const RingStats& stats, int64_t rows, int rank, int ranks, const char* prefix,
                  double flops_per_pair);

// After the forward (forward.o and forward.lse hold this rank's O and LSE):
// random dO from the seed, ring_attention_backward, its report and, with
// --check, the comparison of dQ, dK, dV with the float64 reference and the
// single-process attention_backward on rank 0. Returns false on FAIL (the
// same answer on every rank).
bool run_backward(const Options& opt, testing::CaseData& full, const RingArgs& forward, int rank, int ranks);

}  // namespace tileattn::mpi::cli
