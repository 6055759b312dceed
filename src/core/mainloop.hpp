// The forward main loop, written once and compiled once per ISA.
//
// Included by each ISA's translation unit inside namespace
// tileattn::detail::<isa>, after that ISA's `Kernels` struct, which supplies:
//   gemm(m, n, k, a, lda, b, ldb, c, ldc, accumulate, b_panel, prefetch)
//       C(m,n) (+)= A(m,k) B(k,n), advancing the RowPrefetch (row_prefetch.hpp)
//       a few lines per register block
//       B(p, j) at b + (j / 16) * b_panel + p * ldb + j % 16; n, ldc multiples
//       of kPanelWidth; b and c 64-byte aligned
//   row_max(x, n) -> max (NaN if any is NaN), exp2_sum(x, n, sub) -> sum
//   (x := exp2(x - sub)), row_max_rows / exp2_sum_rows (the same over several
//   rows of a tile), exp2_sum_rows_scaled (x := exp2(x * scale - sub), for
//   scores whose scale waits for the exponentials: deferred_score_scale),
//   scale(x, n, alpha), load_row(src, dtype, n, stride,
//   scale, dst, panel), store_row(src, scale, n, dtype, dst, stride),
//   pack_transposed(rows, n_rows, dtype, d, stride, dst, ld, panel)
//
// Per work item (batch, KV head, query heads of that group, query tile, key
// split): load the Q tiles -> for each visible KV tile: pack K^T and V once,
// then for the stacked query rows of the group: S = Q K^T -> mask step (soft
// cap, masks: partial tiles only unless capped) -> online softmax -> acc += P V -> epilogue: the sink
// (if any) folded into the row's max and sum, O = acc / row_sum
// and LSE (or, for a key split, the partial pair merged afterwards). Decode
// on small pages walks several KV heads per item (Problem::kv_heads_per_item):
// each KV tile then runs once per KV head, with that head's group of rows.
// Masks, dtypes, layouts and KV sources are policies of this one loop, and
// so is the tile product: the packed operands and their products come from
// `Operands` (Fp32Operands: fp32 FMAs; Bf16Operands: bf16 dot products in
// the VNNI pair layout, AVX512-BF16 or AMX, for bf16 inputs), and with at
// most K::kFewRowsMax stacked rows (decode) and a Kernels that has
// few_rows_scores / few_rows_accumulate, nothing is packed and the products
// read K/V rows in place (few_rows_kernels.hpp).
//
// Query rows of the item's heads are stacked: stacked row s is head
// s / rows, query row q_begin + s % rows, so a decode step (rows = 1) runs the
// whole GQA group as one (heads, D) x (D, keys) product and every K/V byte is
// read once per group.
//
// This file has no includes of its own because it is included inside a
// namespace: the including file first includes <cmath>, <cstring>, <limits>
// and "core/mask_row.hpp" (which brings "core/problem.hpp").

// Packed fp32 operands: Q converted to fp32 (unscaled where the softmax
// takes the scale, deferred_score_scale; else pre-scaled by scale *
// log2(e)), K^T and V converted to fp32 once per KV tile; both products on
// K::gemm (fp32 FMAs).
template <class K>
class Fp32Operands {
 public:
  // scores() may leave the scale to the softmax (deferred_scale()).
  static constexpr bool kDeferredScale = true;
  Fp32Operands(const Problem& p, const ForwardScratchLayout& l, float* scratch)
      : p_(p), kv_dtype_(kv_storage_dtype(p.args.dtype, p.args.kv.quant)), kv_pad_(l.kv_pad),
        q_scale_(query_scale(p)),
        q_tile_(scratch + l.q_tile), k_t_(scratch + l.k_tile), v_tile_(scratch + l.v_tile) {}

  void begin_item(bool /*p_from_exponentials*/, int64_t /*rows_per_kv_tile*/) {}
  void end_item() {}

  float deferred_scale() const { return deferred_score_scale(p_); }

  // Row s of the stacked Q tile from `src` (the input's row, element stride `stride`).
  void load_q_row(int64_t s, const void* src, int64_t stride) {
    const int64_t dp = p_.head_dim_padded;
    K::load_row(src, p_.args.dtype, p_.args.shape.head_dim, stride, q_scale_, q_tile_ + s * dp);
  }

  // K^T (D, n_pad) and V (n, D_pad) from row addresses, panel-major: each
  // 16-column panel is one contiguous (rows, 16) block. Row-major tiles have
  // row strides of 256 and 512 bytes, which put a panel's rows in 16 and 8 of
  // L1's 64 sets; the panel then evicts itself and P V ran 13% slower than
  // Q K^T (58k against 52k cycles per 128x64 tile, D = 128); panel-major,
  // both run at 52k.
  // (A quantized cache's rows convert from int8 / fp8; their scales are
  // applied by the main loop to the scores and to P.)
  void pack_k(const void* const* rows, int64_t n, int64_t stride) {
    const int64_t d = p_.args.shape.head_dim;
    K::pack_transposed(rows, n, kv_dtype_, d, stride, k_t_, kPanelWidth, kPanelWidth * d);
  }
  void pack_v(const void* const* rows, int64_t n, int64_t stride) {
    for (int64_t c = 0; c < n; ++c)
      K::load_row(rows[c], kv_dtype_, p_.v_head_dim, stride, 1.0f, v_tile_ + c * kPanelWidth,
                  kPanelWidth * n);
  }

  // s (m, n_pad) = Q (stacked rows [s0, s0 + m)) K^T: in log2 units, or
  // unscaled where deferred_scale() says so.
  void scores(int64_t s0, int64_t m, int64_t n, float* s, int64_t lds, RowPrefetch* prefetch) {
    const int64_t dp = p_.head_dim_padded, d = p_.args.shape.head_dim;
    K::gemm(m, round_up(n, kPanelWidth), d, q_tile_ + s0 * dp, dp, k_t_, kPanelWidth, s, lds, false,
            kPanelWidth * d, prefetch);
  }

  // Rows of each product step: the whole score tile.
  int64_t product_rows(int64_t m) const { return m; }
  // P = exp2(S - row_max) stays in the score tile (accumulate reads it).
  static constexpr bool kOwnExponentials = false;

  // acc (m, Dv_pad) += P (m, n) V.
  void accumulate(int64_t m, int64_t n, const float* p, int64_t ldp, float* acc, RowPrefetch* prefetch,
                  bool /*p_in_operands*/, int64_t /*t0*/) {
    const int64_t dvp = p_.v_head_dim_padded;
    K::gemm(m, dvp, n, p, ldp, v_tile_, kPanelWidth, acc, dvp, true, kPanelWidth * n, prefetch);
  }

  // The products run when called: nothing is pending.
  void finish_products() {}

 private:
  const Problem& p_;
  DType kv_dtype_;  // K/V storage (the inputs' dtype, or int8 / fp8 for a quantized cache)
  int64_t kv_pad_;
  float q_scale_;  // Q's factor: 1 where the softmax takes the scale
  float* q_tile_;
  float* k_t_;
  float* v_tile_;
};

// Packed bf16 operands for bf16 inputs (Problem::product == bf16_dot): Q
// kept bf16 and unscaled (the products are then exact, summed in fp32, and
// the scale is applied to the fp32 scores), K and V in the VNNI pair layout
// (bf16_kernels.hpp), P split into bf16 hi + lo so that P V keeps P's fp32
// precision (docs/accuracy.md: the naive bf16 implementation keeps P in
// fp32, and P rounded to bf16 alone exceeds twice its error), or P as hi
// alone where the caller asks for it (ForwardArgs::bf16_probabilities: one
// P V product instead of two). The products are K::bf16_gemm (vdpbf16ps or
// AMX tiles).
template <class K>
class Bf16Operands {
 public:
  // scores() may leave the scale to the softmax (deferred_scale()).
  static constexpr bool kDeferredScale = true;
  Bf16Operands(const Problem& p, const ForwardScratchLayout& l, float* scratch)
      : p_(p), bf16_k_(l.bf16_k), bf16_kv_pad_(l.bf16_kv_pad),
        q_tile_(reinterpret_cast<uint16_t*>(scratch + l.q_tile)),
        k_tile_(reinterpret_cast<uint16_t*>(scratch + l.k_tile)),
        v_tile_(reinterpret_cast<uint16_t*>(scratch + l.v_tile)),
        p_hi_(reinterpret_cast<uint16_t*>(scratch + l.p_hi)),
        p_lo_(p.args.bf16_probabilities ? nullptr : reinterpret_cast<uint16_t*>(scratch + l.p_lo)),
        p_lo_scales_(scratch + l.p_lo_scales), v_q_(reinterpret_cast<uint8_t*>(scratch + l.v_q)),
        lo_offsets_(reinterpret_cast<int32_t*>(scratch + l.p_lo_offsets)), v_q_scales_(scratch + l.v_q_scales),
        s_tile_(scratch + l.s_tile), kv_pad_(l.kv_pad) {
    // A quantized cache's int8 / fp8 e4m3 rows convert to bf16 exactly (every
    // int8 and every e4m3 value is a bf16 value): packed from the cache's
    // bytes (unit stride) or through staged rows (stage_rows); the K scales
    // stay with the main loop (scale_columns on the scores), the V scales
    // go on P in the exponentials (scale_p_columns_by).
    if (p.args.kv.quant != KvQuant::none) {
      quantized_rows_ = true;
      kv_dtype_ = kv_storage_dtype(p.args.dtype, p.args.kv.quant);
      staged_row_ = l.kv_staged_row;
      staged_ = reinterpret_cast<uint16_t*>(scratch + l.kv_staged);
      staged_f32_ = scratch + l.kv_staged_f32;
      staged_rows_ = reinterpret_cast<const void**>(scratch + l.kv_staged_rows);
    }
    // P from the exponentials in place over the scores (AMX, hi + lo): each
    // 32-column piece's 128 bytes of S become its 32 hi words then its 32 lo
    // words (a_step 64), so a band's S and P take 32 KiB of L1 instead of 64,
    // and the tile stores of the next band's scores, which wait for S lines
    // that are not in L1 (docs/architecture.md), find more of them there.
    // Measured (AMX Xeon model 167, bf16, 2 threads, the builds before and
    // after alternating, 4 rounds): H8 N4096 D128 0.97-1.0 of the time
    // (medians 63.4 against 65.4 ms), causal 0.97-0.98 (one round 0.82),
    // H16 N4096 D64 0.98-1.0, causal GQA 32/8 N2048 even. The separate P
    // rows stay for P from elsewhere (dropout scales an fp32 P), P as hi
    // alone, and key tiles that are not whole 32-key pieces.
    if constexpr (requires { K::kAsyncProducts; })
      p_in_place_ = p_lo_ != nullptr && kv_pad_ == bf16_kv_pad_;
    // P V's lo on int8 products (isa/avx512bf16/lo_int8.hpp) where the rung
    // has them; an item's tile takes them where its P comes from the
    // exponentials (begin_item) and pack_v says its V allows (tile_lo_int8_).
    if constexpr (requires { K::kLoOnInt8; })
      if constexpr (K::kLoOnInt8) lo_int8_ = p_lo_ != nullptr && !p_in_place_ && K::lo_on_int8_take();
  }

  // A quantized cache's V scales of the tile being packed ((kv_pad) floats,
  // filled before each pack_v): exponentials() writes P times them (the
  // main loop's scale_columns, fused), the row sums staying P's own.
  void scale_p_columns_by(const float* v_scales) { v_scales_ = v_scales; }

  // p_from_exponentials: the item's P comes from exponentials() (else from
  // fp32 rows, accumulate's p), so its tiles may take lo on int8 products
  // where more than kLoInt8MinRows stacked rows share each V tile
  // (rows_per_kv_tile): V's int8 pack (pack_v_int8, per tile and KV head)
  // is then paid for. AMD EPYC Zen 4, `tileattn decode --prompt 8192
  // --new-tokens N`, 2 threads, Llama-3-8B heads (4 query heads per KV
  // head), per-step ratio to the bf16 cache's step, 3 rounds: int8 cache,
  // 16 rows (N 4) 1.16-1.22 with the int8 lo against 1.11-1.14 with the
  // bf16 lo, fp8 1.25-1.35 against 1.19-1.24; 32 rows (N 8) even
  // (1.12-1.20 / 1.10-1.16); 64 rows (N 16) 1.10 against 1.11-1.14; a bf16
  // cache's own step at 16 rows even (3.87-4.08 against 3.79-4.00 ms).
  static constexpr int64_t kLoInt8MinRows = 32;
  void begin_item(bool p_from_exponentials, int64_t rows_per_kv_tile) {
    K::bf16_begin();
    lo_int8_item_ = lo_int8_ && p_from_exponentials && rows_per_kv_tile > kLoInt8MinRows;
    tile_lo_int8_ = false;
  }
  void end_item() { K::bf16_end(); }

  void load_q_row(int64_t s, const void* src, int64_t stride) {
    K::bf16_copy_row(src, p_.args.shape.head_dim, stride, q_tile_ + s * bf16_k_, bf16_k_);
  }
  // A quantized cache's rows with unit stride pack straight from its bytes
  // (QuantizedRows); strided ones through staged bf16 rows (stage_rows).
  // AMD EPYC Zen 4, bf16 queries, 16 rows per KV head against 8192 int8
  // keys, 1 thread: staging took ~20% of the call (docs/inference.md).
  void pack_k(const void* const* rows, int64_t n, int64_t stride) {
    const int64_t d = p_.args.shape.head_dim;
    if (quantized_rows_ && stride == 1) return K::bf16_pack_quantized(false, kv_dtype_, rows, n, d, k_tile_, bf16_k_);
    if (quantized_rows_) rows = stage_rows(rows, n, d, stride), stride = 1;
    K::bf16_pack_k(rows, n, d, stride, k_tile_, bf16_k_);
  }
  void pack_v(const void* const* rows, int64_t n, int64_t stride) {
    const int64_t d = p_.v_head_dim;
    if (quantized_rows_ && stride == 1) {
      K::bf16_pack_quantized(true, kv_dtype_, rows, n, d, v_tile_, bf16_kv_pad_);
    } else {
      if (quantized_rows_) rows = stage_rows(rows, n, d, stride), stride = 1;
      K::bf16_pack_v(rows, n, d, stride, v_tile_, bf16_kv_pad_);
    }
    if constexpr (requires { K::kLoOnInt8; })
      if (lo_int8_item_)
        tile_lo_int8_ = scales_take_lo_int8(n) &&
                        K::lo_int8_pack_v(v_tile_, bf16_kv_pad_, p_.v_head_dim_padded, v_q_, v_q_scales_);
  }

  // The tile's V scales (a quantized cache; none: true) within [2^-40, 2^40]:
  // P times them keeps lo's bytes above lo_int8.hpp's row floor (2^-100)
  // wherever P is above 2^-52 of its row's running max. Others keep the
  // bf16 lo, as their P V did before.
  bool scales_take_lo_int8(int64_t n) const {
    if (!v_scales_) return true;
    bool in_range = true;
    for (int64_t c = 0; c < n; ++c) in_range &= v_scales_[c] >= 0x1p-40f && v_scales_[c] <= 0x1p40f;
    return in_range;
  }

  // The factor the softmax still applies to the scores (1: none; problem.hpp).
  float deferred_scale() const { return deferred_score_scale(p_); }

  // Rows [0, n) of d quantized elements (element stride `stride`) as bf16
  // rows of the staging piece, unscaled, zero past d; returns their addresses.
  // Per row: the ISA's fp32 load (int8 / e4m3 exactly), then rounded to bf16,
  // which changes nothing. A tile's conversions serve all its query rows.
  const void* const* stage_rows(const void* const* rows, int64_t n, int64_t d, int64_t stride) {
    for (int64_t c = 0; c < n; ++c) {
      uint16_t* row = staged_ + c * staged_row_;
      K::load_row(rows[c], kv_dtype_, d, stride, 1.0f, staged_f32_);
      K::bf16_split_rows(staged_f32_, 0, 1, d, round_up(d, kBf16PairBlock), row, nullptr, staged_row_);
      staged_rows_[c] = row;
    }
    return staged_rows_;
  }

  // s (m, n_pad) = Q (stacked rows [s0, s0 + m)) K^T, unscaled where
  // deferred_scale() says so. May be queued (see queue_blocks): done by the
  // next finish_products().
  void scores(int64_t s0, int64_t m, int64_t n, float* s, int64_t lds, RowPrefetch* prefetch) {
    const int64_t n_pad = round_up(n, kPanelWidth);
    if (deferred_scale() != 1.0f &&
        queue_blocks(m, n_pad, bf16_k_, q_tile_ + s0 * bf16_k_, nullptr, bf16_k_, k_tile_, kPanelWidth * bf16_k_,
                     s, lds, false, prefetch))
      return;
    // The queued P V of the band two before reads the rows these scores
    // overwrite (the main loop's two sets of band rows): it runs first.
    finish_products();
    K::bf16_gemm(m, n_pad, bf16_k_, q_tile_ + s0 * bf16_k_, nullptr, bf16_k_, k_tile_, kPanelWidth * bf16_k_,
                 s, lds, false, prefetch);
    if (deferred_scale() == 1.0f)
      for (int64_t t = 0; t < m; ++t) K::scale(s + t * lds, n, p_.score_scale);
  }

  // Rows of each product step (scores, softmax, P V) with 128-key tiles or
  // more: 32 rows keep the step's scores (16 KiB at 128 keys), P and
  // accumulator rows in L1 between the tile products, where 256 rows sent
  // them to L2: amx, bf16, D128, no mask, H2 N2048 1 thread min of 15 calls
  // 9.5 ms against 10.0 (64 rows: 9.8); H8 N4096 2 threads 72-74 ms against
  // 77-78. With 64-key tiles (masked calls) the whole tile: causal H8 N4096,
  // 2 threads, 47.3 ms against 51 in 32-row steps.
  static constexpr int64_t kBlockRows = 32;  // rows of a queued tile block
  int64_t product_rows(int64_t m) const { return p_.block_kv >= 128 ? min64(m, kBlockRows) : m; }
  // Blocks that scores() and accumulate() queue for m stacked rows against
  // n_pad keys (whole 32-row bands only; the others run where called).
  int64_t queued_blocks(int64_t m, int64_t n_pad) const {
    if constexpr (requires { K::kAsyncProducts; }) {
      if (product_rows(m) != kBlockRows) return 0;
      const int64_t per_band = (deferred_scale() != 1.0f ? (n_pad + 31) / 32 : 0) + (p_.v_head_dim_padded + 31) / 32;
      return m / kBlockRows * per_band;
    }
    (void)m, (void)n_pad;
    return 0;
  }
  // The softmax can write P straight into the hi + lo rows P V reads
  // (exponentials()), without an fp32 P stored and read back.
  static constexpr bool kOwnExponentials = true;

  // P = exp2(S * scale - row_max) (scale 1: S - row_max) of `rows` rows of the
  // step's scores (s: its row r0), as the bf16 hi + lo rows accumulate reads;
  // sums: their fp32 sums. S is left as it is, or becomes P (p_in_place_),
  // or holds the fp32 lo between the passes of lo_int8.hpp (tile_lo_int8_).
  // The queued tile blocks run one 32-k step (four tdpbf16ps, two in a
  // 16-column block) at a time,
  // spread evenly between the exponentials' 32-column pieces, so that the
  // tile unit multiplies while the vector units compute exponentials.
  // Measured (AMX Xeon model 167, bf16, H8 N4096 D128, 2 threads): whole
  // blocks between pairs of rows left no overlap (66 ms against 25 ms for
  // the vector work alone plus 38 ms for the tile work alone); a
  // micro-benchmark of four tdpbf16ps against exponential-like vector work
  // ran 0.78x the time of 64-product chunks with one step per chunk, and
  // 1.1x with 8 or 16 products per chunk (docs/architecture.md).
  void exponentials(float* s, int64_t lds, int64_t r0, int64_t rows, int64_t n, float scale,
                    const float* row_max, float* sums) {
    const int64_t k = round_up(n, kBf16PairBlock);
    // Pieces of 32 columns of one row (tick's unit) and the steps left.
    const int64_t pieces = rows * (k / 32);
    int64_t steps = 0;
    if constexpr (requires { K::kAsyncProducts; }) {
      for (int i = next_; i < queued_; ++i) steps += K::bf16_block_steps(queue_[i]);
      steps -= step_;
    }
    int64_t credit = 0;  // steps owed, in units of 1 / pieces
    auto tick = [&](int64_t done) {
      if (steps == 0) return;
      credit += done * steps;
      for (; credit >= pieces; credit -= pieces) run_queued_step();
    };
    // Rows one at a time: a tick every two vectors of exponentials (amx, AMX
    // Xeon model 167, H8 N4096 D128, 2 threads, medians of 7: four rows 60.2
    // ms against two 56.4, two 63.6 against one 61.7); avx512bf16 took them
    // one at a time before the ticks too (four interleaved there is unmeasured).
    if (p_in_place_) {
      uint16_t* hi = reinterpret_cast<uint16_t*>(s);  // the scores' own rows
      K::exp2_split_rows(s, lds, rows, n, k, scale, row_max, sums, hi, hi + kInPlaceLo, 2 * lds, kInPlaceStep,
                         v_scales_, tick);
      return;
    }
    if constexpr (requires { K::kLoOnInt8; })
      if (tile_lo_int8_)
        return K::exp2_split_rows_lo_int8(s, lds, rows, n, k, scale, row_max, sums, p_hi_ + r0 * bf16_kv_pad_,
                                          bf16_kv_pad_, lo_bytes() + r0 * bf16_kv_pad_, bf16_kv_pad_,
                                          p_lo_scales_ + r0, lo_offsets_ + r0, v_scales_);
    K::exp2_split_rows(s, lds, rows, n, k, scale, row_max, sums, p_hi_ + r0 * bf16_kv_pad_,
                       p_lo_ ? p_lo_ + r0 * bf16_kv_pad_ : nullptr, bf16_kv_pad_, 32, v_scales_, tick);
  }

  // Runs the queued blocks' steps that have not run yet.
  void finish_products() {
    while (next_ < queued_) run_queued_step();
    next_ = queued_ = 0;
  }
  // Row r of P is zero (a NaN row or a row with no visible key yet).
  void clear_p_row(int64_t r) {
    if (p_in_place_) return std::memset(s_tile_ + r * kv_pad_, 0, sizeof(float) * kv_pad_), void();
    std::memset(p_hi_ + r * bf16_kv_pad_, 0, sizeof(uint16_t) * bf16_kv_pad_);
    if (tile_lo_int8_) p_lo_scales_[r] = 0.0f;  // lo's bytes then count for nothing
    else if (p_lo_) std::memset(p_lo_ + r * bf16_kv_pad_, 0, sizeof(uint16_t) * bf16_kv_pad_);
  }

  // acc (m, Dv_pad) += P V, P from exponentials() (p_in_operands) or the fp32
  // rows at p (dropout, which scales P in place, takes this route).
  void accumulate(int64_t m, int64_t n, const float* p, int64_t ldp, float* acc, RowPrefetch* prefetch,
                  bool p_in_operands, int64_t t0) {
    const int64_t dp = p_.v_head_dim_padded, k = round_up(n, kBf16PairBlock);
    if constexpr (requires { K::kAsyncProducts; }) {
      if (p_in_place_ && p_in_operands) {
        const uint16_t* hi = reinterpret_cast<const uint16_t*>(s_tile_ + t0 * kv_pad_);
        if (queue_blocks(m, dp, k, hi, hi + kInPlaceLo, 2 * kv_pad_, v_tile_, kPanelWidth * bf16_kv_pad_, acc, dp,
                         true, prefetch, kInPlaceStep))
          return;
        return K::bf16_gemm(m, dp, k, hi, hi + kInPlaceLo, 2 * kv_pad_, v_tile_, kPanelWidth * bf16_kv_pad_, acc,
                            dp, true, prefetch, kInPlaceStep);
      }
    }
    uint16_t* hi = p_hi_ + t0 * bf16_kv_pad_;
    if constexpr (requires { K::kLoOnInt8; }) {
      if (p_in_operands && tile_lo_int8_) {
        K::bf16_gemm(m, dp, k, hi, nullptr, bf16_kv_pad_, v_tile_, kPanelWidth * bf16_kv_pad_, acc, dp, true,
                     prefetch);
        return K::lo_int8_products(m, dp, k, lo_bytes() + t0 * bf16_kv_pad_, bf16_kv_pad_, p_lo_scales_ + t0,
                                   lo_offsets_ + t0, v_q_, kPanelWidth * bf16_kv_pad_, v_q_scales_, acc, dp);
      }
    }
    uint16_t* lo = p_lo_ ? p_lo_ + t0 * bf16_kv_pad_ : nullptr;
    if (!p_in_operands) K::bf16_split_rows(p, ldp, m, n, k, hi, lo, bf16_kv_pad_);
    if (queue_blocks(m, dp, k, hi, lo, bf16_kv_pad_, v_tile_, kPanelWidth * bf16_kv_pad_, acc, dp, true, prefetch))
      return;
    K::bf16_gemm(m, dp, k, hi, lo, bf16_kv_pad_, v_tile_, kPanelWidth * bf16_kv_pad_, acc, dp, true, prefetch);
  }

 private:
  static constexpr int kMaxQueued = 64;
  // P in place over S (p_in_place_): in a row of 2 kv_pad bf16 elements, the
  // 32-column piece c holds hi at 64 (c / 32), lo 32 elements after it.
  static constexpr int64_t kInPlaceLo = 32, kInPlaceStep = 64;
  // lo as bytes (tile_lo_int8_): p_lo_'s rows, bf16_kv_pad bytes apart.
  int8_t* lo_bytes() const { return reinterpret_cast<int8_t*>(p_lo_); }

  // Queues C (m, n) (+)= A B [+ A_lo B] as blocks of 32 rows by up to 32
  // columns, when the tile products run asynchronously to the vector units
  // (K::kAsyncProducts: AMX) and the product is one 32-row band; false: the
  // caller runs it now.
  bool queue_blocks(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* a_lo, int64_t lda,
                    const uint16_t* b, int64_t b_panel, float* c, int64_t ldc, bool accumulate,
                    RowPrefetch* prefetch, int64_t a_step = 32) {
    if constexpr (requires { K::kAsyncProducts; }) {
      if (m != kBlockRows || queued_ + (n + 31) / 32 > kMaxQueued) return false;
      for (int64_t j = 0; j < n; j += 32)
        queue_[queued_++] = Bf16Block{a, a_lo, lda, b + j / 16 * b_panel, b_panel, c + j, ldc, k,
                                      int(min64(32, n - j)), accumulate, a_step};
      paced_ = prefetch;  // run_queued_step() asks for its share after each block
      return true;
    }
    (void)m, (void)n, (void)k, (void)a, (void)a_lo, (void)lda, (void)b, (void)b_panel, (void)c, (void)ldc;
    (void)accumulate, (void)prefetch, (void)a_step;
    return false;
  }

  // The next step of the oldest queued block that has not finished, if any
  // (only kAsyncProducts kernels queue blocks).
  void run_queued_step() {
    if constexpr (requires { K::kAsyncProducts; }) {
      if (next_ < queued_) {
        K::bf16_block_step(queue_[next_], step_);
        if (++step_ >= K::bf16_block_steps(queue_[next_])) {
          step_ = 0;
          ++next_;
          if (paced_) paced_->issue_paced();
        }
      }
    }
  }

  const Problem& p_;
  int64_t bf16_k_, bf16_kv_pad_;
  Bf16Block queue_[kMaxQueued];
  int queued_ = 0, next_ = 0;  // queue_[next_, queued_) have not finished
  int64_t step_ = 0;            // queue_[next_]'s next step
  RowPrefetch* paced_ = nullptr;  // the next tile's lines, a share per block run
  uint16_t* q_tile_;  // (stacked rows + 16, bf16_k)
  uint16_t* k_tile_;  // kv_pad / 16 panels of (bf16_k / 2, 16, 2)
  uint16_t* v_tile_;  // Dv_pad / 16 panels of (bf16_kv_pad / 2, 16, 2)
  uint16_t* p_hi_;    // (stacked rows + 16, bf16_kv_pad)
  uint16_t* p_lo_;    // as p_hi_; null: P is hi alone (ForwardArgs::bf16_probabilities)
  float* p_lo_scales_;  // (stacked rows + 16): the lo bytes' scales (tile_lo_int8_)
  uint8_t* v_q_;        // V as int8 + 128, Dv_pad / 16 panels of (bf16_kv_pad / 4, 16, 4) (tile_lo_int8_)
  int32_t* lo_offsets_;  // (stacked rows + 16): the lo bytes' row offsets (tile_lo_int8_)
  float* v_q_scales_;   // (Dv_pad) V's column scales (tile_lo_int8_)
  float* s_tile_;     // the main loop's score tile (stacked rows + 16, kv_pad)
  int64_t kv_pad_;
  // A quantized cache: its storage dtype; with an element stride (stage_rows)
  // the staged bf16 rows (kv_pad, staged_row_), one fp32 row and the staged
  // rows' addresses (forward_scratch_layout sizes them only then).
  bool quantized_rows_ = false;
  DType kv_dtype_ = DType::bf16;
  int64_t staged_row_ = 0;
  uint16_t* staged_ = nullptr;
  float* staged_f32_ = nullptr;
  const void** staged_rows_ = nullptr;
  const float* v_scales_ = nullptr;  // scale_p_columns_by: the tile's V scales, or null
  bool p_in_place_ = false;  // the exponentials' P over S (constructor)
  bool lo_int8_ = false;       // the rung can take P V's lo on int8 products (constructor)
  bool lo_int8_item_ = false;  // and this item's P comes from the exponentials (begin_item)
  bool tile_lo_int8_ = false;  // this KV tile does (pack_v): lo as bytes, V as int8
};

template <class K, class Operands>
class ForwardMainloop {
 public:
  ForwardMainloop(const Problem& p, float* scratch)
      : p_(p), a_(p.args), layout_(forward_scratch_layout(p)), operands_(p, layout_, scratch),
        kv_dtype_(kv_storage_dtype(p.args.dtype, p.args.kv.quant)), quantized_(p.args.kv.quant != KvQuant::none),
        keep_mask_(make_dropout(p.args.dropout_p, p.args.seed)), keep_scale_(keep_mask_.keep_scale) {
    keep_mask_.keep_scale = 1.0f;  // P V sees 0 or 1; keep_scale_ multiplies the finished row
    kv_pad_ = layout_.kv_pad;
    k_scales_ = scratch + layout_.kv_scales;  // quantized_: (kv_pad) K scales, then (kv_pad) V scales
    v_scales_ = k_scales_ + kv_pad_;
    if constexpr (Operands::kOwnExponentials)
      if (quantized_) operands_.scale_p_columns_by(v_scales_);
    acc_ = scratch + layout_.acc;          // (heads * rows, Dv_pad), un-normalized O
    row_max_ = scratch + layout_.row_max;  // (heads * rows), log2 units
    row_sum_ = scratch + layout_.row_sum;  // (heads * rows)
    s_tile_ = scratch + layout_.s_tile;    // (stacked rows, BLOCK_KV_pad): scores, then P
    // (2 * BLOCK_KV_pad,) row addresses: this tile's rows while packing, then
    // the next tile's K rows and V rows for prefetch_.
    key_rows_ = reinterpret_cast<const void**>(scratch + layout_.key_rows);
    // Tile-product policy, fixed for the call by the stacked row count: with
    // a few rows (decode) the products read K/V rows in place through row
    // tables, and the unused K tile holds those tables (this tile's and
    // the next one's, 4 x BLOCK_KV_pad pointers, within the K tile).
    if constexpr (kHasFewRows) {
      static_assert(K::kFewRowsMax == kFewRowsMax, "plan_forward plans decode items for kFewRowsMax rows");
      direct_ = p.heads_per_item * p.block_q <= K::kFewRowsMax;
    }
    // Few-rows scores on bf16 dot products (K::kFewRowsDotScores): bf16
    // queries against a bf16 or fp8 e4m3 cache read with unit stride; Q
    // stays unscaled (bf16 values, exact products) and the kernel scales the
    // sums (an fp8 cache's per-key scales follow, scale_columns). Llama-3-8B
    // decode (bf16, 8192 tokens, 1 thread, AMD EPYC Zen 5, paired): 0.95 of
    // the time of the FMA scores; P V stays on FMAs (P keeps fp32 precision)
    // unless the caller rounds P to bf16 (next).
    if constexpr (requires { K::kFewRowsDotScores; })
      dot_scores_ = direct_ && p.args.dtype == DType::bf16 && p.args.k.stride[3] == 1 &&
                    K::few_rows_dot_scores_take(kv_dtype_);
    // The other few-rows scores (FMAs, integer pieces) take Q unscaled where
    // the softmax can take the scale (deferred_score_scale), as the packed
    // products do.
    few_rows_deferred_ = direct_ && !dot_scores_ ? deferred_score_scale(p) : 1.0f;
    // P V likewise on bf16 dot products where the caller asks for P in bf16
    // (bf16_probabilities) and V is a bf16, fp8 e4m3 or int8 cache read with
    // unit stride (a quantized cache's scales are on P first, scale_columns);
    // on the avx512 rung with VNNI, an int8 V on vpdpwssd with P in 16-bit
    // integers (few_rows_vnni.hpp).
    if constexpr (requires { K::kFewRowsDotProbabilities; })
      dot_probabilities_ = direct_ && p.args.bf16_probabilities && p.args.dtype == DType::bf16 &&
                           p.args.v.stride[3] == 1 && K::few_rows_dot_probabilities_take(kv_dtype_);
    // Which product asks for the next step's K rows: the scores (with the V
    // rows they ask for, scores() below), or P V where its kernel does (the
    // VNNI P V: scores on integer products finish early, and memory then
    // idled through P V; few_rows_vnni.cpp has the measurement).
    if constexpr (requires { K::kFewRowsDotProbabilities; })
      k_ahead_in_pv_ = dot_probabilities_ && K::few_rows_dot_accumulate_prefetches_k(kv_dtype_);
    k_row_bytes_ = p.args.shape.head_dim * int64_t(dtype_size(kv_dtype_));
    prefetch_to_l2_ = decode_prefetch_to_l2(dot_scores_);
    walk_burst_to_l2_ = direct_ && decode_walk_burst_to_l2(prefetch_to_l2_);
    // P V asks for the next step's V rows (the scores then ask for none)
    // where decode_pv_asks_next_v chose so and its kernel can (the FMA P V;
    // the pair products where few_rows_dot_accumulate_asks_next_v), except on
    // walking items that burst the next step to L2 already
    // (core/row_prefetch.hpp).
    bool pv_can_ask = false;
    if constexpr (requires { K::kFewRowsAccumulateAsksNextV; }) pv_can_ask = !dot_probabilities_;
    if constexpr (requires { K::few_rows_dot_accumulate_asks_next_v(kv_dtype_); })
      if (dot_probabilities_) pv_can_ask = K::few_rows_dot_accumulate_asks_next_v(kv_dtype_);
    pv_asks_next_v_ = direct_ && pv_can_ask && p.args.v.stride[3] == 1 &&
                      !(walk_burst_to_l2_ && p.kv_heads_per_item > 1) && decode_pv_asks_next_v();
    // Few-rows scores of an int8 cache on integer products (K::kFewRowsInt8Scores:
    // AVX512-VNNI for bf16 queries with bf16_probabilities, few_rows_vnni.hpp):
    // Q rounded once per item to int16 rows, keys read in place with unit
    // element stride.
    if constexpr (requires { K::kFewRowsInt8Scores; })
      int8_scores_ = direct_ && kv_dtype_ == DType::i8 && p.args.k.stride[3] == 1 &&
                     K::few_rows_int8_usable(p.args.dtype, p.args.bf16_probabilities, p.args.shape.head_dim);
    q16_ = reinterpret_cast<int16_t*>(scratch + layout_.q16);
    q16_steps_ = scratch + layout_.q16_steps;
    // The few-rows products' fp32 Q (at most kFewRowsMax rows of D_pad) sits
    // in the Q tile: its bf16 form holds 16 slack rows of >= D_pad elements.
    few_rows_q_ = scratch + layout_.q_tile;
    k_rows_ = reinterpret_cast<const void**>(scratch + layout_.k_tile);
    v_rows_ = k_rows_ + kv_pad_;
    k_ahead_ = v_rows_ + kv_pad_;
    v_ahead_ = k_ahead_ + kv_pad_;
  }

  void run(const WorkItem& w) {
    const Sequence seq = sequence_of(p_, w.batch);
    rows_ = w.q_end - w.q_begin;
    const int64_t dvp = p_.v_head_dim_padded;
    const int64_t stacked = w.head_count * rows_;
    // Dropout scales P in place, and the few-rows products read it there
    // (with a quantized cache's V scales, scale_columns). The operands' own
    // exponentials take the V scales themselves (scale_p_columns_by).
    p_in_operands_ = Operands::kOwnExponentials && !direct_ && a_.dropout_p == 0.0f;
    if (!direct_) operands_.begin_item(p_in_operands_, w.head_count / w.kv_head_count * rows_);
    load_q_tiles(seq, w);
    // Rows that are not all finite take the fp32 products (NaN and infinity
    // as the reference has them).
    item_int8_scores_ = false;
    if constexpr (requires { K::kFewRowsInt8Scores; }) {
      if (int8_scores_) {
        item_int8_scores_ = K::few_rows_int8_split(w.head_count * rows_, a_.shape.head_dim, few_rows_q_,
                                                   p_.head_dim_padded, q16_, q16_steps_);
      }
    }
    std::memset(acc_, 0, sizeof(float) * stacked * dvp);
    for (int64_t s = 0; s < stacked; ++s) {
      row_max_[s] = -std::numeric_limits<float>::infinity();
      row_sum_[s] = 0.0f;
    }
    // Query heads of each KV head the item walks (its whole group when it
    // walks several).
    const int64_t heads_per_kv = w.head_count / w.kv_head_count;
    // Heads per product: as many as fit the S tile (BLOCK_Q rows). Prefill
    // tiles (rows = BLOCK_Q) go one head at a time; decode stacks the group.
    const int64_t heads_per_gemm = max64(1, score_tile_rows(p_) / rows_);

    KeyRange keys = visible_keys(p_.band, seq, w.q_begin, w.q_end);
    keys.first = max64(keys.first, w.key_begin);
    keys.last = min64(keys.last, w.key_end);
    const int64_t first_tile = keys.first / p_.block_kv * p_.block_kv;
    bool ahead_filled = false;  // direct_: this step's tables were the last step's ahead tables
    // Steps (key tile, KV head), tile-major: a paged item reads every KV
    // head's rows of a page before the next page.
    for (int64_t j0 = first_tile; j0 < keys.last; j0 += p_.block_kv) {
      const int64_t j_begin = max64(j0, keys.first);
      const int64_t j1 = min64(j0 + p_.block_kv, keys.last);
      const int64_t n = j1 - j_begin;
      const int64_t n_after = j1 < keys.last ? min64(j1 + p_.block_kv, keys.last) - j1 : 0;
      // A tile a boolean mask hides from every row of the item (a causal or
      // padding mask given as a tensor) is skipped, and one it keeps whole
      // takes no mask step for it; decode steps (direct_) read ahead tile by
      // tile and keep every tile.
      const MaskTile mask_tile =
          direct_ ? MaskTile::partial
                  : boolean_mask_tile(p_, w.batch, w.head_begin, w.head_begin + w.head_count, w.q_begin, w.q_end,
                                      j_begin, j1);
      if (mask_tile == MaskTile::hidden) continue;
      const bool mask_tensor = mask_tile == MaskTile::partial;
      const bool band_partial = !tile_fully_visible(p_.band, seq, w.q_begin, w.q_end, j_begin, j1);
      // A band-partial tile (causal diagonal, window edge) of one head's rows:
      // only the rows that see one of its keys take part. The others would
      // add exact zeros; with 256-row tiles at N = 4096 causal they are 3% of
      // the pairs computed.
      const KeyRange tile_rows = visible_rows(p_.band, seq, w.q_begin, w.q_end, j_begin, j1);
      const bool row_subset = band_partial && heads_per_gemm == 1;
      for (int64_t g = 0; g < w.kv_head_count; ++g) {
        const int64_t kv_head = w.kv_head + g;
        // The step after this one: the next KV head on this tile, else the
        // first KV head on the next tile.
        const bool last_head = g + 1 == w.kv_head_count;
        const int64_t next_kv_head = last_head ? w.kv_head : kv_head + 1;
        const int64_t next_begin = last_head ? j1 : j_begin;
        const int64_t next_n = last_head ? n_after : n;
        if (direct_) {
          if (ahead_filled) {
            const void** k = k_rows_;
            k_rows_ = k_ahead_, k_ahead_ = k;
            const void** v = v_rows_;
            v_rows_ = v_ahead_, v_ahead_ = v;
          } else {
            fill_key_rows(a_.k, seq, w.batch, kv_head, j_begin, n, k_rows_);
            fill_key_rows(a_.v, seq, w.batch, kv_head, j_begin, n, v_rows_);
          }
          // The next step's rows, which the products prefetch a few lines
          // per key while they compute this step (scores() says which).
          ahead_ = next_n;
          ahead_filled = ahead_ > 0;
          if (ahead_filled) {
            fill_key_rows(a_.k, seq, w.batch, next_kv_head, next_begin, ahead_, k_ahead_);
            fill_key_rows(a_.v, seq, w.batch, next_kv_head, next_begin, ahead_, v_ahead_);
            if (quantized_) prefetch_key_scales(seq, w.batch, next_kv_head, next_begin, ahead_);
            // Walking small pages: the next step's rows toward L2 now, a
            // step ahead of the products' own prefetches (decode_walk_burst_to_l2).
            if (walk_burst_to_l2_ && w.kv_head_count > 1) {
              prefetch_rows_to<false>(RowsToPrefetch{k_ahead_, ahead_}, 0, ahead_, k_row_bytes_);
              prefetch_rows_to<false>(RowsToPrefetch{nullptr, 0, v_ahead_, ahead_}, 0, ahead_,
                                      p_.v_head_dim * int64_t(dtype_size(kv_dtype_)));
            }
          }
        }
        // The scales first: packing V looks at them (Bf16Operands::pack_v).
        if (quantized_) {
          fill_key_scales(a_.kv.k_scale, a_.kv.k_scale_stride, seq, w.batch, kv_head, j_begin, n, k_scales_);
          fill_key_scales(a_.kv.v_scale, a_.kv.v_scale_stride, seq, w.batch, kv_head, j_begin, n, v_scales_);
        }
        if (!direct_) load_kv_tile(seq, w.batch, kv_head, j_begin, n);
        prefetch_.reset(nullptr, 0, 0);
        if (next_n > 0 && !direct_) queue_next_tile(seq, w.batch, next_kv_head, next_begin, next_n);
        // Stacked rows of the product of heads [g0, g0 + heads_per_gemm).
        const auto group_rows = [&](int64_t g0) {
          return row_subset ? tile_rows.last - tile_rows.first : min64(heads_per_gemm, heads_per_kv - g0) * rows_;
        };
        // Stacked row where the rows of the product of heads [g0, g0 +
        // heads_per_gemm) start.
        const auto group_start = [&](int64_t g0) {
          return (g * heads_per_kv + g0) * rows_ + (row_subset ? tile_rows.first - w.q_begin : 0);
        };
        // The step's rows go in bands of the operands' product rows (few-rows
        // products: one band).
        const auto band_rows_of = [&](int64_t m) { return direct_ ? m : operands_.product_rows(m); };
        // Keys of this tile that the band of stacked rows [sb, sb + mb) of a
        // group of m rows sees: in a band-partial tile (the causal diagonal)
        // a band of one head's rows stops after its last visible key, the
        // keys after it being masked for every row of the band; a 256x256
        // diagonal tile in 32-row bands computes 56% of its pairs. One band
        // (mb = m: the fp32 operands, whose V panels are strided by the
        // tile's n) and bands over two heads keep the tile's keys.
        const auto band_keys = [&](int64_t sb, int64_t mb, int64_t m) {
          if (!band_partial || direct_ || mb >= m || sb / rows_ != (sb + mb - 1) / rows_) return n;
          const KeyRange k = visible_keys(p_.band, seq, query_of(w, sb), query_of(w, sb + mb - 1) + 1);
          return max64(1, min64(n, k.last - j_begin));
        };
        if constexpr (requires { operands_.queued_blocks(int64_t(), int64_t()); }) {
          // Queued tile blocks (AMX) ask for the next tile's lines in equal
          // shares, one per block run.
          int64_t blocks = 0;
          for (int64_t g0 = 0; g0 < heads_per_kv; g0 += heads_per_gemm) {
            const int64_t m = group_rows(g0), s0 = group_start(g0), band_rows = band_rows_of(m);
            for (int64_t b0 = 0; b0 < m; b0 += band_rows) {
              const int64_t mb = min64(band_rows, m - b0);
              blocks += operands_.queued_blocks(mb, round_up(band_keys(s0 + b0, mb, m), kPanelWidth));
            }
          }
          prefetch_.pace(blocks);
        }
        for (int64_t g0 = 0; g0 < heads_per_kv; g0 += heads_per_gemm) {
          const int64_t s0 = group_start(g0), m = group_rows(g0);
          if (m == 0) continue;
          // Band b's scores are queued before band b - 1's softmax, and its
          // P V after it, each band in rows of the score and P tiles that the
          // band two before has finished with (rows_of_band, below):
          // tile products that run asynchronously (AMX) then overlap the
          // softmax of the band between them; others run where they are called.
          const int64_t band_rows = band_rows_of(m);
          const auto keys_of_band = [&](int64_t b0) { return band_keys(s0 + b0, min64(band_rows, m - b0), m); };
          // The score (and P) rows of band b: two sets of band_rows rows taken
          // in turn. Band b + 1's scores reuse band b - 1's rows, which that
          // band's P V (queued before them, and run in queue order) has read,
          // and find them in L1 where a set of rows per band found them in
          // L2 (the tile stores wait for their lines; docs/architecture.md).
          // Measured (AMX Xeon model 167, bf16, 2 threads, the builds before
          // and after alternating, 5 rounds, a loaded host): H8 N4096 D128
          // 0.92-0.99 of the time (median 0.98), causal 0.89-0.98 (0.96),
          // H16 N4096 D64 0.89-1.0 (0.98).
          const auto rows_of_band = [&](int64_t b0) { return b0 / band_rows % 2 * band_rows; };
          int64_t nb = keys_of_band(0);
          scores(s0, band_rows, nb, round_up(nb, kPanelWidth), 0);
          operands_.finish_products();
          for (int64_t b0 = 0; b0 < m; b0 += band_rows) {
            const int64_t sb = s0 + b0, mb = min64(band_rows, m - b0), b1 = b0 + band_rows;
            const int64_t t0 = rows_of_band(b0);
            // A quantized cache's K scales, on scores that have finished
            // (queued ones too).
            if (quantized_) scale_columns(mb, nb, k_scales_, t0);
            if (needs_mask_step(p_, band_partial, mask_tensor))
              apply_mask(seq, w, sb, mb, j_begin, nb, band_partial, t0, mask_tensor);
            const int64_t nb_next = b1 < m ? keys_of_band(b1) : 0;
            if (b1 < m)
              scores(s0 + b1, min64(band_rows, m - b1), nb_next, round_up(nb_next, kPanelWidth), rows_of_band(b1));
            online_softmax(w, sb, mb, nb, j_begin, t0);
            operands_.finish_products();  // the next band's scores, the last band's P V
            accumulate(sb, mb, nb, t0);
            nb = nb_next;
          }
          operands_.finish_products();
        }
        prefetch_.finish();  // lines the products had no blocks left for
      }
    }
    if (!direct_) operands_.end_item();
    epilogue(seq, w);
  }

 private:
  static constexpr bool kHasFewRows = requires { K::kFewRowsMax; };

  // S (stacked rows [s0, s0 + m), keys of this tile) = Q K^T.
  // t0: the step's first row in the score tile (and the operands' P rows).
  void scores(int64_t s0, int64_t m, int64_t n, int64_t n_pad, int64_t t0) {
    (void)n_pad;
    if (direct_) {  // only where K has the few-rows products (kHasFewRows)
      if constexpr (kHasFewRows) {
        // Prefetched while the scores run: the next step's K rows (unless
        // k_ahead_in_pv_: then P V asks for them, accumulate()), and V rows
        // of this step when the item reads one KV head's long runs (a
        // contiguous cache, or pages of >= 8 KiB per head), of the next step
        // when it walks the KV heads of small pages. With one head's runs the
        // hardware prefetcher streams V toward L2 by itself, and asking for
        // this step's V (mostly L2 hits) instead of the next step's (memory)
        // leaves the core's miss buffers to K: Llama-3-8B decode, bf16, 8192
        // tokens, paired medians of 40 calls with the caches evicted, 6 rounds:
        // contiguous 0.92-0.97 of the time at 2 threads, 0.96-0.97 at 1
        // (pages of 64 and 256: 0.96-1.01); walking pages of 16 it lost
        // (1.01-1.03), their 4 KiB runs give the hardware nothing to stream.
        // Where P V asks for the next step's V itself (pv_asks_next_v_) the
        // scores ask for K alone.
        const bool this_steps_v = p_.kv_heads_per_item == 1;
        few_rows_scores(s0, m, n, t0,
                        RowsToPrefetch{k_ahead_, k_ahead_in_pv_ ? 0 : ahead_, this_steps_v ? v_rows_ : v_ahead_,
                                       pv_asks_next_v_ ? 0 : this_steps_v ? n : ahead_, prefetch_to_l2_});
      }
    } else {
      operands_.scores(s0, m, n, s_tile_ + t0 * kv_pad_, kv_pad_, &prefetch_);
    }
  }

  // The few-rows scores (direct_), unscaled by a quantized cache's K scales:
  // on integer products (VNNI), on bf16 dot products, or on FMAs.
  void few_rows_scores(int64_t s0, int64_t m, int64_t n, int64_t t0, const RowsToPrefetch& ahead) {
    const int64_t dp = p_.head_dim_padded, d = a_.shape.head_dim;
    if constexpr (requires { K::kFewRowsInt8Scores; }) {
      if (item_int8_scores_) {
        return K::few_rows_int8_scores(m, n, d, q16_ + s0 * K::few_rows_q16_stride(d), q16_steps_ + s0, k_rows_,
                                       s_tile_ + t0 * kv_pad_, kv_pad_, ahead);
      }
    }
    if constexpr (requires { K::kFewRowsDotScores; }) {
      if (dot_scores_)
        return K::few_rows_dot_scores(m, n, d, few_rows_q_ + s0 * dp, dp, k_rows_, kv_dtype_, p_.score_scale,
                                      s_tile_ + t0 * kv_pad_, kv_pad_, ahead);
    }
    K::few_rows_scores(m, n, d, few_rows_q_ + s0 * dp, dp, k_rows_, kv_dtype_, a_.k.stride[3],
                       s_tile_ + t0 * kv_pad_, kv_pad_, ahead);
  }

  // Quantized K/V: s_tile rows [t0, t0 + m), column c *= scales[c] (the K
  // scales on a band's finished scores, the V scales on P after the softmax
  // has summed it, where P is in the score tile: few-rows products, dropout).
  void scale_columns(int64_t m, int64_t n, const float* scales, int64_t t0) {
    for (int64_t t = 0; t < m; ++t) {
      float* row = s_tile_ + (t0 + t) * kv_pad_;
      for (int64_t c = 0; c < n; ++c) row[c] *= scales[c];
    }
  }

  // The lines of the K and V scales of keys [j0, j0 + n) (one line per page
  // run or per 16 keys), asked for a step ahead like the rows: a paged int8
  // cache keeps each (page, head)'s scales in a line of their own, which
  // the hardware prefetcher does not follow from page to page, and
  // fill_key_scales would wait for each of them.
  void prefetch_key_scales(const Sequence& seq, int64_t batch, int64_t kv_head, int64_t j0, int64_t n) const {
    const std::array<int64_t, 3>* strides[2] = {&a_.kv.k_scale_stride, &a_.kv.v_scale_stride};
    const float* bases[2] = {a_.kv.k_scale, a_.kv.v_scale};
    for (int i = 0; i < 2; ++i) {
      const std::array<int64_t, 3>& stride = *strides[i];
      if (!a_.kv.block_table) {
        const float* first = bases[i] + seq.k_batch * stride[0] + kv_head * stride[1] + (seq.k_row0 + j0) * stride[2];
        for (int64_t c = 0; c < n; c += 16) prefetch_line<true>(first + c * stride[2]);
        continue;
      }
      const int32_t* table = a_.kv.block_table + batch * a_.kv.block_table_stride;
      const int64_t page_size = a_.kv.page_size;
      for (int64_t j = j0; j < j0 + n; j = (j / page_size + 1) * page_size)
        prefetch_line<true>(bases[i] + table[j / page_size] * stride[0] + kv_head * stride[1] +
                            (j % page_size) * stride[2]);
    }
  }

  // scales[c] = the scale of key j0 + c of `batch`, `kv_head` (KvSource):
  // one table lookup per page, as fill_key_rows.
  void fill_key_scales(const float* base, const std::array<int64_t, 3>& stride, const Sequence& seq,
                       int64_t batch, int64_t kv_head, int64_t j0, int64_t n, float* scales) const {
    if (!a_.kv.block_table) {
      const float* first = base + seq.k_batch * stride[0] + kv_head * stride[1] + (seq.k_row0 + j0) * stride[2];
      for (int64_t c = 0; c < n; ++c) scales[c] = first[c * stride[2]];
      return;
    }
    const int32_t* table = a_.kv.block_table + batch * a_.kv.block_table_stride;
    const int64_t page_size = a_.kv.page_size;
    int64_t page_index = j0 / page_size, in_page = j0 % page_size;
    for (int64_t c = 0; c < n; ++page_index, in_page = 0) {
      const float* page = base + table[page_index] * stride[0] + kv_head * stride[1];
      const int64_t take = min64(page_size - in_page, n - c);
      for (int64_t t = 0; t < take; ++t, ++c) scales[c] = page[(in_page + t) * stride[2]];
    }
  }

  // acc (stacked rows [s0, s0 + m)) += P V.
  void accumulate(int64_t s0, int64_t m, int64_t n, int64_t t0) {
    const int64_t dp = p_.v_head_dim_padded, d = p_.v_head_dim;
    if (quantized_ && !p_in_operands_) scale_columns(m, n, v_scales_, t0);
    if constexpr (kHasFewRows) {
      if (direct_) {
        if constexpr (requires { K::kFewRowsDotProbabilities; })
          if (dot_probabilities_)
            return K::few_rows_dot_accumulate(m, n, d, s_tile_ + t0 * kv_pad_, kv_pad_, v_rows_, kv_dtype_,
                                              acc_ + s0 * dp, dp,
                                              RowsToPrefetch{k_ahead_, k_ahead_in_pv_ ? ahead_ : 0,
                                                             pv_asks_next_v_ ? v_ahead_ : nullptr,
                                                             pv_asks_next_v_ ? ahead_ : 0, prefetch_to_l2_,
                                                             k_row_bytes_});
        if constexpr (requires { K::kFewRowsAccumulateAsksNextV; })
          if (pv_asks_next_v_)
            return K::few_rows_accumulate(m, n, d, s_tile_ + t0 * kv_pad_, kv_pad_, v_rows_, kv_dtype_,
                                          a_.v.stride[3], acc_ + s0 * dp, dp,
                                          RowsToPrefetch{nullptr, 0, v_ahead_, ahead_, true});
        K::few_rows_accumulate(m, n, d, s_tile_ + t0 * kv_pad_, kv_pad_, v_rows_, kv_dtype_, a_.v.stride[3],
                               acc_ + s0 * dp, dp);
        return;
      }
    }
    (void)d;
    operands_.accumulate(m, n, s_tile_ + t0 * kv_pad_, kv_pad_, acc_ + s0 * dp, &prefetch_, p_in_operands_, t0);
  }

  int64_t head_of(const WorkItem& w, int64_t s) const { return w.head_begin + s / rows_; }
  int64_t query_of(const WorkItem& w, int64_t s) const { return w.q_begin + s % rows_; }

  // The few-rows products take Q as packed fp32 rows: unscaled for the bf16
  // dot products (their kernel scales the sums) and where the softmax takes
  // the scale (few_rows_deferred_), else pre-scaled.
  void load_q_tiles(const Sequence& seq, const WorkItem& w) {
    const int64_t dp = p_.head_dim_padded, d = a_.shape.head_dim;
    const int64_t esize = int64_t(dtype_size(a_.dtype));
    for (int64_t s = 0; s < w.head_count * rows_; ++s) {
      const int64_t row = seq.q_row0 + query_of(w, s);
      const char* src = static_cast<const char*>(a_.q.data) +
                        (seq.q_batch * a_.q.stride[0] + head_of(w, s) * a_.q.stride[1] +
                         row * a_.q.stride[2]) * esize;
      if (direct_)
        K::load_row(src, a_.dtype, d, a_.q.stride[3],
                    dot_scores_ ? 1.0f : query_scale(p_), few_rows_q_ + s * dp);
      else operands_.load_q_row(s, src, a_.q.stride[3]);
    }
  }

  // rows[c] = address of key row j0 + c (c < n) of `view` for sequence
  // `batch` and `kv_head`. A paged cache is walked page by page: one table
  // lookup per page, not a division per row.
  void fill_key_rows(const InputView& view, const Sequence& seq, int64_t batch, int64_t kv_head,
                     int64_t j0, int64_t n, const void** rows) const {
    const int64_t esize = int64_t(dtype_size(kv_dtype_));
    const char* base = static_cast<const char*>(view.data);
    // The row step is formed only where a second row exists: a dimension of
    // size 1 may have any stride (validate.cpp), and stride * esize can then
    // overflow (fuzz_forward: a one-key cache with a row stride of -5e18).
    if (!a_.kv.block_table) {
      const char* first = base + (seq.k_batch * view.stride[0] + kv_head * view.stride[1] +
                                  (seq.k_row0 + j0) * view.stride[2]) * esize;
      const int64_t row_step = n > 1 ? view.stride[2] * esize : 0;
      for (int64_t c = 0; c < n; ++c) rows[c] = first + c * row_step;
      return;
    }
    const int32_t* table = a_.kv.block_table + batch * a_.kv.block_table_stride;
    const int64_t page_size = a_.kv.page_size;
    const int64_t row_step = page_size > 1 ? view.stride[2] * esize : 0;
    int64_t page_index = j0 / page_size, in_page = j0 % page_size;
    for (int64_t c = 0; c < n; ++page_index, in_page = 0) {
      const char* page = base + (table[page_index] * view.stride[0] + kv_head * view.stride[1]) * esize;
      const int64_t take = min64(page_size - in_page, n - c);
      for (int64_t t = 0; t < take; ++t, ++c) rows[c] = page + (in_page + t) * row_step;
    }
  }

  // The K and V tiles, packed once as the operands' B layouts and shared by
  // every query head of the KV group. Pages are gathered here.
  void load_kv_tile(const Sequence& seq, int64_t batch, int64_t kv_head, int64_t j0, int64_t n) {
    fill_key_rows(a_.k, seq, batch, kv_head, j0, n, key_rows_);
    operands_.pack_k(key_rows_, n, a_.k.stride[3]);
    fill_key_rows(a_.v, seq, batch, kv_head, j0, n, key_rows_);
    operands_.pack_v(key_rows_, n, a_.v.stride[3]);
  }

  // Queues the next K/V tile's rows (toward L2) for the tile products of this
  // tile to ask for a few lines at a time (row_prefetch.hpp): the software
  // half of double buffering, which matters most for paged and strided
  // sources that the hardware prefetcher cannot follow. Element-strided rows
  // (stride[3] != 1) are not prefetched.
  void queue_next_tile(const Sequence& seq, int64_t batch, int64_t kv_head, int64_t j0, int64_t n) {
    if (a_.k.stride[3] != 1 || a_.v.stride[3] != 1) return;
    fill_key_rows(a_.k, seq, batch, kv_head, j0, n, key_rows_);
    fill_key_rows(a_.v, seq, batch, kv_head, j0, n, key_rows_ + n);
    prefetch_.reset(key_rows_, 2 * n, max64(a_.shape.head_dim, p_.v_head_dim) * int64_t(dtype_size(kv_dtype_)));
  }

  // Masks stacked rows [s0, s0 + m) of the score tile for keys [j0, j0 + n).
  void apply_mask(const Sequence& seq, const WorkItem& w, int64_t s0, int64_t m, int64_t j0,
                  int64_t n, bool band_partial, int64_t t0, bool mask_tensor) {
    for (int64_t t = 0; t < m; ++t)
      mask_score_row(s_tile_ + (t0 + t) * kv_pad_, n, p_, seq, w.batch, head_of(w, s0 + t),
                     query_of(w, s0 + t), j0, band_partial, nullptr, mask_tensor);
  }

  // Online softmax over stacked rows [s0, s0 + m) of one score tile: S becomes
  // P = exp2(S - row_max); the accumulator and the row sum are rescaled only
  // when a tile's max passes the row's by more than kRescaleSlack. Rows go in chunks, one pass at a time over the
  // chunk (maxima, scalar updates, exponentials), so the kernels can
  // interleave rows.
  void online_softmax(const WorkItem& w, int64_t s0, int64_t m, int64_t n, int64_t j0, int64_t t0) {
    constexpr float kInf = std::numeric_limits<float>::infinity();
    constexpr float kRescaleSlack = 8.0f;  // log2 units
    constexpr int64_t kChunk = 32;
    const int64_t dp = p_.v_head_dim_padded;  // accumulator rows
    float tile_max[kChunk], tile_sum[kChunk];
    for (int64_t c0 = 0; c0 < m; c0 += kChunk) {
      const int64_t rows = min64(kChunk, m - c0);
      float* s_rows = s_tile_ + (t0 + c0) * kv_pad_;
      float* row_max = row_max_ + s0 + c0;
      float* row_sum = row_sum_ + s0 + c0;
      K::row_max_rows(s_rows, kv_pad_, rows, n, tile_max);
      float deferred = 1.0f;  // a scale the scores still lack (Operands::deferred_scale)
      if constexpr (Operands::kDeferredScale) {
        deferred = direct_ ? few_rows_deferred_ : operands_.deferred_scale();
        if (deferred != 1.0f) {
          // The exponentials fold the scale in (exp2(fma(s, scale, -max)))
          // unless a row's max reaches kScoreFoldLimit (problem.hpp): such
          // chunks take their scores scaled first (clamped to +-FLT_MAX, as
          // additive masks are: a score beyond it ties with the row's other
          // such scores) and P = exp2(s - max).
          bool fold = true;
          for (int64_t t = 0; t < rows; ++t) {
            tile_max[t] *= deferred;
            if (tile_max[t] != -kInf && std::fabs(tile_max[t]) >= kScoreFoldLimit) fold = false;
          }
          if (!fold) {
            for (int64_t t = 0; t < rows; ++t) {
              float* row = s_rows + t * kv_pad_;
              for (int64_t c = 0; c < n; ++c) row[c] = scale_keeping_finite(row[c], deferred);
            }
            K::row_max_rows(s_rows, kv_pad_, rows, n, tile_max);
            deferred = 1.0f;
          }
        }
      }
      for (int64_t t = 0; t < rows; ++t) {
        if (tile_max[t] != tile_max[t]) {
          // A NaN score (NaN in this query row or in a visible key): the row's
          // result is NaN, as in the reference; later tiles keep it so.
          row_max[t] = row_sum[t] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        // The row's max moves only when a tile's max exceeds it by more than
        // kRescaleSlack: P then stays within about 2^kRescaleSlack, and the row's
        // accumulator and sum are rescaled once instead of at every rise (in
        // random rows ~3 of a 512-key row's 8 tiles raised the max). With the
        // LSE skipped where unread (epilogue), one thread, 12 heads, D = 64,
        // 128 keys: 0.95 of the time (median of 10 paired runs, Intel Xeon model 207).
        if (tile_max[t] > row_max[t] + kRescaleSlack) {
          if (row_max[t] != -kInf) {
            const float alpha = std::exp2(row_max[t] - tile_max[t]);
            K::scale(acc_ + (s0 + c0 + t) * dp, dp, alpha);
            row_sum[t] *= alpha;
          }
          row_max[t] = tile_max[t];
        }
      }
      if (p_in_operands_) {
        if constexpr (Operands::kOwnExponentials)
          operands_.exponentials(s_rows, kv_pad_, t0 + c0, rows, n, deferred, row_max, tile_sum);
      } else if constexpr (Operands::kDeferredScale) {
        if (deferred != 1.0f) K::exp2_sum_rows_scaled(s_rows, kv_pad_, rows, n, deferred, row_max, tile_sum);
        else K::exp2_sum_rows(s_rows, kv_pad_, rows, n, row_max, tile_sum);
      } else {
        K::exp2_sum_rows(s_rows, kv_pad_, rows, n, row_max, tile_sum);
      }
      for (int64_t t = 0; t < rows; ++t) {
        float* s = s_rows + t * kv_pad_;
        // NaN rows, and rows that have seen no visible key yet (max -inf):
        // P = 0 (their exponentials above are discarded).
        if (row_max[t] != row_max[t] || row_max[t] == -kInf) {
          std::memset(s, 0, sizeof(float) * n);
          if constexpr (Operands::kOwnExponentials)
            if (p_in_operands_) operands_.clear_p_row(t0 + c0 + t);
          continue;
        }
        row_sum[t] += tile_sum[t];
        // Dropout (FlashAttention-2): the normalizer above sums the kept and
        // the dropped P; only P V sees the mask, here as 0 or 1 (the keep
        // factor 1 / (1 - p) multiplies the finished row: epilogue). One
        // check per row, none per element without dropout.
        if (keep_mask_.active)
          apply_dropout_row(keep_mask_, w.batch, head_of(w, s0 + c0 + t), query_of(w, s0 + c0 + t), j0, s, n);
      }
    }
  }

  void epilogue(const Sequence& seq, const WorkItem& w) {
    const int64_t dp = p_.v_head_dim_padded, d = p_.v_head_dim;
    const DType o_dtype = output_dtype(a_);
    const int64_t esize = int64_t(dtype_size(o_dtype));
    for (int64_t s = 0; s < w.head_count * rows_; ++s) {
      const int64_t head = head_of(w, s), i = query_of(w, s);
      float max = row_max_[s], sum = row_sum_[s];
      float* acc = acc_ + s * dp;
      if (sum == 0.0f) std::memset(acc, 0, sizeof(float) * d);  // no visible key
      // The sink joins the row here, once: a key split leaves it to the merge
      // (merge_splits), which adds it once per row.
      float alpha = 1.0f;
      if (a_.sinks && p_.kv_splits == 1) alpha = fold_sink(a_.sinks[head] * kLog2e, max, sum);
      // No visible key and no sink: O = 0, LSE = -inf. (A NaN sum is not 0: NaN flows out.)
      const bool empty = sum == 0.0f;
      // The LSE only where someone reads it (a key split's merge, ForwardArgs::lse):
      // its log2 was ~2% of a 128-key call without them (D = 64).
      auto lse = [&] { return empty ? -std::numeric_limits<float>::infinity() : (max + std::log2(sum)) * kLn2; };
      // With dropout the keep factor Z = 1 / (1 - p) too, once per row rather
      // than on every P: a row that sees one key then gets O = Z v as naive
      // attention forms it, where Z P through the bf16 rungs' hi + lo split
      // (2^-16) gave 10 v for Z = 9.9999976 (p = 0.9), and the backward's D,
      // hence dQ and dK (exactly 0 there), took the difference (tests/training
      // DropoutForward.OneKeyRowsAtHighProbabilityKeepTheGradientsExact).
      const float o_scale = empty ? 0.0f : alpha / sum * keep_scale_;
      if (p_.kv_splits > 1) {
        // A key split: its normalized fp32 O, its row max and log2 sum (its
        // LSE in two pieces: Problem::partial_max), merged after all items.
        const int64_t slot = partial_slot(p_, w.split, w.batch, head, i);
        K::store_row(acc, o_scale, d, DType::f32, p_.partial_o + slot * dp, 1);
        p_.partial_max[slot] = empty ? -std::numeric_limits<float>::infinity() : max;
        p_.partial_log2_sum[slot] = empty ? 0.0f : std::log2(sum);
        continue;
      }
      const int64_t row = seq.q_row0 + i;
      char* o_row = static_cast<char*>(a_.o.data) +
                    (seq.q_batch * a_.o.stride[0] + head * a_.o.stride[1] + row * a_.o.stride[2]) * esize;
      K::store_row(acc, o_scale, d, o_dtype, o_row, a_.o.stride[3]);
      if (a_.lse)
        a_.lse[seq.q_batch * a_.lse_stride[0] + head * a_.lse_stride[1] + row * a_.lse_stride[2]] = lse();
    }
  }

  const Problem& p_;
  const ForwardArgs& a_;
  const ForwardScratchLayout layout_;
  Operands operands_;
  const DType kv_dtype_;  // K/V storage: a_.dtype, or int8 / fp8 e4m3 for a quantized cache
  const bool quantized_;
  DropoutSpec keep_mask_;  // the call's dropout, keep factor 1 (active: dropout_p > 0)
  const float keep_scale_;  // 1 / (1 - p) with dropout, else 1
  float* k_scales_ = nullptr;  // quantized_: this step's per-key K scales
  float* v_scales_ = nullptr;  // quantized_: this step's per-key V scales
  int64_t kv_pad_ = 0;
  int64_t rows_ = 0;  // query rows of the current item
  float* few_rows_q_ = nullptr;  // direct_: (heads * rows, D_pad) fp32 Q (load_q_tiles: scaled or not)
  bool int8_scores_ = false;       // direct_ on an int8 cache with usable K::kFewRowsInt8Scores
  bool item_int8_scores_ = false;  // ... and this item's Q rows are finite (rounded to int16)
  int16_t* q16_ = nullptr;         // (heads * rows, K::few_rows_q16_stride(D)) Q rounded to int16
  float* q16_steps_ = nullptr;     // (heads * rows) their steps
  float* acc_ = nullptr;
  float* row_max_ = nullptr;
  float* row_sum_ = nullptr;
  float* s_tile_ = nullptr;
  const void** key_rows_ = nullptr;
  bool direct_ = false;                // few-rows products (see the constructor)
  bool dot_scores_ = false;            // direct_ scores on bf16 dot products, Q unscaled
  float few_rows_deferred_ = 1.0f;     // direct_ (other than dot_scores_): the scale left to the softmax
  bool dot_probabilities_ = false;     // direct_ P V with P rounded: to bf16 on vdpbf16ps, or int16 on VNNI
  bool k_ahead_in_pv_ = false;         // ... whose kernel asks for the next step's K rows (not the scores)
  int64_t k_row_bytes_ = 0;            // ... and their length: head_dim elements of the cache's type
  bool prefetch_to_l2_ = false;        // direct_: the step's rows go to L2 (decode_prefetch_to_l2)
  bool walk_burst_to_l2_ = false;      // direct_: walking items ask for the next step toward L2 first
  bool pv_asks_next_v_ = false;        // direct_: P V asks for the next step's V rows (decode_pv_asks_next_v)
  bool p_in_operands_ = false;         // the operands hold P (Operands::exponentials)
  const void** k_rows_ = nullptr;      // direct_: K row addresses of the tile
  const void** v_rows_ = nullptr;      // direct_: V row addresses of the tile
  const void** k_ahead_ = nullptr;     // direct_: K row addresses of the next tile
  const void** v_ahead_ = nullptr;     // direct_: V row addresses of the next tile
  int64_t ahead_ = 0;                  // direct_: keys of the next tile (0: none)
  RowPrefetch prefetch_;               // packed tiles: the next tile's lines
};

// The entry the dispatcher calls for each work item: the operand policy is
// the one switch point (plan_forward sets Problem::product only where the
// ISA has bf16 products).
template <class K>
inline void run_forward_item_on(const Problem& p, const WorkItem& w, float* scratch) {
  if constexpr (requires { K::kBf16Products; }) {
    if (p.product == TileProduct::bf16_dot) {
      ForwardMainloop<K, Bf16Operands<K>> loop(p, scratch);
      loop.run(w);
      return;
    }
  }
  ForwardMainloop<K, Fp32Operands<K>> loop(p, scratch);
  loop.run(w);
}

inline void run_forward_item(const Problem& p, const WorkItem& w, float* scratch) {
  run_forward_item_on<Kernels>(p, w, scratch);
}
