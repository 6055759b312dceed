#include "mpi/ring_common.hpp"

#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

namespace tileattn::mpi::detail {

namespace {

std::string str(int64_t x) { return std::to_string(x); }

// Everything that must agree across ranks, compared with one MIN and one MAX reduction.
constexpr int kFingerprint = 10;
void fingerprint(const RingArgs& a, long long* out) {
  const long long values[kFingerprint] = {
      a.shape.batch, a.shape.heads, a.shape.kv_heads, a.shape.seqlen_q, a.shape.head_dim,
      int(a.dtype), a.causal, a.window_left, a.window_right, int(a.layout)};
  std::memcpy(out, values, sizeof values);
}

}  // namespace

void check_global(const RingArgs& a) {
  if (a.shape.seqlen_q != a.shape.seqlen_k)
    throw Error("shape.seqlen_k (" + str(a.shape.seqlen_k) + ") must equal shape.seqlen_q (" +
                str(a.shape.seqlen_q) + "): ring attention is self-attention");
  if (a.window_left < -1) throw Error("window_left must be >= -1, got " + str(a.window_left));
  if (a.window_right < -1) throw Error("window_right must be >= -1, got " + str(a.window_right));
  if (a.layout != ShardLayout::contiguous && a.layout != ShardLayout::zigzag)
    throw Error("layout: expected zigzag or contiguous");
}

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

void agree_on_arguments(const RingArgs& a, const std::function<void()>& check_this_rank, const char* who) {
  std::string error;
  try {
    check_this_rank();
  } catch (const Error& e) {
    error = e.what();
  }
  const int ok = error.empty() ? 1 : 0;
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, a.comm);
  if (!ok) throw Error(error);
  if (!all_ok) throw Error(std::string(who) + ": invalid arguments on another rank");
  long long mine[kFingerprint], lo[kFingerprint], hi[kFingerprint];
  fingerprint(a, mine);
  MPI_Allreduce(mine, lo, kFingerprint, MPI_LONG_LONG, MPI_MIN, a.comm);
  MPI_Allreduce(mine, hi, kFingerprint, MPI_LONG_LONG, MPI_MAX, a.comm);
  if (std::memcmp(lo, hi, sizeof lo) != 0)
    throw Error(std::string(who) + ": ranks disagree on shape, dtype, mask or layout");
}

RingSetup set_up_ring(const RingArgs& a, const std::function<void(int64_t rows)>& validate_local,
                      const char* who) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(a.comm, &rank);
  MPI_Comm_size(a.comm, &ranks);
  std::optional<ShardPlan> plan;
  agree_on_arguments(a, [&] {
    check_global(a);
    plan.emplace(a.shape.seqlen_q, ranks, a.layout);
    validate_local(plan->rows(rank));
    check_message_size(a, plan->max_rows());
  }, who);
  return {rank, ranks, std::move(*plan)};
}

void check_message_size(const RingArgs& a, int64_t max_rows) {
  const int64_t slice_rows = 2 * a.shape.batch * a.shape.kv_heads * max_rows;
  if (a.shape.batch > 0 && slice_rows / (2 * a.shape.batch) != a.shape.kv_heads * max_rows)
    throw Error("shape: the K/V slice size overflows");
  if (slice_rows > INT_MAX)
    throw Error("shape: a K/V slice of " + str(slice_rows) + " rows exceeds one MPI message (" +
                str(INT_MAX) + " rows); use more ranks");
}

void pack_rows(const InputView& src, const AttentionShape& s, int64_t heads, int64_t rows, size_t element_size,
               unsigned char* dst) {
  const int64_t esize = int64_t(element_size), row_bytes = s.head_dim * esize;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < rows; ++r) {
        const unsigned char* row = static_cast<const unsigned char*>(src.data) +
                                   (b * src.stride[0] + h * src.stride[1] + r * src.stride[2]) * esize;
        unsigned char* out = dst + ((b * heads + h) * rows + r) * row_bytes;
        if (src.stride[3] == 1) {
          std::memcpy(out, row, size_t(row_bytes));
        } else {
          for (int64_t c = 0; c < s.head_dim; ++c)
            std::memcpy(out + c * esize, row + c * src.stride[3] * esize, size_t(esize));
        }
      }
}

RingAccumulator::Problem block_problem(const RingArgs& a) {
  RingAccumulator::Problem p;
  p.batch = a.shape.batch;
  p.heads = a.shape.heads;
  p.kv_heads = a.shape.kv_heads;
  p.head_dim = a.shape.head_dim;
  p.dtype = a.dtype;
  p.scale = a.scale;
  p.threads = a.threads;
  p.isa = a.isa;
  p.band = make_band(a.causal, a.window_left, a.window_right);
  return p;
}

}  // namespace tileattn::mpi::detail
