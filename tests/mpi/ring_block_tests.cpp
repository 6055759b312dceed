// Ring attention without MPI: the shard plans, the block trimming against a
// brute-force mask, and every rank's work replayed in one process and
// compared with the float64 reference (tolerance rule of problem_case.cpp),
// forward and backward (gradient rule of src/testing/tolerance.hpp, applied
// through tests/training/backward_support.hpp).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <utility>

#include "mpi/ring_block.hpp"
#include "mpi/ring_gradients.hpp"
#include "testing/problem_case.hpp"
#include "training/backward_support.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/mpi.hpp"

namespace tileattn::mpi {
namespace {

using detail::Band;
using detail::Block;
using detail::make_band;
using detail::plan_block;
using detail::RingAccumulator;

TEST(ShardPlan, EveryRowOnceAndZigzagChunks) {
  for (ShardLayout layout : {ShardLayout::contiguous, ShardLayout::zigzag})
    for (int64_t n : {0, 1, 5, 12, 97, 1000})
      for (int ranks : {1, 2, 3, 4, 7}) {
        const ShardPlan plan(n, ranks, layout);
        std::vector<int> seen(size_t(n), 0);
        int64_t min_rows = n, max_rows = 0;
        for (int r = 0; r < ranks; ++r) {
          for (int64_t i = 0; i < plan.rows(r); ++i) ++seen[size_t(plan.global_row(r, i))];
          min_rows = std::min(min_rows, plan.rows(r));
          max_rows = std::max(max_rows, plan.rows(r));
          if (layout == ShardLayout::zigzag && n >= 2 * ranks) {
            ASSERT_EQ(plan.segments(r).size(), 2u);
            // chunk r and chunk 2P-1-r of 2P
            EXPECT_EQ(plan.segments(r)[0].begin, r * n / (2 * ranks));
            EXPECT_EQ(plan.segments(r)[1].end, (2 * ranks - r) * n / (2 * ranks));
          }
        }
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[size_t(i)], 1) << "row " << i;
        EXPECT_LE(max_rows - min_rows, layout == ShardLayout::zigzag ? 2 : 1) << n << " rows, " << ranks;
        EXPECT_EQ(plan.max_rows(), max_rows);
      }
  EXPECT_THROW(ShardPlan(10, 0, ShardLayout::zigzag), Error);
  EXPECT_THROW(ShardPlan(-1, 2, ShardLayout::zigzag), Error);
  EXPECT_THROW(ShardPlan(10, 2, ShardLayout::zigzag).global_row(0, 5), Error);
}

// The (query, key) global pairs a block lets through, read with
// ForwardArgs' bottom-right alignment, must be exactly the band's pairs.
TEST(PlanBlock, MatchesBruteForceMask) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> pos(0, 40), side(-1, 12);
  for (int trial = 0; trial < 4000; ++trial) {
    Segment q{pos(rng), 0}, k{pos(rng), 0};
    q.end = q.begin + pos(rng) / 2 + 1;
    k.end = k.begin + pos(rng) / 2 + 1;
    const bool causal = trial % 3 == 0;
    const Band band = make_band(causal, side(rng), side(rng));
    std::set<std::pair<int64_t, int64_t>> expected, got;
    for (int64_t i = q.begin; i < q.end; ++i)
      for (int64_t j = k.begin; j < k.end; ++j)
        if (i - band.left <= j && j <= i + band.right) expected.insert({i, j});
    const std::optional<Block> block = plan_block(q, k, band);
    if (!block) {
      EXPECT_TRUE(expected.empty()) << "trial " << trial;
      continue;
    }
    EXPECT_GE(block->q.begin, q.begin);
    EXPECT_LE(block->q.end, q.end);
    EXPECT_GE(block->k.begin, k.begin);
    EXPECT_LE(block->k.end, k.end);
    const int64_t nq = block->q.size(), nk = block->k.size(), offset = nk - nq;
    std::vector<int> row_keys(size_t(nq), 0);
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t j = 0; j < nk; ++j) {
        const bool left_ok = block->window_left < 0 || i + offset - block->window_left <= j;
        const bool right_ok = block->window_right < 0 || j <= i + offset + block->window_right;
        if (left_ok && right_ok) {
          got.insert({block->q.begin + i, block->k.begin + j});
          ++row_keys[size_t(i)];
        }
      }
    EXPECT_EQ(got, expected) << "trial " << trial;
    EXPECT_EQ(detail::visible_pairs(*block), int64_t(expected.size()));
    // Trimming leaves no query row without a key (such rows would only add -inf merges).
    for (int64_t i = 0; i < nq; ++i) EXPECT_GT(row_keys[size_t(i)], 0) << "trial " << trial;
  }
}

struct RingCase {
  testing::Case c;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  int ranks = 2;
  ShardLayout layout = ShardLayout::zigzag;
  Isa isa = Isa::automatic;
};

std::vector<unsigned char> slice_rows(const ShardPlan& plan, int rank, const InputView& full,
                                      int64_t batch, int64_t heads, int64_t dim, size_t esize) {
  const int64_t rows = plan.rows(rank);
  std::vector<unsigned char> out(size_t(batch * heads * rows * dim) * esize);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t g = plan.global_row(rank, r);
        const auto* src = static_cast<const unsigned char*>(full.data) +
                          (b * full.stride[0] + h * full.stride[1] + g * full.stride[2]) * int64_t(esize);
        std::memcpy(out.data() + size_t(((b * heads + h) * rows + r) * dim) * esize, src, size_t(dim) * esize);
      }
  return out;
}

// Replays every rank: rank r absorbs the slices of ranks r, r-1, ... in ring
// order, exactly as ring_attention_forward does, and writes its rows of O
// and LSE into the full case's outputs.
// o_bytes, when given, receives the full O's storage bytes.
testing::Comparison replay(const RingCase& rc, std::vector<int64_t>* pairs_per_rank_step = nullptr,
                           std::vector<unsigned char>* o_bytes = nullptr) {
  testing::CaseData full(rc.c);
  full.args.mask.causal = rc.causal;
  full.args.mask.window_left = rc.window_left;
  full.args.mask.window_right = rc.window_right;
  const AttentionShape& s = full.args.shape;
  const size_t esize = dtype_size(rc.c.dtype);
  const ShardPlan plan(s.seqlen_q, rc.ranks, rc.layout);
  std::vector<std::vector<unsigned char>> k(size_t(rc.ranks)), v(size_t(rc.ranks));
  for (int r = 0; r < rc.ranks; ++r) {
    k[size_t(r)] = slice_rows(plan, r, full.args.k, s.batch, s.kv_heads, s.head_dim, esize);
    v[size_t(r)] = slice_rows(plan, r, full.args.v, s.batch, s.kv_heads, s.head_dim, esize);
  }
  RingAccumulator::Problem p;
  p.batch = s.batch;
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.dtype = rc.c.dtype;
  p.scale = full.args.scale;
  p.threads = 1;
  p.isa = rc.isa;
  p.band = make_band(rc.causal, rc.window_left, rc.window_right);
  for (int r = 0; r < rc.ranks; ++r) {
    const int64_t rows = plan.rows(r);
    std::vector<unsigned char> q = slice_rows(plan, r, full.args.q, s.batch, s.heads, s.head_dim, esize);
    RingAccumulator acc(p, {q.data(), dense_strides(Layout::bhsd, s.batch, s.heads, rows, s.head_dim)},
                        plan.segments(r));
    int calls = 0;
    for (int step = 0; step < rc.ranks; ++step) {
      const int holder = (r - step + rc.ranks) % rc.ranks;
      const std::array<int64_t, 4> st = dense_strides(Layout::bhsd, s.batch, s.kv_heads, plan.rows(holder), s.head_dim);
      const int64_t before = acc.visible_pairs();
      acc.absorb({k[size_t(holder)].data(), st}, {v[size_t(holder)].data(), st}, plan.segments(holder),
                 [&] { ++calls; });
      if (pairs_per_rank_step) pairs_per_rank_step->push_back(acc.visible_pairs() - before);
    }
    EXPECT_EQ(calls, acc.blocks_computed() * s.batch * s.kv_heads);
    std::vector<unsigned char> o(size_t(s.batch * s.heads * rows * s.head_dim) * esize);
    std::vector<float> lse(size_t(s.batch * s.heads * rows));
    acc.write({o.data(), dense_strides(Layout::bhsd, s.batch, s.heads, rows, s.head_dim)}, lse.data(),
              {s.heads * rows, rows, 1});
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t g = plan.global_row(r, i);
          const auto& os = full.args.o.stride;
          std::memcpy(static_cast<unsigned char*>(full.args.o.data) + (b * os[0] + h * os[1] + g * os[2]) * int64_t(esize),
                      o.data() + size_t(((b * s.heads + h) * rows + i) * s.head_dim) * esize,
                      size_t(s.head_dim) * esize);
          full.lse[size_t((b * s.heads + h) * s.seqlen_q + g)] = lse[size_t((b * s.heads + h) * rows + i)];
        }
  }
  if (o_bytes) {
    const unsigned char* o = rc.c.dtype == DType::f32 ? reinterpret_cast<const unsigned char*>(full.o32.data())
                                                      : reinterpret_cast<const unsigned char*>(full.o16.data());
    o_bytes->assign(o, o + (rc.c.dtype == DType::f32 ? full.o32.size() * 4 : full.o16.size() * 2));
  }
  return testing::compare_with_reference(full);
}

TEST(RingReplay, MatchesReferenceAcrossMasksShapesAndRanks) {
  int checked = 0;
  for (int ranks : {1, 2, 3, 4})
    for (ShardLayout layout : {ShardLayout::zigzag, ShardLayout::contiguous})
      for (int64_t n : {1, 7, 97, 130})
        for (int mask = 0; mask < 5; ++mask) {
          RingCase rc;
          rc.ranks = ranks;
          rc.layout = layout;
          rc.c.seqlen_q = rc.c.seqlen_k = n;
          rc.c.heads = 4;
          rc.c.kv_heads = 2;
          rc.c.head_dim = n == 97 ? 59 : 64;
          rc.c.seed = uint64_t(ranks * 1000 + n * 10 + mask);
          if (mask == 1) rc.causal = true;
          if (mask == 2) rc.window_left = 16, rc.window_right = 0;
          if (mask == 3) rc.window_left = 7, rc.window_right = 3;
          if (mask == 4) rc.causal = true, rc.window_left = 20;
          const testing::Comparison cmp = replay(rc);
          EXPECT_TRUE(cmp.ok()) << "ranks " << ranks << " " << shard_layout_name(layout) << " n " << n
                                << " mask " << mask << ": " << cmp.describe();
          ++checked;
        }
  EXPECT_EQ(checked, 4 * 2 * 4 * 5);
}

TEST(RingReplay, LowPrecisionMqaAndBatches) {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32})
    for (bool causal : {false, true}) {
      RingCase rc;
      rc.ranks = 3;
      rc.causal = causal;
      rc.c.dtype = dtype;
      rc.c.batch = 2;
      rc.c.heads = 3;
      rc.c.kv_heads = 1;
      rc.c.seqlen_q = rc.c.seqlen_k = 200;
      rc.c.head_dim = 80;
      rc.c.input_scale = 2.0f;  // sharper softmax: partials differ more
      const testing::Comparison cmp = replay(rc);
      EXPECT_TRUE(cmp.ok()) << dtype_name(dtype) << (causal ? " causal" : "") << ": " << cmp.describe();
    }
}

// fp16/bf16 storage: the partial outputs stay fp32 through the merges and O
// is rounded once, at the end, so the ring meets the accuracy rule (2 x the
// naive same-precision error + floor) like the single-process operator. Many
// seeds and small head dims, where one rounding more per partial shows.
TEST(RingReplay, SixteenBitRoundsOnceAcrossSeeds) {
  int failed = 0, checked = 0;
  for (DType dtype : {DType::f16, DType::bf16})
    for (int ranks : {1, 3})
      for (int64_t dim : {8, 16, 32})
        for (bool causal : {false, true})
          for (uint64_t seed = 1; seed <= 6; ++seed) {
            RingCase rc;
            rc.ranks = ranks;
            rc.causal = causal;
            rc.c.dtype = dtype;
            rc.c.heads = rc.c.kv_heads = 2;
            rc.c.seqlen_q = rc.c.seqlen_k = 64;
            rc.c.head_dim = dim;
            rc.c.seed = seed;
            const testing::Comparison cmp = replay(rc);
            ++checked;
            if (!cmp.ok()) ++failed;
            EXPECT_TRUE(cmp.ok()) << dtype_name(dtype) << " ranks " << ranks << " dim " << dim
                                  << (causal ? " causal" : "") << " seed " << seed << ": " << cmp.describe();
          }
  EXPECT_EQ(failed, 0) << "of " << checked;
}

// One rank holding one contiguous slice runs one piece per (batch, KV head)
// over every key: its O equals single-process attention_forward's bit for
// bit on every path, 16-bit storage included, because the piece reads the
// inputs in their dtype (bf16 on its dot products on the bf16 rungs) and
// writes fp32 (fp32_output), which the merge into the empty state keeps and
// write() rounds once, as the single-process epilogue rounds.
TEST(RingReplay, OneRankEqualsSingleProcessForwardOnEveryPath) {
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
      if (!isa_available(isa)) continue;
      RingCase rc;
      rc.ranks = 1;
      rc.layout = ShardLayout::contiguous;
      rc.causal = true;
      rc.isa = isa;
      rc.c.dtype = dtype;
      rc.c.heads = 4;
      rc.c.kv_heads = 2;
      rc.c.seqlen_q = rc.c.seqlen_k = 130;
      rc.c.head_dim = 64;
      testing::CaseData single(rc.c);
      single.args.mask.causal = true;
      single.args.isa = isa;
      single.args.threads = 1;
      attention_forward(single.args);
      std::vector<unsigned char> o_ring;
      const testing::Comparison cmp = replay(rc, nullptr, &o_ring);
      EXPECT_TRUE(cmp.ok()) << cmp.describe();
      const unsigned char* o_single = dtype == DType::f32 ? reinterpret_cast<const unsigned char*>(single.o32.data())
                                                          : reinterpret_cast<const unsigned char*>(single.o16.data());
      ASSERT_EQ(o_ring.size(), (dtype == DType::f32 ? single.o32.size() * 4 : single.o16.size() * 2));
      EXPECT_EQ(std::memcmp(o_ring.data(), o_single, o_ring.size()), 0)
          << dtype_name(dtype) << " on " << isa_name(isa) << ": the ring's O differs from attention_forward's";
    }
}

// Zig-zag gives every rank the same visible work at every step under a
// causal mask; contiguous slices do not (the last rank does the most).
TEST(RingReplay, ZigzagBalancesCausalWork) {
  for (ShardLayout layout : {ShardLayout::zigzag, ShardLayout::contiguous}) {
    RingCase rc;
    rc.ranks = 4;
    rc.layout = layout;
    rc.causal = true;
    rc.c.heads = rc.c.kv_heads = 1;
    rc.c.seqlen_q = rc.c.seqlen_k = 96;  // divisible by 2P
    rc.c.head_dim = 16;
    std::vector<int64_t> pairs;  // [rank][step]
    ASSERT_TRUE(replay(rc, &pairs).ok());
    int64_t total = 0;
    for (int64_t x : pairs) total += x;
    EXPECT_EQ(total, 96 * 97 / 2);
    bool balanced = true;
    for (int step = 0; step < rc.ranks; ++step)
      for (int r = 1; r < rc.ranks; ++r)
        balanced &= pairs[size_t(r * rc.ranks + step)] == pairs[size_t(step)];
    EXPECT_EQ(balanced, layout == ShardLayout::zigzag) << shard_layout_name(layout);
  }
}

// The inverse of slice_rows: a rank's dense rows back into their global places.
void unslice_rows(const ShardPlan& plan, int rank, const std::vector<unsigned char>& local, const OutputView& full,
                  int64_t batch, int64_t heads, int64_t dim, size_t esize) {
  const int64_t rows = plan.rows(rank);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t g = plan.global_row(rank, r);
        auto* dst = static_cast<unsigned char*>(full.data) +
                    (b * full.stride[0] + h * full.stride[1] + g * full.stride[2]) * int64_t(esize);
        std::memcpy(dst, local.data() + size_t(((b * heads + h) * rows + r) * dim) * esize, size_t(dim) * esize);
      }
}

// Replays ring_attention_backward in one process, from the single-process
// forward's O and LSE: rank r's RingGradients absorbs the slices of ranks r,
// r-1, ... in ring order, and each slice's dK/dV shares are summed in the
// ring's order (the owner's right neighbour first, the owner's own share
// last). Writes the gathered dQ, dK, dV into data's gradient buffers.
// A dense [batch, heads, rows, dim] slice copied into rows of dim + pad
// elements, for views that are not dense.
struct PaddedRows {
  std::vector<unsigned char> bytes;
  std::array<int64_t, 4> stride;
};
PaddedRows pad_rows(const std::vector<unsigned char>& dense, int64_t batch, int64_t heads, int64_t rows,
                    int64_t dim, size_t esize, int64_t pad) {
  const int64_t row = dim + pad;
  PaddedRows out{std::vector<unsigned char>(size_t(batch * heads * rows * row) * esize, 0xff),
                 {heads * rows * row, rows * row, row, 1}};
  for (int64_t i = 0; i < batch * heads * rows; ++i)
    std::memcpy(out.bytes.data() + size_t(i * row) * esize, dense.data() + size_t(i * dim) * esize,
                size_t(dim) * esize);
  return out;
}

void replay_backward(testing::BackwardData& data, int ranks, ShardLayout layout, Band band, int64_t pad = 0,
                     std::vector<int64_t>* pairs_per_rank_step = nullptr, Isa isa = Isa::automatic) {
  const ForwardArgs& a = data.args.forward;
  const AttentionShape& s = a.shape;
  const DType dt = a.dtype;
  const size_t esize = dtype_size(dt);
  const ShardPlan plan(s.seqlen_q, ranks, layout);
  std::vector<std::vector<unsigned char>> k(static_cast<size_t>(ranks)), v(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    k[size_t(r)] = slice_rows(plan, r, a.k, s.batch, s.kv_heads, s.head_dim, esize);
    v[size_t(r)] = slice_rows(plan, r, a.v, s.batch, s.kv_heads, s.head_dim, esize);
  }
  RingAccumulator::Problem p;
  p.batch = s.batch;
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.dtype = dt;
  p.scale = a.scale;
  p.threads = 1;
  p.isa = isa;
  p.band = band;
  auto slice_elements = [&](int holder) { return size_t(s.batch * s.kv_heads * plan.rows(holder) * s.head_dim); };
  // shares[h][r]: rank r's fp32 (dK, dV) share of slice h.
  std::vector<std::vector<std::vector<float>>> shares(static_cast<size_t>(ranks),
                                                      std::vector<std::vector<float>>(static_cast<size_t>(ranks)));
  const InputView lse_view{data.args.lse, {data.args.lse_stride[0], data.args.lse_stride[1], data.args.lse_stride[2], 1}};
  for (int r = 0; r < ranks; ++r) {
    const int64_t rows = plan.rows(r);
    const std::array<int64_t, 4> q_stride = dense_strides(Layout::bhsd, s.batch, s.heads, rows, s.head_dim);
    const std::vector<unsigned char> q = slice_rows(plan, r, a.q, s.batch, s.heads, s.head_dim, esize);
    const std::vector<unsigned char> o = slice_rows(plan, r, data.args.o, s.batch, s.heads, s.head_dim, esize);
    const std::vector<unsigned char> d_o = slice_rows(plan, r, data.args.d_o, s.batch, s.heads, s.head_dim, esize);
    const std::vector<unsigned char> lse = slice_rows(plan, r, lse_view, s.batch, s.heads, 1, sizeof(float));
    // Q, O and dO as views with `pad` unused elements after each row.
    const PaddedRows q_in = pad_rows(q, s.batch, s.heads, rows, s.head_dim, esize, pad);
    const PaddedRows o_in = pad_rows(o, s.batch, s.heads, rows, s.head_dim, esize, pad);
    const PaddedRows d_o_in = pad_rows(d_o, s.batch, s.heads, rows, s.head_dim, esize, pad);
    detail::RingGradients gradients(p, {q_in.bytes.data(), q_in.stride}, {o_in.bytes.data(), o_in.stride},
                                    {d_o_in.bytes.data(), d_o_in.stride},
                                    reinterpret_cast<const float*>(lse.data()), {s.heads * rows, rows, 1},
                                    plan.segments(r));
    int calls = 0;
    for (int step = 0; step < ranks; ++step) {
      const int holder = (r - step + ranks) % ranks;
      std::vector<float>& share = shares[size_t(holder)][size_t(r)];
      share.assign(2 * slice_elements(holder), 0.0f);
      const std::array<int64_t, 4> st = dense_strides(Layout::bhsd, s.batch, s.kv_heads, plan.rows(holder), s.head_dim);
      const int64_t before = gradients.visible_pairs();
      gradients.absorb({k[size_t(holder)].data(), st}, {v[size_t(holder)].data(), st}, plan.segments(holder),
                       share.data(), share.data() + slice_elements(holder), [&] { ++calls; });
      if (pairs_per_rank_step) pairs_per_rank_step->push_back(gradients.visible_pairs() - before);
    }
    EXPECT_EQ(calls, gradients.blocks_computed() * s.batch * s.kv_heads);
    std::vector<unsigned char> dq(q.size());
    gradients.write_dq({dq.data(), q_stride});
    unslice_rows(plan, r, dq, data.args.dq, s.batch, s.heads, s.head_dim, esize);
  }
  for (int h = 0; h < ranks; ++h) {
    std::vector<float> travelling = shares[size_t(h)][size_t((h + 1) % ranks)];
    for (int hop = 2; hop < ranks; ++hop) {
      const std::vector<float>& share = shares[size_t(h)][size_t((h + hop) % ranks)];
      for (size_t e = 0; e < travelling.size(); ++e) travelling[e] = share[e] + travelling[e];
    }
    std::vector<float> total = shares[size_t(h)][size_t(h)];
    if (ranks > 1)
      for (size_t e = 0; e < total.size(); ++e) total[e] += travelling[e];
    const int64_t rows = plan.rows(h);
    const std::array<int64_t, 4> st = dense_strides(Layout::bhsd, s.batch, s.kv_heads, rows, s.head_dim);
    std::vector<unsigned char> dk(slice_elements(h) * esize), dv(dk.size());
    detail::write_rounded(total.data(), s.batch, s.kv_heads, rows, s.head_dim, dt, {dk.data(), st});
    detail::write_rounded(total.data() + slice_elements(h), s.batch, s.kv_heads, rows, s.head_dim, dt, {dv.data(), st});
    unslice_rows(plan, h, dk, data.args.dk, s.batch, s.kv_heads, s.head_dim, esize);
    unslice_rows(plan, h, dv, data.args.dv, s.batch, s.kv_heads, s.head_dim, esize);
  }
}

TEST(RingBackwardReplay, MatchesReferenceAcrossMasksShapesAndRanks) {
  int checked = 0;
  for (int ranks : {1, 2, 3, 4})
    for (ShardLayout layout : {ShardLayout::zigzag, ShardLayout::contiguous})
      for (int64_t n : {1, 7, 97, 130})
        for (int mask = 0; mask < 4; ++mask) {
          testing::BackwardCase bc;
          bc.c.seqlen_q = bc.c.seqlen_k = n;
          bc.c.heads = 4;
          bc.c.kv_heads = 2;
          bc.c.head_dim = n == 97 ? 59 : 64;
          bc.c.seed = uint64_t(ranks * 1000 + n * 10 + mask);
          Band band = make_band(false, -1, -1);
          if (mask == 1) bc.c.mask = testing::MaskCase::causal, band = make_band(true, -1, -1);
          if (mask == 2) bc.c.mask = testing::MaskCase::window, bc.c.window_left = 16, bc.c.window_right = 0;
          if (mask == 3) bc.c.mask = testing::MaskCase::window, bc.c.window_left = 7, bc.c.window_right = 3;
          if (mask >= 2) band = make_band(false, bc.c.window_left, bc.c.window_right);
          testing::BackwardData data(bc, Isa::automatic);
          replay_backward(data, ranks, layout, band);
          testing::expect_gradients_match_reference(
              data, "ranks " + std::to_string(ranks) + " " + shard_layout_name(layout) + " " + bc.name());
          ++checked;
        }
  EXPECT_EQ(checked, 4 * 2 * 4 * 4);
}

TEST(RingBackwardReplay, LowPrecisionMqaAndBatches) {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32})
    for (bool causal : {false, true}) {
      testing::BackwardCase bc;
      bc.c.dtype = dtype;
      bc.c.batch = 2;
      bc.c.heads = 3;
      bc.c.kv_heads = 1;
      bc.c.seqlen_q = bc.c.seqlen_k = 200;
      bc.c.head_dim = 80;
      bc.c.input_scale = 2.0f;  // sharper softmax: blocks differ more
      if (causal) bc.c.mask = testing::MaskCase::causal;
      testing::BackwardData data(bc, Isa::automatic);
      replay_backward(data, 3, ShardLayout::zigzag, make_band(causal, -1, -1));
      testing::expect_gradients_match_reference(data, bc.name());
    }
}

// Q, O and dO slices given as views with padded rows (read in
// place through the strides, in every storage dtype).
TEST(RingBackwardReplay, PaddedRowViews) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    testing::BackwardCase bc;
    bc.c.dtype = dtype;
    bc.c.seqlen_q = bc.c.seqlen_k = 90;
    bc.c.heads = 4;
    bc.c.kv_heads = 2;
    bc.c.head_dim = 48;
    bc.c.mask = testing::MaskCase::causal;
    testing::BackwardData data(bc, Isa::automatic);
    replay_backward(data, 3, ShardLayout::zigzag, make_band(true, -1, -1), 5);
    testing::expect_gradients_match_reference(data, "padded " + bc.name());
  }
}

// The backward attends the same blocks as the forward, so zig-zag balances
// its causal work per step too; checked against the forward's replay.
TEST(RingBackwardReplay, ZigzagBalancesCausalWorkLikeForward) {
  for (ShardLayout layout : {ShardLayout::zigzag, ShardLayout::contiguous}) {
    RingCase rc;
    rc.ranks = 4;
    rc.layout = layout;
    rc.causal = true;
    rc.c.heads = rc.c.kv_heads = 1;
    rc.c.seqlen_q = rc.c.seqlen_k = 96;
    rc.c.head_dim = 16;
    std::vector<int64_t> forward_pairs, backward_pairs;
    ASSERT_TRUE(replay(rc, &forward_pairs).ok());
    testing::BackwardCase bc;
    bc.c = rc.c;
    bc.c.mask = testing::MaskCase::causal;
    testing::BackwardData data(bc, Isa::automatic);
    replay_backward(data, rc.ranks, layout, make_band(true, -1, -1), 0, &backward_pairs);
    EXPECT_EQ(backward_pairs, forward_pairs) << shard_layout_name(layout);
    bool balanced = true;  // every rank the same work at each step, as the forward's test
    for (int step = 0; step < rc.ranks; ++step)
      for (int r = 1; r < rc.ranks; ++r)
        balanced &= backward_pairs[size_t(r * rc.ranks + step)] == backward_pairs[size_t(step)];
    EXPECT_EQ(balanced, layout == ShardLayout::zigzag) << shard_layout_name(layout);
  }
}

// With a single rank the ring is one attention_backward per (block, batch,
// kv head) on the whole sequence: the same as the single-process operator
// up to the fp32 sum of dQ over the blocks.
TEST(RingBackwardReplay, OneRankEqualsSingleProcessBackward) {
  testing::BackwardCase bc;
  bc.c.seqlen_q = bc.c.seqlen_k = 150;
  bc.c.heads = 4;
  bc.c.kv_heads = 2;
  bc.c.mask = testing::MaskCase::causal;
  testing::BackwardData data(bc, Isa::automatic);
  attention_backward(data.args);
  const std::vector<float> dq = data.dq.f32, dk = data.dk.f32, dv = data.dv.f32;
  replay_backward(data, 1, ShardLayout::contiguous, make_band(true, -1, -1));
  for (size_t e = 0; e < dq.size(); ++e) ASSERT_NEAR(data.dq.f32[e], dq[e], 1e-6f) << "dq " << e;
  for (size_t e = 0; e < dk.size(); ++e) ASSERT_NEAR(data.dk.f32[e], dk[e], 1e-6f) << "dk " << e;
  for (size_t e = 0; e < dv.size(); ++e) ASSERT_NEAR(data.dv.f32[e], dv[e], 1e-6f) << "dv " << e;
}

// 16-bit storage, one rank, one block per (batch, KV head): the block call
// reads Q, K, V, O and dO in their dtype (bf16 on its dot products on the
// bf16 rungs) and writes fp32 gradients (fp32_gradients), which the ring
// sums into zeroed accumulators and rounds once, so dQ, dK and dV equal the
// single-process backward's bit for bit on every path.
TEST(RingBackwardReplay, OneRankSixteenBitEqualsSingleProcessBackwardOnEveryPath) {
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    for (DType dtype : {DType::bf16, DType::f16}) {
      if (!isa_available(isa)) continue;
      testing::BackwardCase bc;
      bc.c.seqlen_q = bc.c.seqlen_k = 150;
      bc.c.heads = 4;
      bc.c.kv_heads = 2;
      bc.c.head_dim = 64;
      bc.c.mask = testing::MaskCase::causal;
      bc.c.dtype = dtype;
      testing::BackwardData data(bc, isa);
      data.args.forward.threads = 1;
      attention_backward(data.args);
      const std::vector<uint16_t> dq = data.dq.f16, dk = data.dk.f16, dv = data.dv.f16;
      replay_backward(data, 1, ShardLayout::contiguous, make_band(true, -1, -1), 0, nullptr, isa);
      EXPECT_EQ(data.dq.f16, dq) << dtype_name(dtype) << " on " << isa_name(isa) << ": dQ differs";
      EXPECT_EQ(data.dk.f16, dk) << dtype_name(dtype) << " on " << isa_name(isa) << ": dK differs";
      EXPECT_EQ(data.dv.f16, dv) << dtype_name(dtype) << " on " << isa_name(isa) << ": dV differs";
    }
}

// The float64 reference path (Isa::reference, TILEATTN_ISA=reference) in the
// ring: each block call must take P from the global LSE it is given, not
// from a softmax over the block's own keys, so the ring's gradients equal
// the single-process backward's.
TEST(RingBackwardReplay, ReferencePathEqualsSingleProcessBackward) {
  for (int ranks : {1, 3})
    for (bool causal : {false, true}) {
      testing::BackwardCase bc;
      bc.c.seqlen_q = bc.c.seqlen_k = 40;
      bc.c.heads = 4;
      bc.c.kv_heads = 2;
      bc.c.head_dim = 24;
      if (causal) bc.c.mask = testing::MaskCase::causal;
      testing::BackwardData data(bc, Isa::automatic);
      attention_backward(data.args);
      const std::vector<float> dq = data.dq.f32, dk = data.dk.f32, dv = data.dv.f32;
      replay_backward(data, ranks, ShardLayout::zigzag, make_band(causal, -1, -1), 0, nullptr, Isa::reference);
      const std::string label = "reference path, " + std::to_string(ranks) + " ranks, " + bc.name();
      testing::expect_gradients_match_reference(data, label);
      for (size_t e = 0; e < dq.size(); ++e) ASSERT_NEAR(data.dq.f32[e], dq[e], 1e-5f) << label << " dq " << e;
      for (size_t e = 0; e < dk.size(); ++e) ASSERT_NEAR(data.dk.f32[e], dk[e], 1e-5f) << label << " dk " << e;
      for (size_t e = 0; e < dv.size(); ++e) ASSERT_NEAR(data.dv.f32[e], dv[e], 1e-5f) << label << " dv " << e;
    }
}

}  // namespace
}  // namespace tileattn::mpi
