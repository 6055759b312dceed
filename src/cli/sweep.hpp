// `tileattn bench --sweep`: a grid of benchmark cases (sequence lengths x head
// dims x masks x dtypes x passes), each (implementation, case) timed in a
// fresh `tileattn bench --json --impl ...` process so that its peak resident
// set is its own (the naive baseline's N x N matrices show up honestly), with
// one result row per (implementation, case) written to a JSON or CSV file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.hpp"

namespace tileattn::cli {

struct SweepPlan {
  std::vector<int64_t> seqs{512, 1024, 2048, 4096, 8192, 16384};
  std::vector<int64_t> dims{64, 128};
  std::vector<std::string> masks{"none", "causal", "window"};
  std::vector<std::string> dtypes{"fp32"};
  std::vector<std::string> passes{"forward"};
  std::vector<std::string> impls{"tileattn", "openblas"};
  int64_t batch = 1, heads = 4, kv_heads = 4;
  int64_t window_left = 256, window_right = 0;  // the "window" mask
  int threads = 1;
  int reps = 0;  // 0: adaptive (adaptive_reps)
  double peak_gflops = 0;  // 0: measured once at the start
  double max_naive_mb = 4096;  // the naive baseline's N x N matrices, above this: skipped
  std::string out;         // "" : no file
  bool json = false;
};

// One case of the grid. Decode cases have one query token and `seq` keys.
struct SweepCase {
  std::string pass, mask, dtype;
  int64_t seq = 0, dim = 0;
  int64_t q_len() const { return pass == "decode" ? 1 : seq; }
};

// Validates the sweep flags (each list entry, --out's extension and folder).
SweepPlan parse_sweep_plan(const Args& args);
// Every combination, in the order they run: pass, dim, mask, dtype, seq.
std::vector<SweepCase> sweep_cases(const SweepPlan& plan);
// FLOPs of one case (4*D per visible pair forward and decode, 10*D backward).
double case_flops(const SweepPlan& plan, const SweepCase& c);
// Timed runs for a case when --reps is not given: about 1.5e11 FLOPs' worth
// (a second or two on a desktop core), 1 to 10.
int adaptive_reps(double flops);
// MiB of the N x N matrices the naive baseline keeps for a case.
double naive_matrix_mb(const SweepCase& c);

// Runs the sweep; `argc/argv` are the bench command line, recorded in the
// output document.
int run_sweep(const SweepPlan& plan, int argc, char** argv);

}  // namespace tileattn::cli
