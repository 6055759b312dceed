// Pieces the forward and backward rings share: the collective argument check
// (every rank learns whether any rank's arguments are bad, so none is left
// waiting in the ring), packing a rank's K/V rows into one message buffer,
// and the block-level problem description.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <functional>

#include "mpi/ring_block.hpp"
#include "tileattn/mpi.hpp"

namespace tileattn::mpi::detail {

// Self-attention, windows >= -1, a known layout (throws Error); V's head dim
// equal to head_dim (throws NotSupported).
void check_global(const RingArgs& args);

// This rank's slices as a single-process forward problem of `rows` rows.
ForwardArgs local_args(const RingArgs& args, int64_t rows);

// Runs `work` and returns what it threw (null when nothing), so that a rank
// can keep its part of the collective calls going and tell the others
// (agree_on_outcome) instead of leaving them waiting.
std::exception_ptr capture(const std::function<void()>& work);

// Collective over comm: returns on every rank when no rank's `failure` is set;
// otherwise every rank throws. A rank that failed rethrows its own exception;
// the others throw the kind of the lowest failing rank's exception (Error,
// NotSupported, std::bad_alloc, anything else as std::runtime_error) with its
// message as "<who>: rank R: <message>".
void agree_on_outcome(MPI_Comm comm, std::exception_ptr failure, const char* who);

// Collective over args.comm: runs `check_this_rank` (which throws on bad
// arguments or a missing feature), then agrees across ranks: every rank
// throws when any rank's check threw (agree_on_outcome), or Error naming the
// field when the ranks disagree on the shape, dtype, mask, layout, scale or
// requested isa. `who` prefixes the messages.
void agree_on_arguments(const RingArgs& args, const std::function<void()>& check_this_rank,
                        const char* who);

// This rank's place in the ring, agreed by every rank, and the path its
// attention calls take (args.isa resolved once, in the collective check).
struct RingSetup {
  int rank = 0, ranks = 1;
  ShardPlan plan;
  Isa isa = Isa::automatic;
};
// Collective over args.comm, the start of both rings: every rank checks its
// own arguments (check_global, the shard plan, `validate_local` on its rows,
// check_message_size, resolve_isa(args.isa)) and makes every allocation of
// the call (`allocate`), then all learn whether any failed
// (agree_on_arguments), so that a failing rank cannot leave the others
// blocked in the ring.
RingSetup set_up_ring(const RingArgs& args, const std::function<void(int64_t rows)>& validate_local,
                      const std::function<void(const RingSetup&)>& allocate, const char* who);

// Throws Error when the largest K/V slice (K then V, max_rows rows each per
// (batch, kv head)) cannot be one MPI message counted in rows.
void check_message_size(const RingArgs& args, int64_t max_rows);

// Copies `rows` rows of a [batch, heads, rows, head_dim] view into dst,
// packed dense in the same order.
void pack_rows(const InputView& src, const AttentionShape& shape, int64_t heads, int64_t rows,
               size_t element_size, unsigned char* dst);

// The block-level description of the problem (ring_block.hpp), its calls on
// the resolved path `isa`.
RingAccumulator::Problem block_problem(const RingArgs& args, Isa isa);

}  // namespace tileattn::mpi::detail
