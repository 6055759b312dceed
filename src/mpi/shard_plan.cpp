#include <string>

#include "tileattn/mpi.hpp"

namespace tileattn::mpi {

namespace {

// Boundary c of `parts` near-equal parts of [0, seqlen); 128-bit so that
// c * seqlen cannot overflow.
int64_t boundary(int64_t c, int64_t parts, int64_t seqlen) {
  return int64_t((__int128(c) * seqlen) / parts);
}

}  // namespace

const char* shard_layout_name(ShardLayout layout) {
  return layout == ShardLayout::zigzag ? "zigzag" : "contiguous";
}

ShardLayout parse_shard_layout(const std::string& name) {
  if (name == "zigzag") return ShardLayout::zigzag;
  if (name == "contiguous") return ShardLayout::contiguous;
  throw Error("layout must be zigzag or contiguous, got '" + name + "'");
}

ShardPlan::ShardPlan(int64_t seqlen, int ranks, ShardLayout layout) : seqlen_(seqlen), layout_(layout) {
  if (seqlen < 0) throw Error("seqlen must be >= 0, got " + std::to_string(seqlen));
  if (ranks < 1) throw Error("ranks must be >= 1, got " + std::to_string(ranks));
  segments_.resize(size_t(ranks));
  auto add = [&](int rank, int64_t c, int64_t parts) {
    const Segment s{boundary(c, parts, seqlen), boundary(c + 1, parts, seqlen)};
    if (s.size() > 0) segments_[size_t(rank)].push_back(s);
  };
  for (int r = 0; r < ranks; ++r) {
    if (layout == ShardLayout::contiguous) {
      add(r, r, ranks);
    } else {
      const int64_t chunks = 2 * int64_t(ranks);
      add(r, r, chunks);
      add(r, chunks - 1 - r, chunks);
    }
  }
}

int64_t ShardPlan::rows(int rank) const {
  int64_t n = 0;
  for (const Segment& s : segments(rank)) n += s.size();
  return n;
}

int64_t ShardPlan::max_rows() const {
  int64_t n = 0;
  for (int r = 0; r < ranks(); ++r) n = std::max(n, rows(r));
  return n;
}

int64_t ShardPlan::global_row(int rank, int64_t local_row) const {
  for (const Segment& s : segments(rank)) {
    if (local_row < s.size()) return s.begin + local_row;
    local_row -= s.size();
  }
  throw Error("local_row is beyond rank " + std::to_string(rank) + "'s rows");
}

}  // namespace tileattn::mpi
