// The backward main loop, written once and compiled once per ISA, on the same
// `Kernels` struct as the forward (gemm, load_row, pack_transposed, exp2_sum);
// see mainloop.hpp for their contracts.
//
// Included by each ISA's backward translation unit inside namespace
// tileattn::detail::<isa>, after that ISA's kernels, <cmath>, <cstring>,
// <limits>, <vector> and "training/backward_problem.hpp".
//
// One work item = (sequence, KV head, key chunk). For each key tile of the
// chunk: pack K, K^T and V^T once; then for every query head of the group and
// every query tile that sees the key tile:
//   S  = scale * log2(e) * Q K^T   (log2 units; Q K^T alone where the scale
//        waits for the exponentials, deferred_score_scale, as in the forward)
//   S  = C tanh(S / C)        (soft cap C, when on; the mask step)
//   P  = exp2(S - LSE2)       (mask on partial tiles only; exponentials())
//   dV += (P o Z)^T dO      (V's head dim Dv; Q and K take D)
//   dP = dO V^T
//   dS = P o (Z o dP - D)     (o (1 - tanh^2) through a soft cap)
//   dQ_chunk += dS K,   dK += dS^T Q
// dK and dV of the key tile are final after the last query tile: rounded to
// the output dtype once. dQ sums over chunks afterwards (backward.cpp).
//
// bf16 inputs on a Kernels with bf16 products (Problem::product ==
// bf16_dot: the avx512bf16 and amx rungs) run all five products as bf16 dot
// products with fp32 sums, in the forward's pair layout (bf16_kernels.hpp):
// S = Q K^T and dP = dO V^T on the inputs themselves (exact products; Q
// unscaled, the scale folded into the exponentials or applied to the fp32
// scores, as the forward's Bf16Operands::scores), and dV, dQ, dK with their fp32 A operand (P^T, dS,
// dS^T) split into bf16 hi + lo, as the forward splits P. Every rung forms S
// with one helper (scores()), shared with the normalizer pass.
// Otherwise the products run on FP32 FMAs (K::gemm), Q unscaled where the
// scale waits for the exponentials, else pre-scaled.
// Measured (AMD EPYC Zen 5, avx512bf16, 2 threads, bf16, H8 N2048 D128, no
// mask; shared host at load ~3.5 on 2 cores, paired medians of 9):
// 212 ms with S on the dot products against 237 with S on FMAs (0.89), and
// 156 against 179 with P and dS in bf16 (0.87); the avx512 rung's FP32 FMAs
// take 240 ms (0.88 and 0.65 of that).

template <class K>
class BackwardMainloop {
 public:
  BackwardMainloop(const BackwardProblem& p, float* scratch)
      : p_(p), a_(p.fwd.args), layout_(backward_scratch_layout(p)) {
    kv_pad_ = round_up(p.fwd.block_kv, kPanelWidth);
    bq_pad_ = round_up(p.fwd.block_q, kPanelWidth);
    k_rows_ = scratch + layout_.k_rows;
    k_t_ = scratch + layout_.k_t;
    v_t_ = scratch + layout_.v_t;
    dk_ = scratch + layout_.dk;
    dv_ = scratch + layout_.dv;
    q_ = scratch + layout_.q;
    d_o_ = scratch + layout_.d_o;
    s_ = scratch + layout_.s;
    dp_ = scratch + layout_.dp;
    z_ = scratch + layout_.z;
    pd_ = p.dropout.active ? scratch + layout_.pd : s_;
    softcap_tanh_ = p.fwd.softcap_log2 > 0.0f ? scratch + layout_.softcap_tanh : nullptr;
    transposed_ = scratch + layout_.transposed;
    row_ptrs_ = reinterpret_cast<const void**>(scratch + layout_.row_ptrs);
    key_ptrs_ = reinterpret_cast<const void**>(scratch + layout_.key_ptrs);
    if constexpr (kHasBf16) {
      bf16_ = p.fwd.product == TileProduct::bf16_dot;
      auto bf16_piece = [&](int64_t offset) { return reinterpret_cast<uint16_t*>(scratch + offset); };
      q16_ = bf16_piece(layout_.q16);
      k_d_pairs_ = bf16_piece(layout_.k_d_pairs);
      k_pairs_ = bf16_piece(layout_.k_pairs);
      v_pairs_ = bf16_piece(layout_.v_pairs);
      d_o16_ = bf16_piece(layout_.d_o16);
      d_o_pairs_ = bf16_piece(layout_.d_o_pairs);
      q_pairs_ = bf16_piece(layout_.q_pairs);
      a_hi_ = bf16_piece(layout_.a_hi);
      a_lo_ = bf16_piece(layout_.a_lo);
    }
    deferred_ = deferred_score_scale(p.fwd);
  }

  // Rows rows[0, count) of head h in sequence b: the max of their scores S (and sink)
  // and 1 / sum exp2(S - max) into p.row_lse2 / p.row_inv_sum (see
  // row_statistics in backward.cpp), with S formed exactly as tile_pair
  // forms it (same loads, packing, GEMM and mask), so that each row's max is
  // bitwise one of the S that tile_pair subtracts it from: a normalizer from
  // differently rounded scores (a plain dot product) was 2-4x further off
  // than the LSE it replaced at |LSE| ~ 250-2500. A row that sees no key
  // keeps its LSE.
  void recompute_normalizers(int64_t b, int64_t h, const int64_t* rows, int64_t count) {
    constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
    const Sequence seq = sequence_of(p_.fwd, b);
    const int64_t kv_head = h / p_.fwd.group;
    if constexpr (kHasBf16) {
      if (bf16_) K::bf16_begin();
    }
    for (int64_t r0 = 0; r0 < count; r0 += p_.fwd.block_q) {
      const int64_t m = min64(p_.fwd.block_q, count - r0);
      std::vector<float> max(static_cast<size_t>(m)), sum(static_cast<size_t>(m));  // a rare path
      for (int64_t t = 0; t < m; ++t) {
        load_score_row(t, row_address(a_.q.data, a_.q.stride, seq.q_batch, h, seq.q_row0 + rows[r0 + t]));
        max[t] = kMinusInf;
        sum[t] = 0.0f;
      }
      // Each key tile's masked scores S, handed to visit(t, row, n).
      const auto for_each_tile = [&](auto visit) {
        for (int64_t j0 = 0; j0 < seq.nk; j0 += p_.fwd.block_kv) {
          const int64_t n = min64(p_.fwd.block_kv, seq.nk - j0);
          for (int64_t c = 0; c < n; ++c)
            key_ptrs_[c] = row_address(a_.k.data, a_.k.stride, seq.k_batch, kv_head, seq.k_row0 + j0 + c);
          pack_score_keys(n);
          scores(m, n);
          for (int64_t t = 0; t < m; ++t) {
            float* row = s_ + t * kv_pad_;
            mask_score_row(row, n, p_.fwd, seq, b, h, rows[r0 + t], j0, /*band_partial=*/true);
            visit(t, row, n);
          }
        }
      };
      if (deferred_ == 1.0f) {
        for_each_tile([&](int64_t t, float* row, int64_t n) {
          float tile_max = kMinusInf;
          for (int64_t c = 0; c < n; ++c) tile_max = row[c] > tile_max ? row[c] : tile_max;
          if (tile_max > max[t]) {
            sum[t] *= std::exp2(max[t] - tile_max);  // 0 while max[t] is -inf
            max[t] = tile_max;
          }
          if (max[t] == kMinusInf) return;
          for (int64_t c = 0; c < n; ++c) sum[t] += std::exp2(row[c] - max[t]);
        });
      } else {
        // Unscaled scores (deferred_): the max first, scaled as the forward
        // scales its tile maxima (a positive factor keeps the arg max), then
        // the sum of exponentials() (tile_pair's P, unnormalized), whose
        // rule (fold below kScoreFoldLimit) needs that max.
        for_each_tile([&](int64_t t, float* row, int64_t n) {
          for (int64_t c = 0; c < n; ++c) max[t] = row[c] > max[t] ? row[c] : max[t];
        });
        for (int64_t t = 0; t < m; ++t)
          if (max[t] != kMinusInf) max[t] = scale_keeping_finite(max[t], deferred_);
        for_each_tile([&](int64_t t, float* row, int64_t n) {
          if (max[t] == kMinusInf) return;
          exponentials(row, n, max[t]);
          for (int64_t c = 0; c < n; ++c) sum[t] += row[c];
        });
      }
      for (int64_t t = 0; t < m; ++t) {
        if (a_.sinks) fold_sink(a_.sinks[h] * kLog2e, max[t], sum[t]);  // the LSE holds the sink too
        if (max[t] == kMinusInf) continue;
        const int64_t slot = row_slot(p_, b, h, rows[r0 + t]);
        p_.row_lse2[slot] = max[t];
        p_.row_inv_sum[slot] = 1.0f / sum[t];
      }
    }
    if constexpr (kHasBf16) {
      if (bf16_) K::bf16_end();
    }
  }

  void run(const BackwardItem& w) {
    const Sequence seq = sequence_of(p_.fwd, w.batch);
    const int64_t dp = p_.fwd.head_dim_padded, dvp = p_.fwd.v_head_dim_padded;
    if constexpr (kHasBf16) {
      if (bf16_) K::bf16_begin();
    }
    for (int64_t j0 = w.key_begin; j0 < w.key_end; j0 += p_.fwd.block_kv) {
      const int64_t n = min64(p_.fwd.block_kv, w.key_end - j0);
      load_kv_tile(seq, w, j0, n);
      std::memset(dk_, 0, sizeof(float) * n * dp);
      std::memset(dv_, 0, sizeof(float) * n * dvp);
      const KeyRange queries = visible_queries(p_.fwd.band, seq, j0, j0 + n);
      const int64_t first_tile = queries.first / p_.fwd.block_q * p_.fwd.block_q;
      for (int64_t h = w.kv_head * p_.fwd.group; h < (w.kv_head + 1) * p_.fwd.group; ++h)
        for (int64_t q0 = first_tile; q0 < queries.last; q0 += p_.fwd.block_q) {
          const int64_t i_begin = max64(q0, queries.first);
          const int64_t i_end = min64(q0 + p_.fwd.block_q, queries.last);
          // As in the forward: a pair a boolean mask hides whole adds nothing
          // to dQ, dK or dV (its P is 0); one it keeps whole takes no mask step.
          const MaskTile mask_tile = boolean_mask_tile(p_.fwd, w.batch, h, h + 1, i_begin, i_end, j0, j0 + n);
          if (mask_tile == MaskTile::hidden) continue;
          tile_pair(seq, w, h, i_begin, i_end, j0, n, mask_tile == MaskTile::partial);
        }
      store_kv_gradients(seq, w, j0, n);
    }
    if constexpr (kHasBf16) {
      if (bf16_) K::bf16_end();
    }
  }

 private:
  static constexpr bool kHasBf16 = requires { K::kBf16Products; };

  // One (query tile, key tile) pair of head h: rows [i_begin, i_end), keys [j0, j0 + n).
  // Flattened: called out of line, GCC 12 keeps the AVX2 register tile's
  // accumulator arrays on the stack (a spill per FMA pair, measured 2x slower
  // per FLOP than the forward, where the kernels are inlined).
  // mask_tensor: the pair needs the mask tensor (not one a boolean mask keeps whole).
  [[gnu::flatten]] void tile_pair(const Sequence& seq, const BackwardItem& w, int64_t h, int64_t i_begin,
                 int64_t i_end, int64_t j0, int64_t n, bool mask_tensor) {
    const int64_t dp = p_.fwd.head_dim_padded;
    const int64_t dvp = p_.fwd.v_head_dim_padded, dv = p_.fwd.v_head_dim;
    const int64_t rows = i_end - i_begin, n_pad = round_up(n, kPanelWidth);
    load_query_rows(seq, h, i_begin, rows);
    scores(rows, n);  // S (rows, n_pad)
    const bool band_partial = !tile_fully_visible(p_.fwd.band, seq, i_begin, i_end, j0, j0 + n);
    if (needs_mask_step(p_.fwd, band_partial, mask_tensor))
      apply_mask(seq, w.batch, h, i_begin, rows, j0, n, band_partial, mask_tensor);
    for (int64_t t = 0; t < rows; ++t) {
      // P = exp2(S - LSE2): exactly the forward's normalized probabilities
      // (times 1 / sum for the rows whose LSE was too large to hold them).
      const int64_t slot = row_slot(p_, w.batch, h, i_begin + t);
      exponentials(s_ + t * kv_pad_, n, p_.row_lse2[slot]);
      if (const float inv_sum = p_.row_inv_sum[slot]; inv_sum != 1.0f)
        for (int64_t c = 0; c < n; ++c) s_[t * kv_pad_ + c] *= inv_sum;
      if (p_.dropout.active) {
        float* z = z_ + t * kv_pad_;
        const float* p = s_ + t * kv_pad_;
        float* pd = pd_ + t * kv_pad_;
        for (int64_t c = 0; c < n; ++c) z[c] = 1.0f;
        apply_dropout_row(p_.dropout, w.batch, h, i_begin + t, j0, z, n);
        for (int64_t c = 0; c < n_pad; ++c) pd[c] = p[c] * (c < n ? z[c] : 0.0f);
      }
    }
    // dV += (P o Z)^T dO: (n, rows) x (rows, Dv_pad).
    if (bf16_) {
      bf16_product_of_split(pd_, kv_pad_, n, rows, /*transposed=*/true, d_o_pairs_, layout_.bf16_q, dv_, dvp);
      bf16_dot(rows, n_pad, layout_.bf16_dv, d_o16_, nullptr, layout_.bf16_dv, v_pairs_,
               kPanelWidth * layout_.bf16_dv, dp_, kv_pad_, false);  // dP (rows, n_pad)
    } else {
      transpose_tile(pd_, rows, n);
      K::gemm(n, dvp, rows, transposed_, bq_pad_, d_o_, dvp, dv_, dvp, true);
      K::gemm(rows, n_pad, dv, d_o_, dvp, v_t_, kv_pad_, dp_, kv_pad_, false);  // dP (rows, n_pad)
    }
    for (int64_t t = 0; t < rows; ++t) {
      const float delta = p_.row_delta[row_slot(p_, w.batch, h, i_begin + t)];
      const float* p = s_ + t * kv_pad_;
      float* ds = dp_ + t * kv_pad_;
      if (p_.dropout.active) {
        const float* z = z_ + t * kv_pad_;
        for (int64_t c = 0; c < n; ++c) ds[c] = p[c] * (z[c] * ds[c] - delta);
      } else {
        for (int64_t c = 0; c < n; ++c) ds[c] = p[c] * (ds[c] - delta);
      }
      if (softcap_tanh_) {
        // Through the cap: d(C tanh(s / C)) / ds = 1 - tanh^2 (core/softcap.hpp;
        // the same in log2 and natural units). dS above is the gradient of the
        // capped natural-unit score; this makes it that of scale * Q K^T, which
        // the products below take as before. Masked keys have P = 0, dS = 0.
        const float* th = softcap_tanh_ + t * kv_pad_;
        for (int64_t c = 0; c < n; ++c) ds[c] *= (1.0f - th[c]) * (1.0f + th[c]);
      }
    }
    // dQ += dS K: (rows, n) x (n, D_pad), into this chunk's fp32 slice.
    float* dq = p_.dq_partial + dq_slot(p_, w.chunk, w.batch, h, i_begin) * dp;
    if (bf16_) bf16_product_of_split(dp_, kv_pad_, rows, n, /*transposed=*/false, k_pairs_, layout_.bf16_kv, dq, dp);
    else K::gemm(rows, dp, n, dp_, kv_pad_, k_rows_, dp, dq, dp, true);
    // dK += dS^T Q: (n, rows) x (rows, D_pad) (Q unscaled for the bf16 products
    // and a deferred scale: store_kv_gradients' factor takes it).
    if (bf16_) {
      bf16_product_of_split(dp_, kv_pad_, n, rows, /*transposed=*/true, q_pairs_, layout_.bf16_q, dk_, dp);
    } else {
      transpose_tile(dp_, rows, n);
      K::gemm(n, dp, rows, transposed_, bq_pad_, q_, dp, dk_, dp, true);
    }
  }

  // The scores' operands and product, one definition for tile_pair and
  // recompute_normalizers (which needs S bitwise as tile_pair forms it).
  // Query row t of the scores' A operand: fp32 (q_), pre-scaled by scale *
  // log2(e) unless the exponentials take the scale (deferred_), or for the
  // bf16 products bf16 and unscaled (q16_), so that every product is exact
  // and summed in fp32, as in the forward.
  void load_score_row(int64_t t, const void* src) {
    const int64_t d = a_.shape.head_dim;
    if constexpr (kHasBf16) {
      if (bf16_) {
        K::bf16_copy_row(src, d, a_.q.stride[3], q16_ + t * layout_.bf16_d, layout_.bf16_d);
        return;
      }
    }
    K::load_row(src, a_.dtype, d, a_.q.stride[3], query_scale(p_.fwd), q_ + t * p_.fwd.head_dim_padded);
  }

  // The key tile key_ptrs_[0, n) as the scores' B operand: K^T fp32
  // panel-major (k_t_), or K with pairs along D (k_d_pairs_).
  void pack_score_keys(int64_t n) {
    const int64_t d = a_.shape.head_dim;
    if constexpr (kHasBf16) {
      if (bf16_) {
        K::bf16_pack_k(key_ptrs_, n, d, a_.k.stride[3], k_d_pairs_, layout_.bf16_d);
        return;
      }
    }
    K::pack_transposed(key_ptrs_, n, a_.dtype, d, a_.k.stride[3], k_t_, kv_pad_);
  }

  // s_ (m, n_pad) = S = Q K^T in log2 units (scale * log2(e) Q K^T) of the m
  // loaded query rows and the packed key tile, or unscaled where deferred_
  // leaves the scale to the exponentials (exponentials()); elsewhere the
  // bf16 products scale the fp32 sums afterwards.
  void scores(int64_t m, int64_t n) {
    const int64_t n_pad = round_up(n, kPanelWidth);
    if constexpr (kHasBf16) {
      if (bf16_) {
        const int64_t k = layout_.bf16_d;
        K::bf16_gemm(m, n_pad, k, q16_, nullptr, k, k_d_pairs_, kPanelWidth * k, s_, kv_pad_, false);
        if (deferred_ == 1.0f)
          for (int64_t t = 0; t < m; ++t) K::scale(s_ + t * kv_pad_, n, p_.fwd.score_scale);
        return;
      }
    }
    K::gemm(m, n_pad, a_.shape.head_dim, q_, p_.fwd.head_dim_padded, k_t_, kv_pad_, s_, kv_pad_, false);
  }

  // K::bf16_gemm where the Kernels has it (bf16_ is false elsewhere).
  void bf16_dot(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate) {
    if constexpr (kHasBf16) K::bf16_gemm(m, n, k, a, a_lo, lda, b, b_panel, c, ldc, accumulate);
  }

  // c (m, width) += A B, where B holds k rows in pairs along them (pad = k
  // rounded up to 32, panel 16 x pad) and A (m, k) is fp32: the rows of a
  // (row stride lda), or with `transposed` the transpose of a tile of score
  // rows (P or dS: k rows of m, row stride lda). A is split into bf16 hi + lo
  // first, or rounded to bf16 alone with ForwardArgs::bf16_probabilities (P
  // and dS in bf16, as FlashAttention-2's backward rounds them: one product
  // instead of two). width: D_pad (dQ, dK) or Dv_pad (dV).
  // The transpose is split in one pass (bf16_split_transposed: the bits of
  // transpose_tile then the split, without the fp32 transpose written and
  // read back). AMX Xeon model 167, bf16, 1 thread, build against build, 3
  // rounds: H8 N2048 D128 0.93-0.98 of the time, with bf16_probabilities
  // 0.88-0.92, H16 D64 0.94-0.97.
  void bf16_product_of_split(const float* a, int64_t lda, int64_t m, int64_t k, bool transposed,
                             const uint16_t* b, int64_t pad, float* c, int64_t width) {
    if constexpr (kHasBf16) {
      const int64_t k32 = round_up(k, kBf16PairBlock);
      uint16_t* lo = a_.bf16_probabilities ? nullptr : a_lo_;
      if (transposed) K::bf16_split_transposed(a, lda, k, m, k32, a_hi_, lo, pad);
      else K::bf16_split_rows(a, lda, m, k, k32, a_hi_, lo, pad);
      K::bf16_gemm(m, width, k32, a_hi_, lo, pad, b, kPanelWidth * pad, c, width, true);
    }
  }

  // transposed_ (n, BLOCK_Q_pad) = tile (rows, n)^T, with the forward's K^T packer.
  void transpose_tile(const float* tile, int64_t rows, int64_t n) {
    for (int64_t t = 0; t < rows; ++t) row_ptrs_[t] = tile + t * kv_pad_;
    K::pack_transposed(row_ptrs_, rows, DType::f32, n, 1, transposed_, bq_pad_);
  }

  const char* row_address(const void* data, const std::array<int64_t, 4>& stride, int64_t batch,
                          int64_t head, int64_t row) const {
    const int64_t esize = int64_t(dtype_size(a_.dtype));
    return static_cast<const char*>(data) +
           (batch * stride[0] + head * stride[1] + row * stride[2]) * esize;
  }

  // Q (the scores' A operand: load_score_row) and dO of rows [i_begin,
  // i_begin + rows); for the bf16 products also dO as rows and both in pairs
  // along the rows.
  void load_query_rows(const Sequence& seq, int64_t h, int64_t i_begin, int64_t rows) {
    const int64_t d = a_.shape.head_dim;
    const int64_t dvp = p_.fwd.v_head_dim_padded, dv = p_.fwd.v_head_dim;  // dO's
    const BackwardArgs& b = *p_.args;
    for (int64_t t = 0; t < rows; ++t) {
      const int64_t row = seq.q_row0 + i_begin + t;
      load_score_row(t, row_address(a_.q.data, a_.q.stride, seq.q_batch, h, row));
      if (!bf16_)
        K::load_row(row_address(b.d_o.data, b.d_o.stride, seq.q_batch, h, row), a_.dtype, dv,
                    b.d_o.stride[3], 1.0f, d_o_ + t * dvp);
    }
    if constexpr (kHasBf16) {
      if (!bf16_) return;
      for (int64_t t = 0; t < rows; ++t) {
        row_ptrs_[t] = row_address(b.d_o.data, b.d_o.stride, seq.q_batch, h, seq.q_row0 + i_begin + t);
        K::bf16_copy_row(row_ptrs_[t], dv, b.d_o.stride[3], d_o16_ + t * layout_.bf16_dv, layout_.bf16_dv);
      }
      K::bf16_pack_v(row_ptrs_, rows, dv, b.d_o.stride[3], d_o_pairs_, layout_.bf16_q);
      for (int64_t t = 0; t < rows; ++t)
        row_ptrs_[t] = row_address(a_.q.data, a_.q.stride, seq.q_batch, h, seq.q_row0 + i_begin + t);
      K::bf16_pack_v(row_ptrs_, rows, d, a_.q.stride[3], q_pairs_, layout_.bf16_q);
    }
  }

  // K rows (n, D_pad), K^T (D_pad, BLOCK_KV_pad) and V^T (Dv_pad, BLOCK_KV_pad),
  // fp32, once per key tile; for the bf16 products K with pairs along D and
  // along keys, and V with pairs along Dv, instead.
  void load_kv_tile(const Sequence& seq, const BackwardItem& w, int64_t j0, int64_t n) {
    const int64_t dp = p_.fwd.head_dim_padded, d = a_.shape.head_dim, dv = p_.fwd.v_head_dim;
    for (int64_t c = 0; c < n; ++c) {
      key_ptrs_[c] = row_address(a_.k.data, a_.k.stride, seq.k_batch, w.kv_head, seq.k_row0 + j0 + c);
      if (!bf16_) K::load_row(key_ptrs_[c], a_.dtype, d, a_.k.stride[3], 1.0f, k_rows_ + c * dp);
    }
    pack_score_keys(n);
    if constexpr (kHasBf16) {
      if (bf16_) K::bf16_pack_v(key_ptrs_, n, d, a_.k.stride[3], k_pairs_, layout_.bf16_kv);
    }
    for (int64_t c = 0; c < n; ++c)
      key_ptrs_[c] = row_address(a_.v.data, a_.v.stride, seq.k_batch, w.kv_head, seq.k_row0 + j0 + c);
    if constexpr (kHasBf16) {
      if (bf16_) {
        K::bf16_pack_k(key_ptrs_, n, dv, a_.v.stride[3], v_pairs_, layout_.bf16_dv);
        return;
      }
    }
    K::pack_transposed(key_ptrs_, n, a_.dtype, dv, a_.v.stride[3], v_t_, kv_pad_);
  }

  // row[0, n) := P = exp2(S - lse2) of one row's scores: with a deferred
  // scale exp2(fma(S, scale, -lse2)), the forward's folded form, or where
  // |lse2| reaches kScoreFoldLimit the scores scaled first. The forward
  // decides per chunk of rows from its tile maxima, this per row from the
  // LSE: the two forms differ by a rounding (~2^-12 log2 units at the limit).
  // recompute_normalizers follows this rule, so its normalizer and P agree.
  void exponentials(float* row, int64_t n, float lse2) {
    if (deferred_ == 1.0f) {
      K::exp2_sum(row, n, lse2);
    } else if (std::fabs(lse2) < kScoreFoldLimit) {
      float sum;
      K::exp2_sum_rows_scaled(row, kv_pad_, 1, n, deferred_, &lse2, &sum);
    } else {
      for (int64_t c = 0; c < n; ++c) row[c] = scale_keeping_finite(row[c], deferred_);
      K::exp2_sum(row, n, lse2);
    }
  }

  // The forward's mask step (core/mask_row.hpp) on rows [i_begin, i_begin + rows) of head h.
  void apply_mask(const Sequence& seq, int64_t batch, int64_t h, int64_t i_begin, int64_t rows,
                  int64_t j0, int64_t n, bool band_partial, bool mask_tensor) {
    for (int64_t t = 0; t < rows; ++t)
      mask_score_row(s_ + t * kv_pad_, n, p_.fwd, seq, batch, h, i_begin + t, j0, band_partial,
                     softcap_tanh_ ? softcap_tanh_ + t * kv_pad_ : nullptr, mask_tensor);
  }

  // dK = ln(2) * (dS^T Q_scaled) = scale * dS^T Q (the bf16 products and a
  // deferred scale take Q unscaled: ln(2) * scale * log2(e) then); dV as
  // accumulated.
  void store_kv_gradients(const Sequence& seq, const BackwardItem& w, int64_t j0, int64_t n) {
    const int64_t dp = p_.fwd.head_dim_padded, d = a_.shape.head_dim;
    const int64_t dvp = p_.fwd.v_head_dim_padded, dv = p_.fwd.v_head_dim;
    const float dk_factor = bf16_ || deferred_ != 1.0f ? kLn2 * p_.fwd.score_scale : kLn2;
    const BackwardArgs& b = *p_.args;
    const DType grad_dtype = gradient_dtype(b);
    const int64_t esize = int64_t(dtype_size(grad_dtype));
    for (int64_t c = 0; c < n; ++c) {
      const int64_t row = seq.k_row0 + j0 + c;
      char* dk = static_cast<char*>(b.dk.data) +
                 (seq.k_batch * b.dk.stride[0] + w.kv_head * b.dk.stride[1] + row * b.dk.stride[2]) * esize;
      char* dv_row = static_cast<char*>(b.dv.data) +
                     (seq.k_batch * b.dv.stride[0] + w.kv_head * b.dv.stride[1] + row * b.dv.stride[2]) * esize;
      K::store_row(dk_ + c * dp, dk_factor, d, grad_dtype, dk, b.dk.stride[3]);
      K::store_row(dv_ + c * dvp, 1.0f, dv, grad_dtype, dv_row, b.dv.stride[3]);
    }
  }

  const BackwardProblem& p_;
  const ForwardArgs& a_;
  const BackwardScratchLayout layout_;
  bool bf16_ = false;  // bf16 products (p.fwd.product == bf16_dot on a Kernels that has them)
  float deferred_ = 1.0f;  // the scale the scores leave to the exponentials (1: none), as the forward's
  uint16_t *q16_ = nullptr, *k_d_pairs_ = nullptr, *k_pairs_ = nullptr, *v_pairs_ = nullptr, *d_o16_ = nullptr, *d_o_pairs_ = nullptr,
           *q_pairs_ = nullptr, *a_hi_ = nullptr, *a_lo_ = nullptr;
  int64_t kv_pad_ = 0, bq_pad_ = 0;
  float *k_rows_, *k_t_, *v_t_, *dk_, *dv_, *q_, *d_o_, *s_, *dp_, *z_, *pd_, *transposed_;
  float* softcap_tanh_ = nullptr;  // (BLOCK_Q, BLOCK_KV_pad): tanh of each capped score (softcap only)
  const void** row_ptrs_;
  const void** key_ptrs_;
};

// The entry the dispatcher calls for each work item (the main loop takes the
// bf16 products itself where Problem::product asks and Kernels has them).
inline void run_backward_item(const BackwardProblem& p, const BackwardItem& w, float* scratch) {
  BackwardMainloop<Kernels> loop(p, scratch);
  loop.run(w);
}

// The entry of the normalizer pass (backward.cpp, before the items).
inline void run_backward_normalizers(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                                     int64_t count, float* scratch) {
  BackwardMainloop<Kernels> loop(p, scratch);
  loop.recompute_normalizers(b, h, rows, count);
}
