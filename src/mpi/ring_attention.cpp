// The transport half of ring attention: each rank packs its K/V slice into
// one buffer and, at every step, posts the send of the slice it holds to the
// right neighbour and the receive of the next one from the left, attends to
// the slice it holds while both are in flight, then waits. Two buffers
// alternate, so the slice being read is never the one being received into.
#include <optional>
#include <vector>

#include "mpi/ring_block.hpp"
#include "mpi/ring_common.hpp"
#include "tileattn/mpi.hpp"

namespace tileattn::mpi {

namespace {

constexpr int kRingTag = 7411;

}  // namespace

RingStats ring_attention_forward(const RingArgs& a) {
  const double start = MPI_Wtime();
  const AttentionShape& s = a.shape;
  const int64_t esize = int64_t(dtype_size(a.dtype));
  const int64_t row_bytes = s.head_dim * esize;
  // Elements of one K (or V) slice of `rows` rows, packed [batch, kv_heads, rows, head_dim].
  auto slice_elements = [&](int64_t rows) { return s.batch * s.kv_heads * rows * s.head_dim; };

  // Every allocation of the call happens inside the collective check, so that
  // running out of memory fails on every rank before any message is posted.
  std::vector<unsigned char> buffers[2];
  std::optional<detail::RingAccumulator> acc;
  const detail::RingSetup ring = detail::set_up_ring(
      a, [&](int64_t rows) { validate(detail::local_args(a, rows)); },
      [&](const detail::RingSetup& setup) {
        for (auto& b : buffers) b.resize(size_t(2 * slice_elements(setup.plan.max_rows()) * esize));
        acc.emplace(detail::block_problem(a, setup.isa), a.q, setup.plan.segments(setup.rank));
      },
      "ring_attention_forward");
  const int rank = ring.rank, ranks = ring.ranks;
  const ShardPlan& plan = ring.plan;
  auto message_rows = [&](int holder) { return int(2 * s.batch * s.kv_heads * plan.rows(holder)); };

  // Pack this rank's K then V into the first buffer.
  const int64_t own_rows = plan.rows(rank);
  detail::pack_rows(a.k, s, s.kv_heads, own_rows, size_t(esize), buffers[0].data());
  detail::pack_rows(a.v, s, s.kv_heads, own_rows, size_t(esize), buffers[0].data() + slice_elements(own_rows) * esize);

  MPI_Datatype row_type;
  MPI_Type_contiguous(int(row_bytes), MPI_BYTE, &row_type);
  MPI_Type_commit(&row_type);

  RingStats stats;
  stats.steps = ranks;
  // An exception from this rank's compute is kept, not thrown: the rank stops
  // computing but keeps passing the slices until the ring ends, so that no
  // neighbour waits for a message that never comes and no request is left
  // pending on a freed buffer; then every rank throws together.
  std::exception_ptr failure;
  const int left = (rank - 1 + ranks) % ranks, right = (rank + 1) % ranks;
  for (int step = 0; step < ranks; ++step) {
    const int holder = (rank - step + ranks) % ranks;  // whose slice this rank holds now
    unsigned char* current = buffers[step % 2].data();
    MPI_Request requests[2];
    int pending = 0;
    if (step + 1 < ranks) {
      const int incoming = (holder - 1 + ranks) % ranks;  // the left neighbour holds it now
      MPI_Irecv(buffers[(step + 1) % 2].data(), message_rows(incoming), row_type, left, kRingTag, a.comm,
                &requests[0]);
      MPI_Isend(current, message_rows(holder), row_type, right, kRingTag, a.comm, &requests[1]);
      pending = 2;
      stats.bytes_received += int64_t(message_rows(incoming)) * row_bytes;
      stats.bytes_sent += int64_t(message_rows(holder)) * row_bytes;
    }

    const double compute_start = MPI_Wtime();
    const int64_t n = plan.rows(holder);
    const std::array<int64_t, 4> packed{s.kv_heads * n * s.head_dim, n * s.head_dim, s.head_dim, 1};
    const InputView k{current, packed};
    const InputView v{current + slice_elements(n) * esize, packed};
    // Without an asynchronous progress thread MPI moves large messages only
    // inside MPI calls: test the requests between pieces of work.
    if (!failure)
      failure = detail::capture([&] {
        acc->absorb(k, v, plan.segments(holder), [&] {
          int done = 0;
          if (pending) MPI_Testall(pending, requests, &done, MPI_STATUSES_IGNORE);
        });
      });
    const double wait_start = MPI_Wtime();
    stats.compute_s += wait_start - compute_start;
    if (pending) MPI_Waitall(pending, requests, MPI_STATUSES_IGNORE);
    stats.wait_s += MPI_Wtime() - wait_start;
  }
  MPI_Type_free(&row_type);
  detail::agree_on_outcome(a.comm, failure, "ring_attention_forward");

  const double write_start = MPI_Wtime();
  acc->write(a.o, a.lse, a.lse_stride);
  stats.compute_s += MPI_Wtime() - write_start;
  stats.blocks_computed = acc->blocks_computed();
  stats.blocks_skipped = acc->blocks_skipped();
  stats.visible_pairs = acc->visible_pairs();
  stats.total_s = MPI_Wtime() - start;
  return stats;
}

}  // namespace tileattn::mpi
