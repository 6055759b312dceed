#include "mpi/ring_gradients.hpp"

#include "tileattn/backward.hpp"
#include "training/backward_problem.hpp"

namespace tileattn::mpi::detail {

RingGradients::RingGradients(const Problem& problem, InputView q, InputView o, InputView d_o, const float* lse,
                             std::array<int64_t, 3> lse_stride, std::vector<Segment> q_segments)
    : problem_(problem), q_segments_(std::move(q_segments)), q_view_(q), o_view_(o), d_o_view_(d_o) {
  const Problem& p = problem_;
  for (const Segment& s : q_segments_) rows_ += s.size();
  lse_.resize(size_t(p.batch * p.heads * rows_));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t r = 0; r < rows_; ++r)
        lse_[size_t((b * p.heads + h) * rows_ + r)] = lse[b * lse_stride[0] + h * lse_stride[1] + r * lse_stride[2]];
  dq_.assign(size_t(p.batch * p.heads * rows_ * p.head_dim), 0.0f);
  const int64_t group = p.heads / p.kv_heads;
  part_dq_.resize(size_t(group * rows_ * p.head_dim));
}

void RingGradients::reserve(int64_t max_kv_rows) {
  const size_t rows_d = size_t(max_kv_rows * problem_.head_dim);
  if (part_dk_.size() < rows_d) {
    part_dk_.resize(rows_d);
    part_dv_.resize(rows_d);
  }
}

void RingGradients::absorb(InputView k, InputView v, const std::vector<Segment>& kv_segments, float* dk,
                           float* dv, const std::function<void()>& between) {
  const Problem& p = problem_;
  const int64_t group = p.heads / p.kv_heads, d = p.head_dim;
  const int64_t esize = int64_t(dtype_size(p.dtype));
  int64_t kv_rows = 0;
  for (const Segment& s : kv_segments) kv_rows += s.size();
  reserve(kv_rows);

  // The heads sharing a K/V head go together, as in the forward: their dK
  // and dV sum inside the call.
  for_each_block(p, q_segments_, kv_segments, counts_, between, [&](const PlacedBlock& placed, int64_t b, int64_t g) {
    const Block& block = placed.block;
    const int64_t q_row = placed.q_row, nq = block.q.size(), nk = block.k.size();
    const int64_t dq_at = ((b * p.heads + g * group) * rows_ + q_row) * d;
    const int64_t k_at = ((b * p.kv_heads + g) * kv_rows + placed.k_row) * d;
    BackwardArgs bw;
    bw.forward = piece_args(p, block, p.dtype);
    ForwardArgs& f = bw.forward;
    f.q = {row_at(q_view_, esize, b, g * group, q_row), q_view_.stride};
    f.k = {row_at(k, esize, b, g, placed.k_row), k.stride};
    f.v = {row_at(v, esize, b, g, placed.k_row), v.stride};
    bw.o = {row_at(o_view_, esize, b, g * group, q_row), o_view_.stride};
    bw.d_o = {row_at(d_o_view_, esize, b, g * group, q_row), d_o_view_.stride};
    bw.lse = lse_.data() + (b * p.heads + g * group) * rows_ + q_row;
    bw.lse_stride = {p.heads * rows_, rows_, 1};
    bw.dq = {part_dq_.data(), {group * nq * d, nq * d, d, 1}};
    bw.dk = {part_dk_.data(), {nk * d, nk * d, d, 1}};
    bw.dv = {part_dv_.data(), bw.dk.stride};
    bw.fp32_gradients = true;
    tileattn::detail::run_backward(bw, /*lse_of_these_keys=*/false);  // the LSE covers every rank's keys

    for (int64_t h = 0; h < group; ++h) {
      float* acc = dq_.data() + dq_at + h * rows_ * d;
      const float* part = part_dq_.data() + h * nq * d;
      for (int64_t e = 0; e < nq * d; ++e) acc[e] += part[e];
    }
    for (int64_t e = 0; e < nk * d; ++e) {
      dk[k_at + e] += part_dk_[size_t(e)];
      dv[k_at + e] += part_dv_[size_t(e)];
    }
  });
}

void RingGradients::write_dq(OutputView dq) const {
  const Problem& p = problem_;
  write_rounded(dq_.data(), p.batch, p.heads, rows_, p.head_dim, p.dtype, dq);
}

}  // namespace tileattn::mpi::detail
