// A forward problem decoded from fuzz input: a ForwardArgs with small sizes
// and arbitrary strides (dense, padded, negative, zero, overlapping, huge),
// dtypes, head counts, variable-length batches (some cu_seqlens corrupt), KV
// seqlens, paged block tables, masks, windows, scales, dropout, threads, ISA
// paths, tile overrides, score modifiers and the contiguous cache's
// batch_index / row_start, over buffers it owns (fuzz_views.hpp). fuzz_forward
// calls the forward on it and fuzz_backward the backward, so the two read an
// input the same way: every forward corpus input is a backward one.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "fuzz_views.hpp"
#include "tileattn/attention.hpp"

namespace fuzzviews {

inline std::vector<int32_t> make_cu_seqlens(FuzzedDataProvider& in, int64_t batch) {
  std::vector<int32_t> cu(size_t(batch + 1), 0);
  for (int64_t b = 0; b < batch; ++b) cu[size_t(b + 1)] = cu[size_t(b)] + in.ConsumeIntegralInRange<int32_t>(0, 9);
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0)  // a corrupt entry
    cu[in.ConsumeIntegralInRange<size_t>(0, cu.size() - 1)] = in.ConsumeIntegral<int32_t>();
  return cu;
}

// The arguments point into the problem's own buffers: it is built in place
// and never copied.
struct ForwardProblem {
  enum Source { dense, varlen, kv_seqlens, paged, varlen_q_kv_seqlens };

  tileattn::ForwardArgs args;  // o.data: o's buffer (fuzz_forward may place it on q)
  int64_t esize = 0;           // bytes per element of q, k, v and o
  Source source = dense;
  int64_t max_nq = 0, max_nk = 0;  // largest per-sequence lengths (valid inputs only)
  std::array<int64_t, 4> q_sizes{}, k_sizes{}, v_sizes{}, o_sizes{};  // K, V: pages when paged
  std::array<int64_t, 3> l_sizes{};
  ViewBuffer q, k, v, o, lse, mask;  // lse: empty when there is none
  bool alias_o_to_q = false;         // fuzz_forward's test of an output on an input
  std::vector<int32_t> cu_q, cu_k, seqlens, block_table, row_start, batch_index;
  ScoreModifiers modifiers;

  // `need_lse`: an LSE view (dense) also where the input chose none.
  ForwardProblem(FuzzedDataProvider& in, bool need_lse);
  ForwardProblem(const ForwardProblem&) = delete;
  ForwardProblem& operator=(const ForwardProblem&) = delete;

  // A view's byte extent overflows int64: the library must refuse it where used.
  bool overflow() const { return q.overflow || k.overflow || v.overflow || o.overflow || lse.overflow || mask.overflow; }
  // A view fits int64 but is larger than the harness allocates.
  bool unallocated() const {
    return q.too_large || k.too_large || v.too_large || o.too_large || lse.too_large || mask.too_large;
  }
};

inline ForwardProblem::ForwardProblem(FuzzedDataProvider& in, bool need_lse) {
  using tileattn::DType;
  using tileattn::MaskSpec;
  tileattn::ForwardArgs& a = args;
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  a.dtype = dtypes[in.ConsumeIntegralInRange<int>(0, 2)];
  esize = int64_t(tileattn::dtype_size(a.dtype));
  auto& s = a.shape;
  s.batch = in.ConsumeIntegralInRange<int64_t>(-1, 3);
  s.kv_heads = in.ConsumeIntegralInRange<int64_t>(0, 3);
  s.heads = in.ConsumeBool() ? s.kv_heads * in.ConsumeIntegralInRange<int64_t>(1, 3)
                             : in.ConsumeIntegralInRange<int64_t>(-1, 6);
  s.seqlen_q = in.ConsumeIntegralInRange<int64_t>(-1, 20);
  s.seqlen_k = in.ConsumeIntegralInRange<int64_t>(-1, 40);
  const int64_t dims[] = {1, 3, 16, 17, 33, 64, 80, 96, 128, 256, 0, 257, 576, 577};
  s.head_dim = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 48) : dims[in.ConsumeIntegralInRange<int>(0, 13)];
  // V's head dim: mostly Q/K's (0), else its own, in range or not.
  const int64_t v_dims[] = {0, 0, 0, 0, 1, 17, 128, 512, 513, -1};
  s.v_head_dim = v_dims[in.ConsumeIntegralInRange<int>(0, 9)];
  const int64_t v_dim = s.v_head_dim != 0 ? s.v_head_dim : s.head_dim;  // V's and O's

  // Variable-length batches, KV seqlens, pages.
  source = Source(in.ConsumeIntegralInRange<int>(0, 4));
  const int64_t batch = s.batch > 0 ? s.batch : 0;
  if (source == varlen || source == varlen_q_kv_seqlens) {
    cu_q = make_cu_seqlens(in, batch);
    a.cu_seqlens_q = cu_q.data();
    s.seqlen_q = cu_q.back() + in.ConsumeIntegralInRange<int64_t>(-1, 3);
  }
  if (source == varlen) {
    cu_k = make_cu_seqlens(in, batch);
    a.cu_seqlens_k = cu_k.data();
    s.seqlen_k = cu_k.back() + in.ConsumeIntegralInRange<int64_t>(-1, 3);
  }
  const bool from_cache = source == kv_seqlens || source == paged || source == varlen_q_kv_seqlens;
  if (from_cache) {
    for (int64_t b = 0; b < batch; ++b) seqlens.push_back(in.ConsumeIntegralInRange<int32_t>(-1, 41));
    a.kv.seqlens = seqlens.data();
  }
  if (source == paged) {
    a.kv.page_size = in.ConsumeIntegralInRange<int64_t>(0, 8);
    a.kv.num_pages = in.ConsumeIntegralInRange<int64_t>(-1, 12);
    a.kv.block_table_stride = in.ConsumeIntegralInRange<int64_t>(-1, 8);
    const int64_t entries = batch * (a.kv.block_table_stride > 0 ? a.kv.block_table_stride : 0);
    for (int64_t i = 0; i < entries; ++i) block_table.push_back(in.ConsumeIntegralInRange<int32_t>(-1, 12));
    block_table.push_back(0);  // never an empty vector: the pointer must be non-null
    a.kv.block_table = block_table.data();
  }

  max_nq = s.seqlen_q;
  max_nk = s.seqlen_k;
  if (!cu_q.empty()) {
    max_nq = 0;
    for (int64_t b = 0; b < batch; ++b) max_nq = std::max<int64_t>(max_nq, int64_t(cu_q[size_t(b + 1)]) - cu_q[size_t(b)]);
  }
  if (!cu_k.empty()) {
    max_nk = 0;
    for (int64_t b = 0; b < batch; ++b) max_nk = std::max<int64_t>(max_nk, int64_t(cu_k[size_t(b + 1)]) - cu_k[size_t(b)]);
  }
  if (!seqlens.empty()) {
    max_nk = 0;
    for (int32_t n : seqlens) max_nk = std::max<int64_t>(max_nk, n);
  }

  q_sizes = {cu_q.empty() ? s.batch : 1, s.heads, s.seqlen_q, s.head_dim};
  o_sizes = {q_sizes[0], s.heads, s.seqlen_q, v_dim};
  l_sizes = {q_sizes[0], s.heads, s.seqlen_q};
  k_sizes = {cu_k.empty() ? s.batch : 1, s.kv_heads, s.seqlen_k, s.head_dim};
  if (source == paged) {
    k_sizes[0] = a.kv.num_pages;
    k_sizes[2] = a.kv.page_size;
  }
  v_sizes = {k_sizes[0], k_sizes[1], k_sizes[2], v_dim};
  a.q.stride = pick_strides(in, q_sizes.data());
  a.k.stride = pick_strides(in, k_sizes.data());
  a.v.stride = in.ConsumeBool() ? a.k.stride : pick_strides(in, v_sizes.data());
  a.o.stride = in.ConsumeBool() ? a.q.stride : pick_strides(in, o_sizes.data());
  q = make_view_buffer(q_sizes.data(), a.q.stride.data(), 4, esize);
  k = make_view_buffer(k_sizes.data(), a.k.stride.data(), 4, esize);
  v = make_view_buffer(v_sizes.data(), a.v.stride.data(), 4, esize);
  o = make_view_buffer(o_sizes.data(), a.o.stride.data(), 4, esize);

  const std::array<int64_t, 3> dense_lse{s.heads * s.seqlen_q, s.seqlen_q, 1};
  if (in.ConsumeBool()) {
    if (in.ConsumeBool()) {
      a.lse_stride = dense_lse;
    } else {
      for (auto& x : a.lse_stride) x = in.ConsumeIntegralInRange<int64_t>(-40, 40);
    }
    lse = make_view_buffer(l_sizes.data(), a.lse_stride.data(), 3, 4);
  } else if (need_lse) {
    a.lse_stride = dense_lse;
    lse = make_view_buffer(l_sizes.data(), a.lse_stride.data(), 3, 4);
  }

  // Masks.
  const int mask_kind = in.ConsumeIntegralInRange<int>(0, 4);
  a.mask.causal = in.ConsumeBool();
  const int64_t windows[] = {-2, -1, 0, 1, 3, 17, int64_t{1} << 40, std::numeric_limits<int64_t>::max()};
  a.mask.window_left = windows[in.ConsumeIntegralInRange<int>(0, 7)];
  a.mask.window_right = windows[in.ConsumeIntegralInRange<int>(0, 7)];
  const int64_t m_sizes[4] = {s.batch, s.heads, max_nq, max_nk};
  if (mask_kind == 1 || mask_kind == 2 || mask_kind == 3) {
    a.mask.kind = mask_kind == 1 ? MaskSpec::Kind::boolean : MaskSpec::Kind::additive;
    if (mask_kind == 3) a.mask.kind = static_cast<MaskSpec::Kind>(in.ConsumeIntegralInRange<int>(3, 9));
    for (size_t i = 0; i < 4; ++i) {
      const int mode = in.ConsumeIntegralInRange<int>(0, 2);
      int64_t dense = 1;
      for (size_t j = i + 1; j < 4; ++j)  // corrupt cu_seqlens may make sizes huge
        if (__builtin_mul_overflow(dense, std::max<int64_t>(1, m_sizes[j]), &dense)) dense = 1;
      a.mask.stride[i] = mode == 0 ? 0 : mode == 1 ? dense : in.ConsumeIntegralInRange<int64_t>(-30, 30);
    }
    const int64_t mask_esize = a.mask.kind == MaskSpec::Kind::boolean ? 1 : 4;
    mask = make_view_buffer(m_sizes, a.mask.stride.data(), 4, mask_esize);
  }

  const float scales[] = {std::numeric_limits<float>::quiet_NaN(), 0.125f, 1.0f, 0.0f, -2.0f, 1e20f,
                          std::numeric_limits<float>::infinity(), 1e-30f};
  a.scale = scales[in.ConsumeIntegralInRange<int>(0, 7)];
  const float dropouts[] = {0.0f, 0.0f, 0.25f, 0.999f, 1.0f, -0.5f, std::numeric_limits<float>::quiet_NaN()};
  a.dropout_p = dropouts[in.ConsumeIntegralInRange<int>(0, 6)];
  a.seed = in.ConsumeIntegral<uint64_t>();
  a.threads = in.ConsumeIntegralInRange<int>(-1, 3);
  const tileattn::Isa isas[] = {tileattn::Isa::automatic, tileattn::Isa::generic, tileattn::Isa::avx2,
                                tileattn::Isa::avx512, tileattn::Isa::reference};
  a.isa = isas[in.ConsumeIntegralInRange<int>(0, 4)];
  const int blocks[] = {0, 0, 0, 1, 3, 16, 33, 64, -1, 2000};
  a.block_q = blocks[in.ConsumeIntegralInRange<int>(0, 9)];
  a.block_kv = blocks[in.ConsumeIntegralInRange<int>(0, 9)];

  alias_o_to_q = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  fill_values(in, q, a.dtype);
  fill_values(in, k, a.dtype);
  fill_values(in, v, a.dtype);
  if (mask.bytes.size()) {
    if (a.mask.kind == MaskSpec::Kind::boolean) {
      for (auto& byte : mask.bytes) byte = in.ConsumeIntegralInRange<unsigned char>(0, 2);
    } else {
      fill_values(in, mask, DType::f32);
    }
  }
  // Later additions read what the input has left, so the corpus files
  // written before them keep every earlier choice: the bf16 rungs (a CPU
  // without one refuses it: NotSupported) and bf16_probabilities; then the
  // score modifiers, and for KV seqlens batch_index / cache_batch and
  // row_start (paged: NotSupported), indices in range and out.
  if (in.ConsumeIntegralInRange<int>(0, 3) == 1)
    a.isa = in.ConsumeBool() ? tileattn::Isa::avx512bf16 : tileattn::Isa::amx;
  a.bf16_probabilities = in.ConsumeBool();
  modifiers = pick_score_modifiers(in, s.batch, s.heads);
  modifiers.apply(a);
  if (from_cache && in.ConsumeBool()) {
    for (int64_t b = 0; b < batch; ++b) row_start.push_back(in.ConsumeIntegralInRange<int32_t>(-1, 42));
    row_start.push_back(0);  // non-null for an empty batch
    a.kv.row_start = row_start.data();
  }
  if (from_cache && in.ConsumeBool()) {
    const int64_t rows = std::max<int64_t>(k_sizes[0], 0);  // K's and V's outer size
    a.kv.cache_batch = in.ConsumeIntegralInRange<int64_t>(-1, rows);
    for (int64_t b = 0; b < batch; ++b)
      batch_index.push_back(in.ConsumeIntegralInRange<int32_t>(-1, int32_t(std::min<int64_t>(rows, 100))));
    batch_index.push_back(0);
    a.kv.batch_index = batch_index.data();
  }

  a.q.data = q.data();
  a.k.data = k.data();
  a.v.data = v.data();
  a.o.data = o.data();
  a.lse = lse.bytes.empty() ? nullptr : reinterpret_cast<float*>(lse.data());
  a.mask.data = mask.data();
}

}  // namespace fuzzviews
