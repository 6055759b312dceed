#include "mpi/ring_common.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "tileattn/machine.hpp"

namespace tileattn::mpi::detail {

namespace {

std::string str(int64_t x) { return std::to_string(x); }

// Everything that must agree across ranks, compared with one MIN and one MAX
// reduction: the shape, the dtype, the mask, the layout, the scale as the
// kernels take it (NaN: 1/sqrt(head_dim)) and the path asked for. `threads`
// is per rank; the resolved path may differ between machines (automatic picks
// each one's best), which changes only the rounding.
constexpr int kFingerprint = 14;
constexpr const char* kFingerprintNames[kFingerprint] = {
    "shape.batch", "shape.heads", "shape.kv_heads", "shape.seqlen_q", "shape.seqlen_k", "shape.head_dim",
    "shape.v_head_dim", "dtype", "causal", "window_left", "window_right", "layout", "scale", "isa"};
void fingerprint(const RingArgs& a, long long* out) {
  const float scale = std::isnan(a.scale) ? 1.0f / std::sqrt(float(a.shape.head_dim)) : a.scale;
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &scale, sizeof scale_bits);
  const long long values[kFingerprint] = {
      a.shape.batch, a.shape.heads, a.shape.kv_heads, a.shape.seqlen_q, a.shape.seqlen_k, a.shape.head_dim,
      value_head_dim(a.shape), int(a.dtype), a.causal, a.window_left, a.window_right, int(a.layout),
      scale_bits, int(a.isa)};
  std::memcpy(out, values, sizeof values);
}

// This rank's value of fingerprint field `field`, for the message.
std::string fingerprint_value(const RingArgs& a, int field, long long value) {
  if (field == 7) return dtype_name(a.dtype);
  if (field == 11) return shard_layout_name(a.layout);
  if (field == 12) {
    if (std::isnan(a.scale)) return "NaN (1/sqrt(head_dim))";
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", double(a.scale));
    return text;
  }
  if (field == 13) return isa_name(a.isa);
  return std::to_string(value);
}

// What agree_on_outcome tells the ranks that did not fail.
enum FailureKind : int { kError = 1, kNotSupported = 2, kOutOfMemory = 3, kOther = 4 };
std::pair<int, std::string> describe(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    return {kError, e.what()};
  } catch (const NotSupported& e) {
    return {kNotSupported, e.what()};
  } catch (const std::bad_alloc&) {
    return {kOutOfMemory, "out of memory"};
  } catch (const std::exception& e) {
    return {kOther, e.what()};
  } catch (...) {
    return {kOther, "unknown exception"};
  }
}

}  // namespace

void check_global(const RingArgs& a) {
  if (a.shape.seqlen_q != a.shape.seqlen_k)
    throw Error("shape.seqlen_k (" + str(a.shape.seqlen_k) + ") must equal shape.seqlen_q (" +
                str(a.shape.seqlen_q) + "): ring attention is self-attention");
  // V and O rows as wide as K's: the slices travel as rows of head_dim.
  if (value_head_dim(a.shape) != a.shape.head_dim)
    throw NotSupported("shape.v_head_dim (" + str(a.shape.v_head_dim) +
                       "): ring attention needs V's head dim equal to head_dim (" + str(a.shape.head_dim) +
                       ") or 0");
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

std::exception_ptr capture(const std::function<void()>& work) {
  try {
    work();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void agree_on_outcome(MPI_Comm comm, std::exception_ptr failure, const char* who) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const int mine = failure ? rank : INT_MAX;
  int first = INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == INT_MAX) return;
  // The lowest failing rank's kind and message, for the ranks that did not fail.
  int header[2] = {0, 0};
  std::string message;
  if (rank == first) {
    std::pair<int, std::string> d = describe(failure);
    header[0] = d.first;
    message = std::move(d.second);
    header[1] = int(std::min<size_t>(message.size(), 4096));
  }
  MPI_Bcast(header, 2, MPI_INT, first, comm);
  message.resize(size_t(header[1]));
  MPI_Bcast(&message[0], header[1], MPI_CHAR, first, comm);
  if (failure) std::rethrow_exception(failure);
  const std::string text =
      (who && *who ? std::string(who) + ": " : std::string()) + "rank " + std::to_string(first) + ": " + message;
  switch (header[0]) {
    case kError: throw Error(text);
    case kNotSupported: throw NotSupported(text);
    case kOutOfMemory: throw std::bad_alloc();
    default: throw std::runtime_error(text);
  }
}

void agree_on_arguments(const RingArgs& a, const std::function<void()>& check_this_rank, const char* who) {
  agree_on_outcome(a.comm, capture(check_this_rank), who);
  long long mine[kFingerprint], lo[kFingerprint], hi[kFingerprint];
  fingerprint(a, mine);
  MPI_Allreduce(mine, lo, kFingerprint, MPI_LONG_LONG, MPI_MIN, a.comm);
  MPI_Allreduce(mine, hi, kFingerprint, MPI_LONG_LONG, MPI_MAX, a.comm);
  for (int field = 0; field < kFingerprint; ++field)
    if (lo[field] != hi[field])
      throw Error(std::string(who) + ": ranks disagree on " + kFingerprintNames[field] +
                  " (this rank: " + fingerprint_value(a, field, mine[field]) + ")");
}

RingSetup set_up_ring(const RingArgs& a, const std::function<void(int64_t rows)>& validate_local,
                      const std::function<void(const RingSetup&)>& allocate, const char* who) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(a.comm, &rank);
  MPI_Comm_size(a.comm, &ranks);
  std::optional<RingSetup> setup;
  agree_on_arguments(a, [&] {
    check_global(a);
    ShardPlan plan(a.shape.seqlen_q, ranks, a.layout);
    validate_local(plan.rows(rank));
    check_message_size(a, plan.max_rows());
    // Resolved here, not in the attention calls: an unavailable path (or a
    // bad TILEATTN_ISA) fails in the collective check, on every rank.
    const Isa isa = resolve_isa(a.isa);
    setup.emplace(RingSetup{rank, ranks, std::move(plan), isa});
    allocate(*setup);
  }, who);
  return std::move(*setup);
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

RingAccumulator::Problem block_problem(const RingArgs& a, Isa isa) {
  RingAccumulator::Problem p;
  p.batch = a.shape.batch;
  p.heads = a.shape.heads;
  p.kv_heads = a.shape.kv_heads;
  p.head_dim = a.shape.head_dim;
  p.dtype = a.dtype;
  p.scale = a.scale;
  p.threads = a.threads;
  p.isa = isa;
  p.band = make_band(a.causal, a.window_left, a.window_right);
  return p;
}

}  // namespace tileattn::mpi::detail
