// Fuzzes the KV cache (kv_cache_append, attention_with_kvcache): bytes become
// a KvCacheArgs with small sizes -- contiguous or paged caches, GQA head
// counts, cache_seqlens (some corrupt), block tables (distinct pages, random
// pages, shared prefixes, entries out of range), new_counts, RoPE tables
// (short, odd rotary_dim, one table missing), windows, scales, ISA paths,
// quantized caches (int8 with per-(token, head) scales of any strides, fp8
// e4m3 with per-head scales, some of them 0, NaN, inf or missing), soft cap,
// ALiBi, sinks, cache_batch_idx / cache_batch, cache_leftpad,
// rotary_fa2_query_positions -- and arbitrary strides, over buffers sized to
// exactly the bytes each view reaches (fuzz_views.hpp), so ASan sees any
// access outside a view.
//
// Properties checked, beyond "no sanitizer finding":
//  - the call either succeeds or throws tileattn::Error / NotSupported;
//  - on a throw, no byte changed anywhere: cache, scales, cache_seqlens, o,
//    lse, inputs;
//  - on success, cache_seqlens[b] advanced by exactly the rows appended; the
//    cache changed only in the appended rows, which hold the new values (bit
//    for bit, keys too when no RoPE is given; a quantized cache's rows and
//    int8 scales change only there, fp8 scales not at all); no input
//    changed; o and lse changed only inside their views (append-only calls:
//    not at all);
//  - on success with finite, moderate inputs, scale and score modifiers, o
//    is finite;
//  - on success, a rerun on every hardware thread (fuzz_threads.hpp) from the
//    same cache gives the same bits of the cache, its scales, cache_seqlens,
//    o and lse;
//  - a cache, q/o or k_new/v_new view whose byte extent overflows int64 is
//    refused whenever it would be used;
//  - o placed on the cache, k_new placed on the cache, v_cache placed on
//    k_cache, and q placed on the cache of an append are refused whenever
//    both views are non-empty.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "fuzz_threads.hpp"
#include "fuzz_views.hpp"
#include "tileattn/kv_cache.hpp"

namespace {

using tileattn::DType;
using tileattn::KvCacheArgs;
using namespace fuzzviews;

constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

const KvCacheArgs* current = nullptr;  // the call under test, printed on a failure

void print_args(const KvCacheArgs& a) {
  auto s4 = [](const std::array<int64_t, 4>& s) {
    static char buf[4][128];
    static int next = 0;
    char* b = buf[next++ % 4];
    std::snprintf(b, 128, "[%lld %lld %lld %lld]", (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
    return b;
  };
  std::fprintf(stderr,
               "  dtype %d batch %lld heads %lld kv_heads %lld head_dim %lld seqlen_q %lld seqlen_new %lld\n"
               "  capacity %lld paged %d page_size %lld num_pages %lld table_stride %lld rotary_dim %lld\n"
               "  causal %d window %lld %lld scale %g threads %d isa %d bf16_probabilities %d kv_quant %d\n",
               int(a.dtype), (long long)a.batch, (long long)a.heads, (long long)a.kv_heads, (long long)a.head_dim,
               (long long)a.seqlen_q, (long long)a.seqlen_new, (long long)a.capacity, a.block_table != nullptr,
               (long long)a.page_size, (long long)a.num_pages, (long long)a.block_table_stride,
               (long long)a.rotary_dim, a.causal, (long long)a.window_left, (long long)a.window_right,
               double(a.scale), a.threads, int(a.isa), int(a.bf16_probabilities), int(a.kv_quant));
  std::fprintf(stderr,
               "  softcap %g alibi %p (batch stride %lld) sinks %p cache_batch_idx %p cache_batch %lld\n"
               "  cache_leftpad %p rotary_fa2_query_positions %d\n",
               double(a.softcap), static_cast<const void*>(a.alibi_slopes), (long long)a.alibi_batch_stride,
               static_cast<const void*>(a.sinks), static_cast<const void*>(a.cache_batch_idx),
               (long long)a.cache_batch, static_cast<const void*>(a.cache_leftpad), int(a.rotary_fa2_query_positions));
  std::fprintf(stderr, "  k_cache %p %s v_cache %p %s\n  q %p %s o %p %s\n",
               a.k_cache.data, s4(a.k_cache.stride), a.v_cache.data, s4(a.v_cache.stride), a.q.data,
               s4(a.q.stride), a.o.data, s4(a.o.stride));
  std::fprintf(stderr, "  k_new %p %s v_new %p %s\n", a.k_new.data, s4(a.k_new.stride), a.v_new.data,
               s4(a.v_new.stride));
  if (a.cache_seqlens)
    for (int64_t b = 0; b < a.batch; ++b) std::fprintf(stderr, "  cache_seqlens[%lld] = %d\n", (long long)b, a.cache_seqlens[b]);
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_kv_cache: property violated: %s\n", what);
  if (current) print_args(*current);
  std::abort();
}

// Bitwise equality (the tables may hold NaN, which == never matches).
bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}

// Byte offset of element (outer, head, row, dim) of a view buffer.
int64_t element_at(const ViewBuffer& buf, const std::array<int64_t, 4>& stride, int64_t esize,
                   int64_t outer, int64_t head, int64_t row, int64_t dim) {
  return buf.origin + (outer * stride[0] + head * stride[1] + row * stride[2] + dim * stride[3]) * esize;
}

// `buf` may host a second view whose own buffer is `other`: the second
// view's extent around its origin fits inside `buf`'s around the same origin.
bool hosts(const ViewBuffer& buf, const ViewBuffer& other) {
  if (buf.bytes.empty() || other.bytes.empty() || buf.overflow || other.overflow) return false;
  return other.origin <= buf.origin &&
         int64_t(other.bytes.size()) - other.origin <= int64_t(buf.bytes.size()) - buf.origin;
}

// A block table: `mode` 0 distinct pages in a shuffled order, 1 random pages,
// 2 distinct pages with one corrupt entry, 3 sequences sharing their first page.
std::vector<int32_t> make_block_table(FuzzedDataProvider& in, int64_t batch, int64_t stride,
                                      int64_t num_pages) {
  const int64_t entries = batch * stride;
  std::vector<int32_t> table(size_t(entries) + 1, 0);  // never empty: the pointer is non-null
  const int mode = in.ConsumeIntegralInRange<int>(0, 3);
  const int64_t pages = std::max<int64_t>(num_pages, 1);
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  for (size_t i = order.size(); i > 1; --i)
    std::swap(order[i - 1], order[in.ConsumeIntegralInRange<size_t>(0, i - 1)]);
  for (int64_t i = 0; i < entries; ++i) {
    if (mode == 1) table[size_t(i)] = in.ConsumeIntegralInRange<int32_t>(-1, int32_t(pages));
    else table[size_t(i)] = order[size_t(i % pages)];
  }
  if (mode == 2 && entries > 0) {
    const int32_t corrupt[] = {-1, int32_t(std::min<int64_t>(num_pages, kInt32Max)), kInt32Min, kInt32Max};
    table[in.ConsumeIntegralInRange<size_t>(0, size_t(entries - 1))] = corrupt[in.ConsumeIntegralInRange<int>(0, 3)];
  }
  if (mode == 3)
    for (int64_t b = 1; b < batch; ++b)
      if (stride > 0) table[size_t(b * stride)] = table[0];
  return table;
}

// RoPE tables [positions, rotary_dim / 2]: real angles, or fuzzed values.
std::vector<float> make_rotary_table(FuzzedDataProvider& in, int64_t positions, int64_t half, bool cosine) {
  const int64_t n = positions > 0 && half > 0 ? positions * half : 0;
  std::vector<float> t(size_t(n) + 1, 0.0f);
  const bool real = in.ConsumeBool();
  for (int64_t i = 0; i < n; ++i) {
    const double angle = double(i / half) * std::pow(10000.0, -double(i % half) / double(half));
    t[size_t(i)] = real ? float(cosine ? std::cos(angle) : std::sin(angle))
                        : float(in.ConsumeIntegralInRange<int>(-100, 100)) / 50.0f;
  }
  if (n > 0 && in.ConsumeIntegralInRange<int>(0, 15) == 0) t[0] = std::numeric_limits<float>::quiet_NaN();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  KvCacheArgs a;
  const bool append_only = in.ConsumeIntegralInRange<int>(0, 3) == 0;
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  a.dtype = dtypes[in.ConsumeIntegralInRange<int>(0, 2)];
  const int64_t esize = int64_t(tileattn::dtype_size(a.dtype));
  a.batch = in.ConsumeIntegralInRange<int64_t>(-1, 3);
  a.kv_heads = in.ConsumeIntegralInRange<int64_t>(-1, 3);
  a.heads = in.ConsumeBool() ? a.kv_heads * in.ConsumeIntegralInRange<int64_t>(1, 3)
                             : in.ConsumeIntegralInRange<int64_t>(-1, 6);
  const int64_t dims[] = {1, 2, 16, 64, 128, 256, 0, 257, -1, 576, 577};
  a.head_dim = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 40) : dims[in.ConsumeIntegralInRange<int>(0, 10)];
  // V's head dim: mostly K's (0), else its own, in range or not.
  const int64_t v_dims[] = {0, 0, 0, 0, 1, 17, 128, 512, 513, -1};
  a.v_head_dim = v_dims[in.ConsumeIntegralInRange<int>(0, 9)];
  const int64_t v_dim = a.v_head_dim != 0 ? a.v_head_dim : a.head_dim;  // V, v_new and O
  const int64_t batch = std::max<int64_t>(a.batch, 0);

  // The cache: contiguous [batch, kv_heads, capacity, head_dim] or pages.
  const bool paged = in.ConsumeBool();
  const int64_t hostile[] = {-1, 0, int64_t{1} << 40, kInt64Max, int64_t{1} << 62};
  std::vector<int32_t> table;
  int64_t max_length = 0;  // tokens the cache can hold per sequence (for choosing cache_seqlens)
  if (paged) {
    const bool wild = in.ConsumeIntegralInRange<int>(0, 15) == 0;
    a.page_size = wild ? hostile[in.ConsumeIntegralInRange<int>(0, 4)] : in.ConsumeIntegralInRange<int64_t>(0, 8);
    a.num_pages = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? hostile[in.ConsumeIntegralInRange<int>(0, 4)]
                                                            : in.ConsumeIntegralInRange<int64_t>(-1, 12);
    a.block_table_stride = in.ConsumeIntegralInRange<int64_t>(-1, 6);
    table = make_block_table(in, batch, std::max<int64_t>(a.block_table_stride, 0),
                             std::clamp<int64_t>(a.num_pages, 0, 64));
    a.block_table = table.data();
    max_length = std::clamp<int64_t>(a.page_size, 0, 64) * std::max<int64_t>(a.block_table_stride, 0);
  } else {
    a.capacity = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? hostile[in.ConsumeIntegralInRange<int>(0, 4)]
                                                           : in.ConsumeIntegralInRange<int64_t>(-1, 24);
    max_length = std::clamp<int64_t>(a.capacity, 0, 64);
  }
  const int64_t cache_sizes[4] = {paged ? a.num_pages : a.batch, a.kv_heads, paged ? a.page_size : a.capacity,
                                  a.head_dim};
  const int64_t v_cache_sizes[4] = {cache_sizes[0], cache_sizes[1], cache_sizes[2], v_dim};

  // cache_seqlens: mostly in range, sometimes corrupt, once in a while null.
  std::vector<int32_t> seqlens(size_t(batch) + 1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      const int32_t corrupt[] = {-1, int32_t(max_length + 1), kInt32Max, kInt32Min, kInt32Max - 2};
      seqlens[size_t(b)] = corrupt[in.ConsumeIntegralInRange<int>(0, 4)];
    } else {
      seqlens[size_t(b)] = in.ConsumeIntegralInRange<int32_t>(0, int32_t(max_length));
    }
  }
  a.cache_seqlens = in.ConsumeIntegralInRange<int>(0, 31) == 0 ? nullptr : seqlens.data();

  // New tokens and queries.
  a.seqlen_new = in.ConsumeIntegralInRange<int>(0, 31) == 0 ? hostile[in.ConsumeIntegralInRange<int>(0, 4)]
                                                           : in.ConsumeIntegralInRange<int64_t>(0, 5);
  std::vector<int32_t> counts(size_t(batch) + 1, 0);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const int32_t top = int32_t(std::clamp<int64_t>(a.seqlen_new, 0, 6));
    for (int64_t b = 0; b < batch; ++b) counts[size_t(b)] = in.ConsumeIntegralInRange<int32_t>(-1, top + 1);
    a.new_counts = counts.data();
  }
  a.seqlen_q = in.ConsumeBool() ? a.seqlen_new : in.ConsumeIntegralInRange<int64_t>(-1, 5);
  const int64_t q_sizes[4] = {a.batch, a.heads, a.seqlen_q, a.head_dim};
  const int64_t o_sizes[4] = {a.batch, a.heads, a.seqlen_q, v_dim};
  const int64_t new_sizes[4] = {a.batch, a.kv_heads, a.seqlen_new, a.head_dim};
  const int64_t v_new_sizes[4] = {a.batch, a.kv_heads, a.seqlen_new, v_dim};
  const int64_t lse_sizes[3] = {a.batch, a.heads, a.seqlen_q};

  a.k_cache.stride = pick_strides(in, cache_sizes);
  a.v_cache.stride = in.ConsumeBool() ? a.k_cache.stride : pick_strides(in, v_cache_sizes);
  a.q.stride = pick_strides(in, q_sizes);
  a.o.stride = in.ConsumeBool() ? a.q.stride : pick_strides(in, o_sizes);
  a.k_new.stride = pick_strides(in, new_sizes);
  a.v_new.stride = in.ConsumeBool() ? a.k_new.stride : pick_strides(in, v_new_sizes);
  ViewBuffer k_cache = make_view_buffer(cache_sizes, a.k_cache.stride.data(), 4, esize);
  ViewBuffer v_cache = make_view_buffer(v_cache_sizes, a.v_cache.stride.data(), 4, esize);
  ViewBuffer q = make_view_buffer(q_sizes, a.q.stride.data(), 4, esize);
  ViewBuffer o = make_view_buffer(o_sizes, a.o.stride.data(), 4, esize);
  ViewBuffer k_new = make_view_buffer(new_sizes, a.k_new.stride.data(), 4, esize);
  ViewBuffer v_new = make_view_buffer(v_new_sizes, a.v_new.stride.data(), 4, esize);
  ViewBuffer lse;
  if (in.ConsumeBool()) {
    if (in.ConsumeBool()) {
      int64_t per_batch;
      if (__builtin_mul_overflow(a.heads, a.seqlen_q, &per_batch)) per_batch = kInt64Max;
      a.lse_stride = {per_batch, a.seqlen_q, 1};
    } else {
      for (auto& x : a.lse_stride) x = in.ConsumeIntegralInRange<int64_t>(-20, 20);
    }
    lse = make_view_buffer(lse_sizes, a.lse_stride.data(), 3, 4);
  }
  for (const ViewBuffer* b : {&k_cache, &v_cache, &q, &o, &k_new, &v_new, &lse})
    if (b->too_large && !b->overflow) return 0;  // a real caller's memory; not allocated here

  // RoPE.
  std::vector<float> rotary_cos, rotary_sin;
  if (in.ConsumeIntegralInRange<int>(0, 2) == 0) {
    const int64_t dims_rotary[] = {a.head_dim, a.head_dim - (a.head_dim % 2), 2, 0, a.head_dim + 2, 3};
    a.rotary_dim = in.ConsumeBool() ? 2 * in.ConsumeIntegralInRange<int64_t>(1, 20)
                                    : dims_rotary[in.ConsumeIntegralInRange<int>(0, 5)];
    a.rotary_positions = in.ConsumeIntegralInRange<int64_t>(-1, 40);
    // Rows as wide as the widest rotary_dim the library reads (head dims up
    // to kMaxHeadDim; the tables are raw pointers it cannot measure).
    const int64_t half = std::clamp<int64_t>(a.rotary_dim / 2, 0, tileattn::kMaxHeadDim / 2 + 1);
    rotary_cos = make_rotary_table(in, a.rotary_positions, half, true);
    rotary_sin = make_rotary_table(in, a.rotary_positions, half, false);
    const int which = in.ConsumeIntegralInRange<int>(0, 7);  // 0: cos only, 1: sin only
    a.rotary_cos = which == 1 ? nullptr : rotary_cos.data();
    a.rotary_sin = which == 0 ? nullptr : rotary_sin.data();
    a.rotary_interleaved = in.ConsumeBool();
  }

  const float scales[] = {std::numeric_limits<float>::quiet_NaN(), 0.125f, 1.0f, 0.0f, -2.0f, 1e20f,
                          std::numeric_limits<float>::infinity(), 1e-30f};
  a.scale = scales[in.ConsumeIntegralInRange<int>(0, 7)];
  a.causal = in.ConsumeBool();
  const int64_t windows[] = {-2, -1, 0, 1, 3, 17, int64_t{1} << 40, kInt64Max};
  a.window_left = windows[in.ConsumeIntegralInRange<int>(0, 7)];
  a.window_right = windows[in.ConsumeIntegralInRange<int>(0, 7)];
  a.threads = in.ConsumeIntegralInRange<int>(-1, 2);
  const tileattn::Isa isas[] = {tileattn::Isa::automatic, tileattn::Isa::generic, tileattn::Isa::avx2,
                                tileattn::Isa::avx512, tileattn::Isa::reference};
  a.isa = isas[in.ConsumeIntegralInRange<int>(0, 4)];

  // Placements that must be refused: o on the cache, k_new on the cache,
  // v_cache on k_cache (only where the buffers allow it, so a wrongly
  // accepted call is caught by the checks below, not by ASan).
  const int alias = in.ConsumeIntegralInRange<int>(0, 15);
  const bool o_on_cache = alias == 1 && hosts(k_cache, o);
  const bool k_new_on_cache = alias == 2 && hosts(k_cache, k_new);
  const bool v_cache_on_k = alias == 3 && hosts(k_cache, v_cache);
  const bool q_on_cache = alias == 4 && hosts(k_cache, q);

  fill_values(in, k_cache, a.dtype);
  fill_values(in, v_cache, a.dtype);
  fill_values(in, q, a.dtype);
  fill_values(in, k_new, a.dtype);
  fill_values(in, v_new, a.dtype);

  // Later additions read what the input has left (so the corpus files
  // written before them keep every earlier choice): the bf16
  // rungs and bf16_probabilities, and a quantized cache one call in three
  // where no placement on the cache was chosen -- int8 elements with per-
  // (token, head) scales of fuzzed strides, or fp8 e4m3 with per-head scales
  // (now and then 0, NaN, inf, negative, missing or one buffer for both).
  if (in.ConsumeIntegralInRange<int>(0, 3) == 1)  // a CPU without the rung refuses it (NotSupported)
    a.isa = in.ConsumeBool() ? tileattn::Isa::avx512bf16 : tileattn::Isa::amx;
  a.bf16_probabilities = in.ConsumeBool();
  const int quant_pick = in.ConsumeIntegralInRange<int>(0, 5);
  if (alias == 0 || alias > 4)
    a.kv_quant = quant_pick == 4 ? tileattn::KvQuant::int8
                 : quant_pick == 5 ? tileattn::KvQuant::fp8_e4m3 : tileattn::KvQuant::none;
  const bool quantized = a.kv_quant != tileattn::KvQuant::none;
  const bool int8 = a.kv_quant == tileattn::KvQuant::int8;
  const int64_t cache_esize = quantized ? 1 : esize;
  ViewBuffer k_scale, v_scale;
  if (quantized) {
    k_cache = make_view_buffer(cache_sizes, a.k_cache.stride.data(), 4, 1);
    v_cache = make_view_buffer(v_cache_sizes, a.v_cache.stride.data(), 4, 1);
    fill_values(in, k_cache, int8 ? DType::i8 : DType::f8_e4m3);
    fill_values(in, v_cache, int8 ? DType::i8 : DType::f8_e4m3);
    // Scales: int8 [outer, kv_heads, rows] with fuzzed strides, fp8 [kv_heads].
    const int64_t scale_sizes[3] = {int8 ? cache_sizes[0] : a.kv_heads, int8 ? cache_sizes[1] : 1,
                                    int8 ? cache_sizes[2] : 1};
    if (int8) {
      const int64_t sizes4[4] = {scale_sizes[0], scale_sizes[1], scale_sizes[2], 1};
      const std::array<int64_t, 4> ks = pick_strides(in, sizes4);
      a.k_scale_stride = {ks[0], ks[1], ks[2]};
      if (in.ConsumeBool()) {
        a.v_scale_stride = a.k_scale_stride;
      } else {
        const std::array<int64_t, 4> vs = pick_strides(in, sizes4);
        a.v_scale_stride = {vs[0], vs[1], vs[2]};
      }
    } else {
      a.k_scale_stride = a.v_scale_stride = {1, 0, 0};  // contiguous [kv_heads]
    }
    k_scale = make_view_buffer(scale_sizes, a.k_scale_stride.data(), 3, 4);
    v_scale = make_view_buffer(scale_sizes, a.v_scale_stride.data(), 3, 4);
    for (const ViewBuffer* b : {&k_cache, &v_cache, &k_scale, &v_scale})
      if (b->too_large && !b->overflow) return 0;
    fill_values(in, k_scale, DType::f32);
    fill_values(in, v_scale, DType::f32);
    if (!int8)  // fp8 scales: mostly positive (the caller's calibration; also once the input runs out)
      for (ViewBuffer* s : {&k_scale, &v_scale})
        for (size_t i = 0; i + 4 <= s->bytes.size(); i += 4) {
          float x;
          std::memcpy(&x, &s->bytes[i], 4);
          if (in.ConsumeIntegralInRange<int>(0, 15) != 15) x = std::isnan(x) ? 0.5f : std::fabs(x) + 0.01f;
          std::memcpy(&s->bytes[i], &x, 4);
        }
    const int missing = in.ConsumeIntegralInRange<int>(0, 15);
    a.k_scale = missing == 1 ? nullptr : reinterpret_cast<float*>(k_scale.data());
    a.v_scale = missing == 2 ? nullptr : missing == 3 ? a.k_scale : reinterpret_cast<float*>(v_scale.data());
  } else if (in.ConsumeIntegralInRange<int>(0, 31) == 1) {
    a.k_scale = a.v_scale = reinterpret_cast<float*>(o.data());  // scales for an unquantized cache: refused
  }
  // Then the score modifiers, and for a contiguous cache (paged:
  // NotSupported) cache_leftpad and cache_batch_idx / cache_batch, indices in
  // range and out; then rotary_fa2_query_positions.
  ScoreModifiers modifiers = pick_score_modifiers(in, a.batch, a.heads);
  modifiers.apply(a);
  std::vector<int32_t> leftpad, batch_idx;
  if (!paged && in.ConsumeBool()) {
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t top = int32_t(std::min<int64_t>(int64_t(std::max<int32_t>(0, seqlens[size_t(b)])) + 1, 100));
      leftpad.push_back(in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int32_t>(-1, top));
    }
    leftpad.push_back(0);  // non-null for an empty batch
    a.cache_leftpad = leftpad.data();
  }
  if (!paged && in.ConsumeBool()) {
    a.cache_batch = in.ConsumeIntegralInRange<int64_t>(-1, batch);  // the cache holds `batch` rows
    for (int64_t b = 0; b < batch; ++b) batch_idx.push_back(in.ConsumeIntegralInRange<int32_t>(-1, int32_t(batch)));
    batch_idx.push_back(0);
    a.cache_batch_idx = batch_idx.data();
  }
  a.rotary_fa2_query_positions = in.ConsumeBool();
  a.k_cache.data = k_cache.data();
  a.v_cache.data = v_cache_on_k ? k_cache.data() : v_cache.data();
  a.q.data = q_on_cache ? k_cache.data() : q.data();
  a.o.data = o_on_cache ? k_cache.data() : o.data();
  a.k_new.data = k_new_on_cache ? k_cache.data() : k_new.data();
  a.v_new.data = v_new.data();
  a.lse = lse.bytes.empty() ? nullptr : reinterpret_cast<float*>(lse.data());

  const bool rotary = a.rotary_cos || a.rotary_sin;
  // A quantized cache's values are its elements times scales of at most 2
  // (fp8: no NaN bytes), so |V| <= 896.
  const auto cache_moderate = [&](const ViewBuffer& cache, const ViewBuffer& scales) {
    if (!quantized) return moderate(cache, a.dtype, 100.0f);
    if (!moderate(scales, DType::f32, 2.0f)) return false;
    return int8 || std::none_of(cache.bytes.begin(), cache.bytes.end(),
                                [](unsigned char x) { return (x & 0x7f) == 0x7f; });
  };
  const bool inputs_moderate =
      moderate(q, a.dtype, 100.0f) && moderate(k_new, a.dtype, 100.0f) && moderate(v_new, a.dtype, 100.0f) &&
      cache_moderate(k_cache, k_scale) && cache_moderate(v_cache, v_scale) && modifiers.moderate &&
      (std::isnan(a.scale) || std::fabs(a.scale) <= 1e6f) &&
      std::all_of(rotary_cos.begin(), rotary_cos.end(), [](float x) { return std::fabs(x) <= 2.0f; }) &&
      std::all_of(rotary_sin.begin(), rotary_sin.end(), [](float x) { return std::fabs(x) <= 2.0f; });

  const std::vector<int32_t> seqlens_before = seqlens, table_before = table, counts_before = counts,
                             leftpad_before = leftpad, batch_idx_before = batch_idx;
  const std::vector<float> cos_before = rotary_cos, sin_before = rotary_sin;
  const std::vector<unsigned char> k_cache_before = k_cache.bytes, v_cache_before = v_cache.bytes,
                                   q_before = q.bytes, o_before = o.bytes, lse_before = lse.bytes,
                                   k_new_before = k_new.bytes, v_new_before = v_new.bytes,
                                   k_scale_before = k_scale.bytes, v_scale_before = v_scale.bytes,
                                   slopes_before = modifiers.slopes.bytes, sinks_before = modifiers.sinks.bytes;
  current = &a;
  bool threw = false;
  try {
    if (append_only) tileattn::kv_cache_append(a);
    else tileattn::attention_with_kvcache(a);
  } catch (const tileattn::Error&) {
    threw = true;
  } catch (const tileattn::NotSupported&) {
    threw = true;
  }

  if (q.bytes != q_before) fail("q was written");
  if (k_new.bytes != k_new_before || v_new.bytes != v_new_before) fail("k_new or v_new was written");
  if (table != table_before || counts != counts_before) fail("block_table or new_counts was written");
  if (!same_bits(rotary_cos, cos_before) || !same_bits(rotary_sin, sin_before)) fail("a rotary table was written");
  if (modifiers.slopes.bytes != slopes_before || modifiers.sinks.bytes != sinks_before)
    fail("alibi_slopes or sinks was written");
  if (leftpad != leftpad_before || batch_idx != batch_idx_before) fail("cache_leftpad or cache_batch_idx was written");
  if (threw) {
    if (seqlens != seqlens_before) fail("cache_seqlens changed although the call threw");
    if (k_cache.bytes != k_cache_before || v_cache.bytes != v_cache_before)
      fail("the cache changed although the call threw");
    if (k_scale.bytes != k_scale_before || v_scale.bytes != v_scale_before)
      fail("a scale changed although the call threw");
    if (o.bytes != o_before || lse.bytes != lse_before) fail("o or lse written although the call threw");
    return 0;
  }

  // The same bits on every hardware thread (the float64 reference runs on
  // one): the call again from the state before it. The checks below then
  // look at the rerun's result, which equals the first's.
  if (a.isa != tileattn::Isa::reference) {
    const std::vector<int32_t> seqlens_first = seqlens;
    const std::vector<unsigned char> k_cache_first = k_cache.bytes, v_cache_first = v_cache.bytes,
                                     k_scale_first = k_scale.bytes, v_scale_first = v_scale.bytes,
                                     o_first = o.bytes, lse_first = lse.bytes;
    // Copied in place: the arguments point into these buffers.
    std::copy(seqlens_before.begin(), seqlens_before.end(), seqlens.begin());
    std::copy(k_cache_before.begin(), k_cache_before.end(), k_cache.bytes.begin());
    std::copy(v_cache_before.begin(), v_cache_before.end(), v_cache.bytes.begin());
    std::copy(k_scale_before.begin(), k_scale_before.end(), k_scale.bytes.begin());
    std::copy(v_scale_before.begin(), v_scale_before.end(), v_scale.bytes.begin());
    std::copy(o_before.begin(), o_before.end(), o.bytes.begin());
    std::copy(lse_before.begin(), lse_before.end(), lse.bytes.begin());
    KvCacheArgs rerun = a;
    rerun.threads = kRerunThreads;
    bool spread = false;
    try {
      spread = run_on_every_thread([&] {
        if (append_only) tileattn::kv_cache_append(rerun);
        else tileattn::attention_with_kvcache(rerun);
      });
    } catch (...) {
      fail("the rerun on every thread threw");
    }
    if (!spread) fail("the rerun ran on fewer threads than it had items for");
    if (seqlens != seqlens_first || k_cache.bytes != k_cache_first || v_cache.bytes != v_cache_first ||
        k_scale.bytes != k_scale_first || v_scale.bytes != v_scale_first)
      fail("another thread count left other cache bits");
    if (o.bytes != o_first || lse.bytes != lse_first) fail("another thread count gave other o / lse bits");
  }

  // Accepted: nothing that had to be refused.
  const bool has_batch = a.batch > 0;
  const bool has_queries = !append_only && nonempty(q_sizes, 4);
  const bool has_new = has_batch && a.seqlen_new > 0 && nonempty(new_sizes, 4);
  bool appends = false;  // some sequence receives rows
  for (int64_t b = 0; b < batch && a.seqlen_new > 0; ++b) appends |= !a.new_counts || counts[size_t(b)] > 0;
  if (has_batch && (k_cache.overflow || v_cache.overflow)) fail("an overflowing cache view was accepted");
  if (has_queries && (q.overflow || o.overflow)) fail("an overflowing q or o view was accepted");
  if (has_new && (k_new.overflow || v_new.overflow)) fail("an overflowing k_new or v_new view was accepted");
  const bool cache_nonempty = nonempty(cache_sizes, 4);
  if (o_on_cache && has_queries && cache_nonempty) fail("o placed on k_cache was accepted");
  if (k_new_on_cache && has_new && cache_nonempty) fail("k_new placed on k_cache was accepted");
  // A call that appends nothing reads the caches as given (MLA's V inside its K rows).
  if (v_cache_on_k && has_batch && appends && cache_nonempty) fail("v_cache placed on k_cache was accepted for an append");
  if (q_on_cache && has_queries && appends && cache_nonempty) fail("q placed on k_cache was accepted for an append");
  if (o_on_cache || k_new_on_cache || v_cache_on_k || q_on_cache) return 0;  // harmless (empty or read-only) placements
  // Scales (a call with an empty batch does nothing and checks no cache
  // argument): none may come with an unquantized cache; a quantized one
  // needs both, int8 ones in views that fit int64 and do not share bytes.
  if (has_batch && !quantized && (a.k_scale || a.v_scale)) fail("scales given for an unquantized cache were accepted");
  if (has_batch && quantized && (!a.k_scale || !a.v_scale)) fail("a quantized cache without a scale array was accepted");
  if (has_batch && int8 &&
      ((a.k_scale == k_scale.data() && k_scale.overflow) || (a.v_scale == v_scale.data() && v_scale.overflow)))
    fail("an overflowing scale view was accepted");
  if (has_batch && int8 && appends && a.v_scale == a.k_scale && cache_sizes[0] > 0 && cache_sizes[1] > 0 &&
      cache_sizes[2] > 0)
    fail("one int8 scale array for K and V was accepted for an append");

  // cache_seqlens advanced by the rows appended; the cache changed only there.
  std::vector<unsigned char> k_written(k_cache.bytes.size(), 0), v_written(v_cache.bytes.size(), 0);
  std::vector<unsigned char> k_scale_written(k_scale.bytes.size(), 0), v_scale_written(v_scale.bytes.size(), 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t count = a.seqlen_new <= 0 ? 0 : a.new_counts ? counts[size_t(b)] : a.seqlen_new;
    if (int64_t(seqlens[size_t(b)]) != int64_t(seqlens_before[size_t(b)]) + count)
      fail("cache_seqlens did not advance by the appended count");
    for (int64_t h = 0; h < a.kv_heads; ++h)
      for (int64_t t = 0; t < count; ++t) {
        const int64_t position = seqlens_before[size_t(b)] + t;
        int64_t outer = a.cache_batch_idx ? a.cache_batch_idx[b] : b, row = position;
        if (paged) {
          outer = table[size_t(b * a.block_table_stride + position / a.page_size)];
          row = position % a.page_size;
        }
        // A quantized cache's appended rows hold quantized values (tested
        // against the quantization in tests/inference): only where is checked.
        for (int64_t d = 0; d < a.head_dim; ++d) {
          const int64_t kat = element_at(k_cache, a.k_cache.stride, cache_esize, outer, h, row, d);
          const int64_t src_k = element_at(k_new, a.k_new.stride, esize, b, h, t, d);
          if (!rotary && !quantized &&
              std::memcmp(&k_cache.bytes[size_t(kat)], &k_new.bytes[size_t(src_k)], size_t(esize)) != 0)
            fail("an appended key row differs from k_new");
          std::fill_n(&k_written[size_t(kat)], cache_esize, 1);
        }
        for (int64_t d = 0; d < v_dim; ++d) {
          const int64_t vat = element_at(v_cache, a.v_cache.stride, cache_esize, outer, h, row, d);
          const int64_t src_v = element_at(v_new, a.v_new.stride, esize, b, h, t, d);
          if (!quantized &&
              std::memcmp(&v_cache.bytes[size_t(vat)], &v_new.bytes[size_t(src_v)], size_t(esize)) != 0)
            fail("an appended value row differs from v_new");
          std::fill_n(&v_written[size_t(vat)], cache_esize, 1);
        }
        if (int8) {
          const auto scale_at = [&](const ViewBuffer& s, const std::array<int64_t, 3>& st) {
            return size_t(s.origin + (outer * st[0] + h * st[1] + row * st[2]) * 4);
          };
          std::fill_n(&k_scale_written[scale_at(k_scale, a.k_scale_stride)], 4, 1);
          std::fill_n(&v_scale_written[scale_at(v_scale, a.v_scale_stride)], 4, 1);
        }
      }
  }
  for (size_t i = 0; i < k_cache.bytes.size(); ++i)
    if (!k_written[i] && k_cache.bytes[i] != k_cache_before[i]) fail("k_cache changed outside the appended rows");
  for (size_t i = 0; i < v_cache.bytes.size(); ++i)
    if (!v_written[i] && v_cache.bytes[i] != v_cache_before[i]) fail("v_cache changed outside the appended rows");
  for (size_t i = 0; i < k_scale.bytes.size(); ++i)
    if (!k_scale_written[i] && k_scale.bytes[i] != k_scale_before[i]) fail("k_scale changed outside the appended rows");
  for (size_t i = 0; i < v_scale.bytes.size(); ++i)
    if (!v_scale_written[i] && v_scale.bytes[i] != v_scale_before[i]) fail("v_scale changed outside the appended rows");

  if (append_only) {
    if (o.bytes != o_before || lse.bytes != lse_before) fail("kv_cache_append wrote o or lse");
    return 0;
  }
  // o and lse: written only inside their views; o finite for moderate inputs.
  if (written_outside(o, o_sizes, a.o.stride.data(), 4, esize)) fail("o written outside its view");
  if (!o.overflow && inputs_moderate && !moderate(o, a.dtype, 1e4f)) fail("o is not finite although every input is");
  if (written_outside(lse, lse_sizes, a.lse_stride.data(), 3, 4)) fail("lse written outside its view");
  return 0;
}
