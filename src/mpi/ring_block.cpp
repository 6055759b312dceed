#include "mpi/ring_block.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/half.hpp"
#include "tileattn/merge.hpp"

namespace tileattn::mpi::detail {

const void* row_at(const InputView& view, int64_t esize, int64_t b, int64_t h, int64_t r) {
  return static_cast<const unsigned char*>(view.data) +
         (b * view.stride[0] + h * view.stride[1] + r * view.stride[2]) * esize;
}

std::optional<Block> plan_block(Segment q, Segment k, Band band) {
  // Queries that see at least one key of k, and keys seen by at least one
  // query of q. Every query kept sees only keys kept, so no kept row is empty.
  const Segment tq{std::max(q.begin, k.begin - band.right), std::min(q.end, k.end + band.left)};
  const Segment tk{std::max(k.begin, q.begin - band.left), std::min(k.end, q.end + band.right)};
  if (tq.size() <= 0 || tk.size() <= 0) return std::nullopt;
  const int64_t nq = tq.size(), nk = tk.size();
  // Query row i sits at local key column i + shift; ForwardArgs puts it at
  // i + offset. Its visible keys: i + shift - left <= j <= i + shift + right.
  const int64_t shift = tq.begin - tk.begin, offset = nk - nq;
  Block block{tq, tk, -1, -1};
  if (shift + band.right < nk - 1) block.window_right = shift + band.right - offset;
  if ((nq - 1) + shift - band.left > 0) block.window_left = offset - shift + band.left;
  // Trimming guarantees both are >= 0 (the last row's band reaches the last
  // key and starts at or before it); anything else is a bug here.
  if (block.window_right < -1 || block.window_left < -1)
    throw std::logic_error("ring attention: negative window after trimming");
  return block;
}

int64_t visible_pairs(const Block& block) {
  const int64_t nq = block.q.size(), nk = block.k.size(), offset = nk - nq;
  int64_t pairs = 0;
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t lo = block.window_left < 0 ? 0 : std::max<int64_t>(0, i + offset - block.window_left);
    const int64_t hi = block.window_right < 0 ? nk - 1 : std::min(nk - 1, i + offset + block.window_right);
    pairs += std::max<int64_t>(0, hi - lo + 1);
  }
  return pairs;
}

void write_rounded(const float* dense, int64_t batch, int64_t heads, int64_t rows, int64_t head_dim,
                   DType dtype, OutputView out) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < rows; ++r) {
        const float* in = dense + ((b * heads + h) * rows + r) * head_dim;
        const int64_t at = b * out.stride[0] + h * out.stride[1] + r * out.stride[2];
        for (int64_t c = 0; c < head_dim; ++c)
          tileattn::detail::store_element(out.data, int(dtype), at + c * out.stride[3], in[c]);
      }
}

ForwardArgs piece_args(const RingProblem& p, const Block& block, DType dtype) {
  ForwardArgs f;
  f.shape = {1, p.heads / p.kv_heads, 1, block.q.size(), block.k.size(), p.head_dim};
  f.dtype = dtype;
  f.scale = p.scale;
  f.threads = p.threads;
  f.isa = p.isa;
  f.mask.window_left = block.window_left;
  f.mask.window_right = block.window_right;
  return f;
}

RingAccumulator::RingAccumulator(const Problem& problem, InputView q, std::vector<Segment> q_segments)
    : problem_(problem), q_(q), q_segments_(std::move(q_segments)) {
  for (const Segment& s : q_segments_) rows_ += s.size();
  const int64_t group = problem_.heads / problem_.kv_heads, d = problem_.head_dim;
  const size_t rows_all = size_t(problem_.batch * problem_.heads * rows_);
  o_.assign(rows_all * size_t(d), 0.0f);
  lse_.assign(rows_all, -std::numeric_limits<float>::infinity());
  part_o_.resize(size_t(group * rows_ * d));
  part_lse_.resize(size_t(group * rows_));
}

void RingAccumulator::absorb(InputView k, InputView v, const std::vector<Segment>& kv_segments,
                             const std::function<void()>& between) {
  const Problem& p = problem_;
  const int64_t group = p.heads / p.kv_heads, d = p.head_dim;
  const int64_t esize = int64_t(dtype_size(p.dtype));
  for_each_block(p, q_segments_, kv_segments, counts_, between, [&](const PlacedBlock& placed, int64_t b, int64_t g) {
    const Block& block = placed.block;
    const int64_t q_row = placed.q_row, k_row = placed.k_row, nq = block.q.size();
    ForwardArgs f = piece_args(p, block, p.dtype);
    f.fp32_output = true;
    f.q = {row_at(q_, esize, b, g * group, q_row), q_.stride};
    f.k = {row_at(k, esize, b, g, k_row), k.stride};
    f.v = {row_at(v, esize, b, g, k_row), v.stride};
    const std::array<int64_t, 4> part_stride{group * nq * d, nq * d, d, 1};
    f.o = {part_o_.data(), part_stride};
    f.lse = part_lse_.data();
    f.lse_stride = {group * nq, nq, 1};
    attention_forward(f);

    const int64_t acc_row = (b * p.heads + g * group) * rows_ + q_row;
    MergeArgs m;
    m.batch = 1;
    m.heads = group;
    m.rows = nq;
    m.head_dim = d;
    m.dtype = DType::f32;
    m.o_a = {o_.data() + acc_row * d, {p.heads * rows_ * d, rows_ * d, d, 1}};
    m.lse_a = lse_.data() + acc_row;
    m.lse_a_stride = {p.heads * rows_, rows_, 1};
    m.o_b = {part_o_.data(), part_stride};
    m.lse_b = part_lse_.data();
    m.lse_b_stride = {group * nq, nq, 1};
    m.o_out = {o_.data() + acc_row * d, m.o_a.stride};
    m.lse_out = lse_.data() + acc_row;
    m.lse_out_stride = m.lse_a_stride;
    merge_states(m);
  });
}

void RingAccumulator::write(OutputView o, float* lse, std::array<int64_t, 3> lse_stride) const {
  const Problem& p = problem_;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t r = 0; r < rows_; ++r) {
        const int64_t row = (b * p.heads + h) * rows_ + r;
        const int64_t out = b * o.stride[0] + h * o.stride[1] + r * o.stride[2];
        for (int64_t c = 0; c < p.head_dim; ++c)
          tileattn::detail::store_element(o.data, int(p.dtype), out + c * o.stride[3], o_[size_t(row * p.head_dim + c)]);
        if (lse) lse[b * lse_stride[0] + h * lse_stride[1] + r * lse_stride[2]] = lse_[size_t(row)];
      }
}

}  // namespace tileattn::mpi::detail
