// The transport half of ring attention: each rank packs its K/V slice into
// one buffer and, at every step, posts the send of the slice it holds to the
// right neighbour and the receive of the next one from the left, attends to
// the slice it holds while both are in flight, then waits. Two buffers
// alternate, so the slice being read is never the one being received into.
#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "mpi/ring_block.hpp"
#include "tileattn/mpi.hpp"

namespace tileattn::mpi {

namespace {

constexpr int kRingTag = 7411;

std::string str(int64_t x) { return std::to_string(x); }

// This rank's slices as a single-process problem, for the shared validation.
ForwardArgs local_args(const RingArgs& a, int64_t rows) {
  ForwardArgs f;
  f.shape = a.shape;
  f.shape.seqlen_q = f.shape.seqlen_k = rows;
  f.dtype = a.dtype;
  f.q = a.q;
  f.k = a.k;
  f.v = a.v;
  f.o = a.o;
  f.lse = a.lse;
  f.lse_stride = a.lse_stride;
  f.scale = a.scale;
  f.threads = a.threads;
  f.isa = a.isa;
  return f;
}

void check_global(const RingArgs& a) {
  if (a.shape.seqlen_q != a.shape.seqlen_k)
    throw Error("shape.seqlen_k (" + str(a.shape.seqlen_k) + ") must equal shape.seqlen_q (" +
                str(a.shape.seqlen_q) + "): ring attention is self-attention");
  if (a.window_left < -1) throw Error("window_left must be >= -1, got " + str(a.window_left));
  if (a.window_right < -1) throw Error("window_right must be >= -1, got " + str(a.window_right));
  if (a.layout != ShardLayout::contiguous && a.layout != ShardLayout::zigzag)
    throw Error("layout: expected zigzag or contiguous");
}

// Everything that must agree across ranks, compared with one MIN and one MAX reduction.
constexpr int kFingerprint = 10;
void fingerprint(const RingArgs& a, long long* out) {
  const long long values[kFingerprint] = {
      a.shape.batch, a.shape.heads, a.shape.kv_heads, a.shape.seqlen_q, a.shape.head_dim,
      int(a.dtype), a.causal, a.window_left, a.window_right, int(a.layout)};
  std::memcpy(out, values, sizeof values);
}

}  // namespace

RingStats ring_attention_forward(const RingArgs& a) {
  const double start = MPI_Wtime();
  int rank = 0, ranks = 1;
  MPI_Comm_rank(a.comm, &rank);
  MPI_Comm_size(a.comm, &ranks);

  // Every rank checks its own arguments, then all learn whether any failed,
  // so that a bad rank cannot leave the others blocked in the ring.
  std::string error;
  std::optional<ShardPlan> plan;
  int64_t row_bytes = 0;
  try {
    check_global(a);
    plan.emplace(a.shape.seqlen_q, ranks, a.layout);
    validate(local_args(a, plan->rows(rank)));
    row_bytes = a.shape.head_dim * int64_t(dtype_size(a.dtype));
    const int64_t slice_rows = 2 * a.shape.batch * a.shape.kv_heads * plan->max_rows();
    if (a.shape.batch > 0 && slice_rows / (2 * a.shape.batch) != a.shape.kv_heads * plan->max_rows())
      throw Error("shape: the K/V slice size overflows");
    if (slice_rows > INT_MAX)
      throw Error("shape: a K/V slice of " + str(slice_rows) + " rows exceeds one MPI message (" +
                  str(INT_MAX) + " rows); use more ranks");
  } catch (const Error& e) {
    error = e.what();
  }
  const int ok = error.empty() ? 1 : 0;
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, a.comm);
  if (!ok) throw Error(error);
  if (!all_ok) throw Error("ring_attention_forward: invalid arguments on another rank");
  long long mine[kFingerprint], lo[kFingerprint], hi[kFingerprint];
  fingerprint(a, mine);
  MPI_Allreduce(mine, lo, kFingerprint, MPI_LONG_LONG, MPI_MIN, a.comm);
  MPI_Allreduce(mine, hi, kFingerprint, MPI_LONG_LONG, MPI_MAX, a.comm);
  if (std::memcmp(lo, hi, sizeof lo) != 0)
    throw Error("ring_attention_forward: ranks disagree on shape, dtype, mask or layout");

  const AttentionShape& s = a.shape;
  const int64_t esize = int64_t(dtype_size(a.dtype));
  // Elements of one K (or V) slice of `rows` rows, packed [batch, kv_heads, rows, head_dim].
  auto slice_elements = [&](int64_t rows) { return s.batch * s.kv_heads * rows * s.head_dim; };
  auto message_rows = [&](int holder) { return int(2 * s.batch * s.kv_heads * plan->rows(holder)); };

  // Pack this rank's K then V into the first buffer.
  std::vector<unsigned char> buffers[2];
  for (auto& b : buffers) b.resize(size_t(2 * slice_elements(plan->max_rows()) * esize));
  const int64_t own_rows = plan->rows(rank);
  for (int t = 0; t < 2; ++t) {
    const InputView& src = t == 0 ? a.k : a.v;
    unsigned char* dst = buffers[0].data() + t * slice_elements(own_rows) * esize;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.kv_heads; ++h)
        for (int64_t r = 0; r < own_rows; ++r) {
          const unsigned char* row = static_cast<const unsigned char*>(src.data) +
                                     (b * src.stride[0] + h * src.stride[1] + r * src.stride[2]) * esize;
          unsigned char* out = dst + ((b * s.kv_heads + h) * own_rows + r) * row_bytes;
          if (src.stride[3] == 1) {
            std::memcpy(out, row, size_t(row_bytes));
          } else {
            for (int64_t c = 0; c < s.head_dim; ++c)
              std::memcpy(out + c * esize, row + c * src.stride[3] * esize, size_t(esize));
          }
        }
  }

  detail::RingAccumulator::Problem problem;
  problem.batch = s.batch;
  problem.heads = s.heads;
  problem.kv_heads = s.kv_heads;
  problem.head_dim = s.head_dim;
  problem.dtype = a.dtype;
  problem.scale = a.scale;
  problem.threads = a.threads;
  problem.isa = a.isa;
  problem.band = detail::make_band(a.causal, a.window_left, a.window_right);
  detail::RingAccumulator acc(problem, a.q, plan->segments(rank));

  MPI_Datatype row_type;
  MPI_Type_contiguous(int(row_bytes), MPI_BYTE, &row_type);
  MPI_Type_commit(&row_type);

  RingStats stats;
  stats.steps = ranks;
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
    const int64_t n = plan->rows(holder);
    const std::array<int64_t, 4> packed{s.kv_heads * n * s.head_dim, n * s.head_dim, s.head_dim, 1};
    const InputView k{current, packed};
    const InputView v{current + slice_elements(n) * esize, packed};
    // Without an asynchronous progress thread MPI moves large messages only
    // inside MPI calls: test the requests between pieces of work.
    acc.absorb(k, v, plan->segments(holder), [&] {
      int done = 0;
      if (pending) MPI_Testall(pending, requests, &done, MPI_STATUSES_IGNORE);
    });
    const double wait_start = MPI_Wtime();
    stats.compute_s += wait_start - compute_start;
    if (pending) MPI_Waitall(pending, requests, MPI_STATUSES_IGNORE);
    stats.wait_s += MPI_Wtime() - wait_start;
  }
  MPI_Type_free(&row_type);

  const double write_start = MPI_Wtime();
  acc.write(a.o, a.lse, a.lse_stride);
  stats.compute_s += MPI_Wtime() - write_start;
  stats.blocks_computed = acc.blocks_computed();
  stats.blocks_skipped = acc.blocks_skipped();
  stats.visible_pairs = acc.visible_pairs();
  stats.total_s = MPI_Wtime() - start;
  return stats;
}

}  // namespace tileattn::mpi
