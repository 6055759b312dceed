// One decode scenario: a batch of sequences with `cached` tokens already in
// the cache (contiguous or paged) and `new_tokens` more arriving with their
// queries. Holds the full token sequences so that the result can be checked
// against the forward operator / float64 reference on the whole sequence.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kv_test_support.hpp"
#include "tileattn/rope.hpp"

namespace tileattn::kvtest {

struct DecodeSpec {
  int64_t heads = 4, kv_heads = 2, head_dim = 64;
  int64_t v_head_dim = 0;  // V and O (KvCacheArgs::v_head_dim); 0: head_dim
  int64_t dv() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  DType dtype = DType::f32;
  std::vector<int32_t> cached{15};  // per sequence, before this step
  int64_t new_tokens = 1;
  bool causal = true;
  int64_t window_left = -1, window_right = -1;
  int64_t page_size = 0;  // 0: contiguous cache
  int64_t rotary_dim = 0;  // 0: no rotary embedding
  bool rotary_interleaved = false;
  int threads = 2;
  Isa isa = Isa::automatic;
  bool cache_bshd = false;  // contiguous cache as [batch, capacity, kv_heads, D]
  float softcap = 0.0f;
  std::vector<float> alibi_slopes;  // [heads], or [batch * heads] (then per sequence)
  std::vector<float> sinks;         // [heads] sink logits (ForwardArgs::sinks), empty: none
  KvQuant kv_quant = KvQuant::none;  // int8 / fp8_e4m3: a quantized cache (scales made by make_cache)
  // Each token's V row times 2^(shift + e), e uniform in [-spread, spread]
  // (an int8 cache's per-token V scales spread as widely, shifted).
  int v_exponent_spread = 0, v_exponent_shift = 0;
  uint64_t seed = 1;
  std::string name() const {
    std::ostringstream s;
    s << dtype_name(dtype) << " h" << heads << "/" << kv_heads << " d" << head_dim << " dv" << dv() << " cached";
    for (int32_t c : cached) s << " " << c;
    s << " new " << new_tokens << (causal ? " causal" : "") << " window " << window_left << ","
      << window_right << " page " << page_size << " rotary " << rotary_dim
      << (rotary_interleaved ? " gptj" : "") << " threads " << threads << " isa " << isa_name(isa)
      << (cache_bshd ? " bshd cache" : "") << (softcap > 0.0f ? " softcap " + std::to_string(softcap) : "")
      << (alibi_slopes.empty() ? "" : " alibi") << (sinks.empty() ? "" : " sinks") << " kv "
      << kv_quant_name(kv_quant) << (v_exponent_spread > 0 || v_exponent_shift != 0
                                       ? " v 2^(" + std::to_string(v_exponent_shift) + " +- " +
                                             std::to_string(v_exponent_spread) + ")"
                                       : "");
    return s.str();
  }
};

// `value` rounded once to the nearest element of `dtype` (ties to even), by
// comparing the neighbours of its fp32-rounded value in float64 -- a check
// independent of the library's conversion. Finite results only.
inline float round_once(double value, DType dtype) {
  const float f = float(value);
  if (dtype == DType::f32) return f;
  const auto to_bits = [dtype](float x) { return dtype == DType::f16 ? detail::float_to_f16(x) : detail::float_to_bf16(x); };
  const auto from_bits = [dtype](uint16_t h) { return dtype == DType::f16 ? detail::f16_to_float(h) : detail::bf16_to_float(h); };
  const uint16_t near = to_bits(f);  // double rounding is at most one unit off
  float best = from_bits(near);
  for (uint16_t h : {uint16_t(near - 1), uint16_t(near + 1)}) {
    const float candidate = from_bits(h);
    if (!std::isfinite(candidate)) continue;
    const double d = std::abs(double(candidate) - value), d_best = std::abs(double(best) - value);
    if (d < d_best || (d == d_best && (h & 1u) == 0)) best = candidate;
  }
  return best;
}

// float64 rotary embedding of one row, rounded once to dtype -- the "apply
// RoPE first" side of the fused-RoPE tests.
inline void rotate_reference(const Buffer& src, int64_t src_off, Buffer& dst, int64_t dst_off,
                             int64_t head_dim, const RopeTables& t, int64_t position, bool interleaved) {
  for (int64_t c = 0; c < head_dim; ++c) dst.set(dst_off + c, src.get(src_off + c));
  const int64_t half = t.rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const double x0 = src.get(src_off + a), x1 = src.get(src_off + b);
    const double cs = t.cos[size_t(position * half + i)], sn = t.sin[size_t(position * half + i)];
    dst.set(dst_off + a, round_once(x0 * cs - x1 * sn, dst.dtype()));  // exact in dtype: set stores it as is
    dst.set(dst_off + b, round_once(x0 * sn + x1 * cs, dst.dtype()));
  }
}

struct DecodeRun {
  DecodeSpec spec;
  int64_t batch = 0, max_len = 0, capacity = 0;
  Buffer k_full, v_full;        // [batch, kv_heads, max_len, D] raw tokens (V: Dv)
  Buffer k_expected;            // k_full rotated to each row's position (or a copy)
  Buffer q, q_expected;         // [batch, heads, new_tokens, D]
  Buffer k_new, v_new;          // [batch, new_tokens, kv_heads, D] (bshd strides; V: Dv)
  std::array<int64_t, 4> new_stride{}, v_new_stride{};
  Buffer k_cache, v_cache;          // in kv_storage_dtype(dtype, kv_quant)
  std::vector<float> k_scale, v_scale;  // quantized caches: int8 [outer, kv_heads, rows] (NaN
                                        // until written), fp8 [kv_heads]
  std::vector<int32_t> seqlens, block_table;
  RopeTables rope;
  Buffer o;                     // [batch, heads, new_tokens, Dv]
  std::vector<float> lse;
  KvCacheArgs args;

  explicit DecodeRun(const DecodeSpec& s) : spec(s) {
    std::mt19937_64 rng(s.seed);
    const int64_t d = s.head_dim, dv = s.dv(), n = s.new_tokens;
    batch = int64_t(s.cached.size());
    max_len = *std::max_element(s.cached.begin(), s.cached.end()) + n;
    capacity = max_len + 3;
    k_full = Buffer(s.dtype, batch * s.kv_heads * max_len * d);
    v_full = Buffer(s.dtype, batch * s.kv_heads * max_len * dv);
    k_full.fill_uniform(rng);
    v_full.fill_uniform(rng);
    if (s.v_exponent_spread > 0 || s.v_exponent_shift != 0) {
      std::uniform_int_distribution<int> e(-s.v_exponent_spread, s.v_exponent_spread);
      for (int64_t row = 0; row < v_full.elements() / dv; ++row) {
        // Exact in bf16 and fp32 (fp16: small exponents only).
        const float f = std::ldexp(1.0f, s.v_exponent_shift + e(rng));
        for (int64_t c = 0; c < dv; ++c) v_full.set(row * dv + c, v_full.get(row * dv + c) * f);
      }
    }
    q = Buffer(s.dtype, batch * s.heads * n * d);
    q.fill_uniform(rng);
    k_expected = Buffer(s.dtype, k_full.elements());
    q_expected = Buffer(s.dtype, q.elements());
    if (s.rotary_dim > 0) rope = rope_tables(10000.0, capacity, s.rotary_dim);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < s.kv_heads; ++h)
        for (int64_t j = 0; j < max_len; ++j) {
          const int64_t off = ((b * s.kv_heads + h) * max_len + j) * d;
          if (s.rotary_dim > 0) rotate_reference(k_full, off, k_expected, off, d, rope, j, s.rotary_interleaved);
          else for (int64_t c = 0; c < d; ++c) k_expected.set(off + c, k_full.get(off + c));
        }
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < n; ++t) {
          const int64_t off = ((b * s.heads + h) * n + t) * d;
          if (s.rotary_dim > 0)
            rotate_reference(q, off, q_expected, off, d, rope, s.cached[size_t(b)] + t, s.rotary_interleaved);
          else for (int64_t c = 0; c < d; ++c) q_expected.set(off + c, q.get(off + c));
        }
    // New tokens in [batch, n, kv_heads, D] order: a layout other than the cache's.
    k_new = Buffer(s.dtype, batch * n * s.kv_heads * d);
    v_new = Buffer(s.dtype, batch * n * s.kv_heads * dv);
    new_stride = dense_strides(Layout::bshd, batch, s.kv_heads, n, d);
    v_new_stride = dense_strides(Layout::bshd, batch, s.kv_heads, n, dv);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < s.kv_heads; ++h)
        for (int64_t t = 0; t < n; ++t) {
          const int64_t row = (b * s.kv_heads + h) * max_len + s.cached[size_t(b)] + t;
          for (int64_t c = 0; c < d; ++c)
            k_new.set(b * new_stride[0] + h * new_stride[1] + t * new_stride[2] + c, k_full.get(row * d + c));
          for (int64_t c = 0; c < dv; ++c)
            v_new.set(b * v_new_stride[0] + h * v_new_stride[1] + t * v_new_stride[2] + c, v_full.get(row * dv + c));
        }
    make_cache(rng);
    o = Buffer(s.dtype, batch * s.heads * n * dv);
    lse.assign(size_t(batch * s.heads * n), 0.0f);

    KvCacheArgs& a = args;
    a.batch = batch;
    a.heads = s.heads;
    a.kv_heads = s.kv_heads;
    a.head_dim = d;
    a.v_head_dim = s.v_head_dim;
    a.dtype = s.dtype;
    a.seqlen_q = n;
    a.q = {q.data(), bhsd(batch, s.heads, n, d)};
    a.o = {o.data(), bhsd(batch, s.heads, n, dv)};
    a.lse = lse.data();
    a.lse_stride = {s.heads * n, n, 1};
    a.cache_seqlens = seqlens.data();
    a.causal = s.causal;
    a.window_left = s.window_left;
    a.window_right = s.window_right;
    a.softcap = s.softcap;
    if (!s.alibi_slopes.empty()) {
      a.alibi_slopes = spec.alibi_slopes.data();
      a.alibi_batch_stride = int64_t(s.alibi_slopes.size()) > s.heads ? s.heads : 0;
    }
    if (!s.sinks.empty()) a.sinks = spec.sinks.data();
    a.threads = s.threads;
    a.isa = s.isa;
    if (s.rotary_dim > 0) {
      a.rotary_cos = rope.cos.data();
      a.rotary_sin = rope.sin.data();
      a.rotary_dim = s.rotary_dim;
      a.rotary_positions = rope.positions;
      a.rotary_interleaved = s.rotary_interleaved;
    }
  }

  // Quantized caches: the scales of [outer, kv_heads, rows] rows. int8 slots
  // start as NaN, so a read of a row never written shows; fp8 takes one
  // scale per KV head that keeps the uniform(-1, 1) values inside e4m3's
  // range (|x| / scale <= 1 / 0.004 = 250 < 448).
  void make_scales(int64_t outer, int64_t rows) {
    const DecodeSpec& s = spec;
    args.kv_quant = s.kv_quant;
    if (s.kv_quant == KvQuant::none) return;
    if (s.kv_quant == KvQuant::fp8_e4m3) {
      k_scale.resize(size_t(s.kv_heads));
      v_scale.resize(size_t(s.kv_heads));
      for (int64_t h = 0; h < s.kv_heads; ++h) {
        k_scale[size_t(h)] = 0.004f + 0.001f * float(h);
        v_scale[size_t(h)] = 0.005f + 0.0005f * float(h);
      }
    } else {
      k_scale.assign(size_t(outer * s.kv_heads * rows), std::numeric_limits<float>::quiet_NaN());
      v_scale = k_scale;
      args.k_scale_stride = {s.kv_heads * rows, rows, 1};
      args.v_scale_stride = args.k_scale_stride;
    }
    args.k_scale = k_scale.data();
    args.v_scale = v_scale.data();
  }

  void make_cache(std::mt19937_64& rng) {
    const DecodeSpec& s = spec;
    const DType storage = kv_storage_dtype(s.dtype, s.kv_quant);
    seqlens.assign(size_t(batch), 0);
    if (s.page_size == 0) {
      k_cache = Buffer(storage, batch * s.kv_heads * capacity * s.head_dim);
      v_cache = Buffer(storage, batch * s.kv_heads * capacity * s.dv());
      make_scales(batch, capacity);
      const Layout layout = s.cache_bshd ? Layout::bshd : Layout::bhsd;
      args.k_cache = {k_cache.data(), dense_strides(layout, batch, s.kv_heads, capacity, s.head_dim)};
      args.v_cache = {v_cache.data(), dense_strides(layout, batch, s.kv_heads, capacity, s.dv())};
      args.capacity = capacity;
      return;
    }
    // Pages in a random order, two spare pages nobody uses.
    const int64_t per_sequence = (capacity + s.page_size - 1) / s.page_size;
    const int64_t num_pages = batch * per_sequence + 2;
    std::vector<int32_t> order(static_cast<size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    block_table.assign(order.begin(), order.begin() + batch * per_sequence);
    k_cache = Buffer(storage, num_pages * s.kv_heads * s.page_size * s.head_dim);
    v_cache = Buffer(storage, num_pages * s.kv_heads * s.page_size * s.dv());
    make_scales(num_pages, s.page_size);
    args.k_cache = {k_cache.data(), bhsd(num_pages, s.kv_heads, s.page_size, s.head_dim)};
    args.v_cache = {v_cache.data(), bhsd(num_pages, s.kv_heads, s.page_size, s.dv())};
    args.block_table = block_table.data();
    args.block_table_stride = per_sequence;
    args.page_size = s.page_size;
    args.num_pages = num_pages;
  }

  // Appends the cached tokens (rotated when rotary is on) with kv_cache_append.
  void prefill() {
    const DecodeSpec& s = spec;
    KvCacheArgs a = args;
    a.seqlen_new = *std::max_element(s.cached.begin(), s.cached.end());
    a.k_new = {k_full.data(), bhsd(batch, s.kv_heads, max_len, s.head_dim)};
    a.v_new = {v_full.data(), bhsd(batch, s.kv_heads, max_len, s.dv())};
    a.new_counts = s.cached.data();
    kv_cache_append(a);
  }

  // The step under test: append the new tokens and attend their queries.
  KvCacheArgs step_args() {
    KvCacheArgs a = args;
    a.seqlen_new = spec.new_tokens;
    a.k_new = {k_new.data(), new_stride};
    a.v_new = {v_new.data(), v_new_stride};
    return a;
  }
  void decode() { attention_with_kvcache(step_args()); }

  // The forward operator's arguments over the full sequences as given
  // (pre-rotated when rotary is on): the check's ground truth.
  ForwardArgs full_sequence_args(Buffer& out, std::vector<int32_t>& lengths) {
    const DecodeSpec& s = spec;
    lengths.resize(size_t(batch));
    for (int64_t b = 0; b < batch; ++b) lengths[size_t(b)] = s.cached[size_t(b)] + int32_t(s.new_tokens);
    ForwardArgs f;
    f.shape = {batch, s.heads, s.kv_heads, s.new_tokens, max_len, s.head_dim, s.v_head_dim};
    f.dtype = s.dtype;
    f.q = {q_expected.data(), bhsd(batch, s.heads, s.new_tokens, s.head_dim)};
    f.k = {k_expected.data(), bhsd(batch, s.kv_heads, max_len, s.head_dim)};
    f.v = {v_full.data(), bhsd(batch, s.kv_heads, max_len, s.dv())};
    out = Buffer(s.dtype, o.elements());
    f.o = {out.data(), bhsd(batch, s.heads, s.new_tokens, s.dv())};
    f.mask.causal = s.causal;
    f.mask.window_left = s.window_left;
    f.mask.window_right = s.window_right;
    f.softcap = s.softcap;
    f.alibi_slopes = args.alibi_slopes;
    f.alibi_batch_stride = args.alibi_batch_stride;
    f.sinks = args.sinks;
    // Equal lengths: a plain dense forward; otherwise per-sequence lengths.
    if (std::any_of(lengths.begin(), lengths.end(), [&](int32_t l) { return l != max_len; }))
      f.kv.seqlens = lengths.data();
    f.threads = s.threads;
    return f;
  }

  // Cached row j of sequence b, head h, element c (follows the block table).
  float cache_k(int64_t b, int64_t h, int64_t j, int64_t c) const { return cache_at(k_cache, args.k_cache, b, h, j, c); }
  float cache_v(int64_t b, int64_t h, int64_t j, int64_t c) const { return cache_at(v_cache, args.v_cache, b, h, j, c); }

 private:
  float cache_at(const Buffer& buf, const OutputView& view, int64_t b, int64_t h, int64_t j, int64_t c) const {
    int64_t outer = b, row = j;
    if (args.block_table) {
      outer = args.block_table[b * args.block_table_stride + j / args.page_size];
      row = j % args.page_size;
    }
    return buf.get(outer * view.stride[0] + h * view.stride[1] + row * view.stride[2] + c * view.stride[3]);
  }
};

// What bf16_probabilities did to a decode step run twice, without (`exact`)
// and with it (`rounded`): the cache's largest |V|, the default output's
// largest |O| and the largest |O| difference between the two.
struct RoundingEffect {
  double max_v = 0, max_o = 0, max_diff = 0;
};
inline RoundingEffect rounding_effect(const DecodeRun& exact, const DecodeRun& rounded) {
  RoundingEffect e;
  for (int64_t i = 0; i < exact.v_full.elements(); ++i) e.max_v = std::max(e.max_v, std::abs(double(exact.v_full.get(i))));
  for (int64_t i = 0; i < exact.o.elements(); ++i) {
    e.max_o = std::max(e.max_o, std::abs(double(exact.o.get(i))));
    e.max_diff = std::max(e.max_diff, std::abs(double(rounded.o.get(i)) - double(exact.o.get(i))));
  }
  return e;
}

}  // namespace tileattn::kvtest
