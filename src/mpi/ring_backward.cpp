// The transport half of the ring backward. K/V slices travel as in the
// forward (double-buffered, posted before the step's compute). Each slice's
// fp32 dK/dV accumulator follows it one step behind, because a rank can send
// it on only after adding its own share:
//
//   step s on rank r (it holds the K/V slice of rank h = r - s):
//     post K/V receive (next slice) from r-1 and K/V send (this slice) to r+1
//     s >= 2: post the receive of slice h's accumulator from r-1 (sent there
//             at the end of its step s-1, so it arrives during this compute)
//     compute this rank's share of slice h into a zeroed fp32 buffer (dQ stays)
//     s == 0: keep the buffer (the owner's own share, added at the very end)
//     s >= 1: add the received accumulator (s >= 2), send the sum to r+1
//   after the last step: receive the own slice's accumulator from r-1, add.
//
// So each accumulator makes P-1 hops (owner's right neighbour first, owner
// last), and only the very last hop is not hidden behind compute.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "mpi/ring_common.hpp"
#include "mpi/ring_gradients.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/mpi.hpp"

namespace tileattn::mpi {

namespace {

constexpr int kKvTag = 7412, kGradientTag = 7413;

// This rank's slices as a single-process backward problem, for the shared validation.
BackwardArgs local_backward_args(const RingBackwardArgs& a, int64_t rows) {
  BackwardArgs b;
  b.forward = detail::local_args(a.forward, rows);
  b.forward.o = {};
  b.forward.lse = nullptr;
  b.o = a.o;
  b.d_o = a.d_o;
  b.lse = a.lse;
  b.lse_stride = a.lse_stride;
  b.dq = a.dq;
  b.dk = a.dk;
  b.dv = a.dv;
  return b;
}

}  // namespace

RingStats ring_attention_backward(const RingBackwardArgs& args) {
  const double start = MPI_Wtime();
  const RingArgs& a = args.forward;
  const AttentionShape& s = a.shape;
  const int64_t esize = int64_t(dtype_size(a.dtype));
  const int64_t kv_row_bytes = s.head_dim * esize, gradient_row_bytes = s.head_dim * int64_t(sizeof(float));
  // Elements of one K (or V, dK, dV) slice of `rows` rows, packed [batch, kv_heads, rows, head_dim].
  auto slice_elements = [&](int64_t rows) { return s.batch * s.kv_heads * rows * s.head_dim; };

  // Every allocation of the call happens inside the collective check, so that
  // running out of memory fails on every rank before any message is posted:
  // two K/V buffers and the fp32 (dK, dV) of one slice four times (this
  // rank's share of its own slice, the share being computed, the accumulator
  // coming in and the one going out), and RingGradients' fp32 dQ and LSE.
  std::vector<unsigned char> kv_buffers[2];
  std::vector<float> own, share, incoming, outgoing;
  std::optional<detail::RingGradients> gradients;
  double setup_s = 0;  // RingGradients' setup (the LSE copy, dQ zeroed)
  const detail::RingSetup ring = detail::set_up_ring(
      a, [&](int64_t rows) { validate(local_backward_args(args, rows)); },
      [&](const detail::RingSetup& setup) {
        const int64_t max_rows = setup.plan.max_rows();
        for (auto& b : kv_buffers) b.resize(size_t(2 * slice_elements(max_rows) * esize));
        own.resize(size_t(2 * slice_elements(setup.plan.rows(setup.rank))));
        for (auto* g : {&share, &incoming, &outgoing}) g->resize(size_t(2 * slice_elements(max_rows)));
        const double setup_start = MPI_Wtime();
        gradients.emplace(detail::block_problem(a, setup.isa), a.q, args.o, args.d_o, args.lse, args.lse_stride,
                          setup.plan.segments(setup.rank));
        gradients->reserve(max_rows);
        setup_s = MPI_Wtime() - setup_start;
      },
      "ring_attention_backward");
  const int rank = ring.rank, ranks = ring.ranks;
  const ShardPlan& plan = ring.plan;
  // Rows of one message (K then V, or dK then dV) of `holder`'s slice.
  auto message_rows = [&](int holder) { return int(2 * s.batch * s.kv_heads * plan.rows(holder)); };

  const int64_t own_rows = plan.rows(rank);
  detail::pack_rows(a.k, s, s.kv_heads, own_rows, size_t(esize), kv_buffers[0].data());
  detail::pack_rows(a.v, s, s.kv_heads, own_rows, size_t(esize),
                    kv_buffers[0].data() + slice_elements(own_rows) * esize);

  MPI_Datatype kv_row, gradient_row;
  MPI_Type_contiguous(int(kv_row_bytes), MPI_BYTE, &kv_row);
  MPI_Type_commit(&kv_row);
  MPI_Type_contiguous(int(s.head_dim), MPI_FLOAT, &gradient_row);
  MPI_Type_commit(&gradient_row);

  RingStats stats;
  stats.steps = ranks;
  stats.compute_s = setup_s;
  // An exception from this rank's compute is kept, not thrown: the rank stops
  // computing but keeps passing the slices and accumulators until the ring
  // ends, so that no neighbour waits for a message that never comes and no
  // request is left pending on a freed buffer; then every rank throws together.
  std::exception_ptr failure;
  const int left = (rank - 1 + ranks) % ranks, right = (rank + 1) % ranks;
  // [0] K/V receive, [1] K/V send, [2] accumulator receive, [3] accumulator send.
  MPI_Request requests[4] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  for (int step = 0; step < ranks; ++step) {
    const int holder = (rank - step + ranks) % ranks;
    unsigned char* current = kv_buffers[step % 2].data();
    if (step + 1 < ranks) {
      const int incoming_holder = (holder - 1 + ranks) % ranks;
      MPI_Irecv(kv_buffers[(step + 1) % 2].data(), message_rows(incoming_holder), kv_row, left, kKvTag, a.comm,
                &requests[0]);
      MPI_Isend(current, message_rows(holder), kv_row, right, kKvTag, a.comm, &requests[1]);
      stats.bytes_received += int64_t(message_rows(incoming_holder)) * kv_row_bytes;
      stats.bytes_sent += int64_t(message_rows(holder)) * kv_row_bytes;
    }
    if (step >= 2) {
      MPI_Irecv(incoming.data(), message_rows(holder), gradient_row, left, kGradientTag, a.comm, &requests[2]);
      stats.bytes_received += int64_t(message_rows(holder)) * gradient_row_bytes;
    }

    const double compute_start = MPI_Wtime();
    const int64_t n = plan.rows(holder);
    const std::array<int64_t, 4> packed{s.kv_heads * n * s.head_dim, n * s.head_dim, s.head_dim, 1};
    float* target = step == 0 ? own.data() : share.data();
    std::fill(target, target + 2 * slice_elements(n), 0.0f);
    if (!failure)
      failure = detail::capture([&] {
        gradients->absorb({current, packed}, {current + slice_elements(n) * esize, packed}, plan.segments(holder),
                          target, target + slice_elements(n), [&] {
                            // Without an asynchronous progress thread MPI moves
                            // large messages only inside MPI calls.
                            int done = 0;
                            MPI_Testall(4, requests, &done, MPI_STATUSES_IGNORE);
                          });
      });
    double wait_start = MPI_Wtime();
    stats.compute_s += wait_start - compute_start;
    if (step >= 1) {
      if (step >= 2) {
        MPI_Wait(&requests[2], MPI_STATUS_IGNORE);
        const double add_start = MPI_Wtime();
        stats.wait_s += add_start - wait_start;
        for (size_t e = 0, count = size_t(2 * slice_elements(n)); e < count; ++e) share[e] += incoming[e];
        wait_start = MPI_Wtime();
        stats.compute_s += wait_start - add_start;
      }
      MPI_Wait(&requests[3], MPI_STATUS_IGNORE);  // the previous step's accumulator has left
      std::swap(share, outgoing);
      MPI_Isend(outgoing.data(), message_rows(holder), gradient_row, right, kGradientTag, a.comm, &requests[3]);
      stats.bytes_sent += int64_t(message_rows(holder)) * gradient_row_bytes;
    }
    MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
    stats.wait_s += MPI_Wtime() - wait_start;
  }
  // The own slice's accumulator, back from its round: the one hop that no
  // compute hides.
  const double final_start = MPI_Wtime();
  if (ranks > 1) {
    MPI_Recv(incoming.data(), message_rows(rank), gradient_row, left, kGradientTag, a.comm, MPI_STATUS_IGNORE);
    stats.bytes_received += int64_t(message_rows(rank)) * gradient_row_bytes;
  }
  MPI_Wait(&requests[3], MPI_STATUS_IGNORE);
  const double write_start = MPI_Wtime();
  stats.wait_s += write_start - final_start;
  MPI_Type_free(&kv_row);
  MPI_Type_free(&gradient_row);
  detail::agree_on_outcome(a.comm, failure, "ring_attention_backward");

  if (ranks > 1)
    for (size_t e = 0; e < own.size(); ++e) own[e] += incoming[e];
  gradients->write_dq(args.dq);
  detail::write_rounded(own.data(), s.batch, s.kv_heads, own_rows, s.head_dim, a.dtype, args.dk);
  detail::write_rounded(own.data() + slice_elements(own_rows), s.batch, s.kv_heads, own_rows, s.head_dim, a.dtype,
                        args.dv);
  stats.compute_s += MPI_Wtime() - write_start;
  stats.blocks_computed = gradients->blocks_computed();
  stats.blocks_skipped = gradients->blocks_skipped();
  stats.visible_pairs = gradients->visible_pairs();
  stats.total_s = MPI_Wtime() - start;
  return stats;
}

}  // namespace tileattn::mpi
