#include "mpi/ring_cli.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "mpi/ring_common.hpp"

namespace tileattn::mpi::cli {

void together(const std::function<void()>& work) {
  detail::agree_on_outcome(MPI_COMM_WORLD, detail::capture(work), "");
}

void copy_rows(const ShardPlan& plan, int rank, int64_t batch, int64_t heads, int64_t dim, size_t esize,
               const unsigned char* from, unsigned char* to, bool full_to_local) {
  const int64_t n = plan.seqlen(), rows = plan.rows(rank);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t global = ((b * heads + h) * n + plan.global_row(rank, r)) * dim;
        const int64_t local = ((b * heads + h) * rows + r) * dim;
        const int64_t src = full_to_local ? global : local, dst = full_to_local ? local : global;
        std::memcpy(to + dst * int64_t(esize), from + src * int64_t(esize), size_t(dim) * esize);
      }
}

void print_report(const RingStats& st, int64_t rows, int rank, int ranks, const char* prefix,
                  double flops_per_pair) {
  const double mine[9] = {double(rows), double(st.blocks_computed), double(st.blocks_skipped),
                          st.compute_s, st.wait_s, st.total_s, double(st.bytes_sent),
                          double(st.bytes_received), double(st.visible_pairs)};
  std::vector<double> all(size_t(9 * ranks));
  MPI_Gather(mine, 9, MPI_DOUBLE, all.data(), 9, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  double slowest = 0, pairs = 0;
  for (int r = 0; r < ranks; ++r) {
    const double* x = &all[size_t(9 * r)];
    std::printf("%srank %d rows %.0f blocks %.0f skipped %.0f compute_ms %.2f wait_ms %.2f total_ms %.2f "
                "bytes_sent %.0f bytes_received %.0f\n",
                prefix, r, x[0], x[1], x[2], 1e3 * x[3], 1e3 * x[4], 1e3 * x[5], x[6], x[7]);
    slowest = std::max(slowest, x[5]);
    pairs += x[8];
  }
  std::printf("%sms %.2f gflops %.2f\n", prefix, 1e3 * slowest, pairs * flops_per_pair / slowest * 1e-9);
}

}  // namespace tileattn::mpi::cli
