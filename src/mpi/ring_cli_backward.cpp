// tileattn-ring --backward: ring_attention_backward after the forward, and
// with --check the comparison of the gathered dQ, dK, dV with the float64
// reference by the gradient tolerance rule (mpi/gradient_check.hpp) and with
// the single-process attention_backward on the same inputs.
#include <mpi.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/half.hpp"
#include "mpi/gradient_check.hpp"
#include "mpi/ring_cli.hpp"
#include "tileattn/backward.hpp"
#include "training/reference_backward.hpp"

namespace tileattn::mpi::cli {

namespace {

// dO, uniform in [-1, 1] in the case's dtype, the same on every rank.
std::vector<unsigned char> random_d_o(const testing::Case& c, int64_t elements) {
  std::mt19937_64 rng(c.seed * 31 + 5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<unsigned char> out(size_t(elements) * dtype_size(c.dtype));
  for (int64_t e = 0; e < elements; ++e) {
    const float x = uniform(rng);
    if (c.dtype == DType::f32) reinterpret_cast<float*>(out.data())[e] = x;
    else if (c.dtype == DType::f16) reinterpret_cast<uint16_t*>(out.data())[e] = tileattn::detail::float_to_f16(x);
    else reinterpret_cast<uint16_t*>(out.data())[e] = tileattn::detail::float_to_bf16(x);
  }
  return out;
}

// Rank 0 collects every rank's rows of a [batch, heads, rows, dim] tensor
// into `full`, receiving through `scratch` (one rank's rows at most).
void gather_rows(const ShardPlan& plan, int rank, int64_t batch, int64_t heads, int64_t dim, size_t esize,
                 const std::vector<unsigned char>& mine, unsigned char* full, std::vector<unsigned char>& scratch,
                 int tag) {
  if (rank != 0) {
    MPI_Send(mine.data(), int(mine.size()), MPI_BYTE, 0, tag, MPI_COMM_WORLD);
    return;
  }
  for (int r = 0; r < plan.ranks(); ++r) {
    const unsigned char* rows = mine.data();
    if (r != 0) {
      MPI_Recv(scratch.data(), int(size_t(batch * heads * plan.rows(r) * dim) * esize), MPI_BYTE, r, tag,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      rows = scratch.data();
    }
    copy_rows(plan, r, batch, heads, dim, esize, rows, full, false);
  }
}

}  // namespace

bool run_backward(const Options& opt, testing::CaseData& full, const RingArgs& forward, int rank, int ranks) {
  const AttentionShape& s = full.args.shape;
  const DType dt = opt.c.dtype;
  const size_t esize = dtype_size(dt);
  const ShardPlan plan(s.seqlen_q, ranks, opt.layout);
  const int64_t rows = plan.rows(rank);
  const int64_t q_elements = s.batch * s.heads * s.seqlen_q * s.head_dim;
  const int64_t k_elements = s.batch * s.kv_heads * s.seqlen_q * s.head_dim;

  // Allocated together, so that a rank out of memory stops every rank.
  std::vector<unsigned char> d_o_full, d_o, dq, dk, dv;
  together([&] {
    d_o_full = random_d_o(opt.c, q_elements);
    d_o.resize(size_t(s.batch * s.heads * rows * s.head_dim) * esize);
    copy_rows(plan, rank, s.batch, s.heads, s.head_dim, esize, d_o_full.data(), d_o.data(), true);
    dq.resize(d_o.size());
    dk.resize(size_t(s.batch * s.kv_heads * rows * s.head_dim) * esize);
    dv.resize(dk.size());
  });

  RingBackwardArgs b;
  b.forward = forward;
  b.o = {forward.o.data, forward.o.stride};
  b.d_o = {d_o.data(), forward.q.stride};
  b.lse = forward.lse;
  b.lse_stride = forward.lse_stride;
  b.dq = {dq.data(), forward.q.stride};
  b.dk = {dk.data(), forward.k.stride};
  b.dv = {dv.data(), forward.k.stride};

  MPI_Barrier(MPI_COMM_WORLD);
  const RingStats st = ring_attention_backward(b);
  // 10 * D flops per visible pair: the five (rows x keys x D) products of the
  // backward, as `tileattn bench --backward` counts them.
  print_report(st, rows, rank, ranks, "backward ", 10.0 * double(s.head_dim));
  if (!opt.check) return true;

  // Rank 0 gathers the ring's gradients (plain int-counted messages: a test tool).
  std::vector<unsigned char> ring_dq, ring_dk, ring_dv, scratch;
  together([&] {
    if (size_t(s.batch * s.heads * plan.max_rows() * s.head_dim) * esize > size_t(INT_MAX))
      throw NotSupported("--check: a gradient slice over 2 GiB cannot be gathered");
    if (rank != 0) return;
    ring_dq.resize(size_t(q_elements) * esize);
    ring_dk.resize(size_t(k_elements) * esize);
    ring_dv.resize(ring_dk.size());
    scratch.resize(size_t(s.batch * s.heads * plan.max_rows() * s.head_dim) * esize);
  });
  gather_rows(plan, rank, s.batch, s.heads, s.head_dim, esize, dq, ring_dq.data(), scratch, 3);
  gather_rows(plan, rank, s.batch, s.kv_heads, s.head_dim, esize, dk, ring_dk.data(), scratch, 4);
  gather_rows(plan, rank, s.batch, s.kv_heads, s.head_dim, esize, dv, ring_dv.data(), scratch, 5);

  // Rank 0's comparison, agreed on: no rank waits on a rank 0 that failed.
  int ok = 1;
  together([&] {
    if (rank != 0) return;
    // The single-process forward and backward on the same inputs (the
    // forward check, if any, left the ring's O in full's buffers).
    attention_forward(full.args);
    std::vector<unsigned char> single_dq(ring_dq.size()), single_dk(ring_dk.size()), single_dv(ring_dk.size());
    BackwardArgs sp;
    sp.forward = full.args;
    sp.o = {full.args.o.data, full.args.o.stride};
    sp.d_o = {d_o_full.data(), full.args.q.stride};
    sp.lse = full.lse.data();
    sp.lse_stride = full.args.lse_stride;
    sp.dq = {single_dq.data(), full.args.q.stride};
    sp.dk = {single_dk.data(), full.args.k.stride};
    sp.dv = {single_dv.data(), full.args.k.stride};
    attention_backward(sp);

    const training::BackwardReference ref = training::reference_backward(sp);
    const training::BackwardReference naive = training::naive_backward(sp);
    double max_delta = 0;  // D = rowsum(dO o O) enters dQ's and dK's floor (testing/tolerance.hpp)
    for (double x : ref.delta)
      if (!std::isnan(x)) max_delta = std::max(max_delta, std::abs(x));
    struct Gradient {
      const char* name;
      const std::vector<unsigned char>& ring;
      const std::vector<unsigned char>& single;
      const std::vector<double>& ref;
      const std::vector<double>& naive;
      int64_t elements;
      double max_delta;  // 0 for dV, which D does not enter
    };
    const Gradient gradients[] = {{"dq", ring_dq, single_dq, ref.dq, naive.dq, q_elements, max_delta},
                                  {"dk", ring_dk, single_dk, ref.dk, naive.dk, k_elements, max_delta},
                                  {"dv", ring_dv, single_dv, ref.dv, naive.dv, k_elements, 0.0}};
    bool nan_mismatch = false;
    for (const Gradient& g : gradients) {
      const std::vector<double> ring = detail::as_double(g.ring.data(), dt, g.elements);
      const std::vector<double> single = detail::as_double(g.single.data(), dt, g.elements);
      const detail::GradientCheck ring_check =
          detail::check_gradient(ring, g.ref, g.naive, dt, s.head_dim, g.max_delta);
      const detail::GradientCheck single_check =
          detail::check_gradient(single, g.ref, g.naive, dt, s.head_dim, g.max_delta);
      double diff = 0;
      for (size_t e = 0; e < ring.size(); ++e) diff = std::max(diff, std::abs(ring[e] - single[e]));
      std::printf("%s_max_error %.3e\n%s_tolerance %.3e\n%s_naive_error %.3e\n%s_single_process_max_error %.3e\n"
                  "%s_max_diff_vs_single_process %.3e\n",
                  g.name, ring_check.error, g.name, ring_check.tolerance, g.name, ring_check.naive_error, g.name,
                  single_check.error, g.name, diff);
      if (!ring_check.ok()) ok = 0;
      nan_mismatch |= ring_check.nan_mismatch;
    }
    std::printf("backward %s%s\n", ok ? "PASS" : "FAIL", nan_mismatch ? " (NaN mismatch)" : "");
  });
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok != 0;
}

}  // namespace tileattn::mpi::cli
