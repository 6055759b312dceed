// Every check a KV-cache call makes before it writes anything.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/validate.hpp"
#include "inference/kv_plan.hpp"

namespace tileattn::detail {

namespace {

[[noreturn]] void fail(const std::string& message) { throw Error(message); }
std::string str(int64_t v) { return std::to_string(v); }

bool paged(const KvCacheArgs& a) { return a.block_table != nullptr; }

// Sequences the contiguous cache holds: cache_batch with cache_batch_idx (0: batch), else batch.
int64_t cache_rows(const KvCacheArgs& a) { return a.cache_batch_idx && a.cache_batch != 0 ? a.cache_batch : a.batch; }

// tokens >= 0, page_size >= 1; no tokens + page_size - 1, which overflows
// for page sizes near INT64_MAX.
int64_t pages_for(int64_t tokens, int64_t page_size) { return tokens == 0 ? 0 : (tokens - 1) / page_size + 1; }

// Sizes of the K cache view in [outer, head, row, dim] order.
std::array<int64_t, 4> cache_sizes_of(const KvCacheArgs& a) {
  if (paged(a)) return {a.num_pages, a.kv_heads, a.page_size, a.head_dim};
  return {cache_rows(a), a.kv_heads, a.capacity, a.head_dim};
}
// The V cache's: V's head dim in place of head_dim.
std::array<int64_t, 4> v_cache_sizes_of(const KvCacheArgs& a) {
  std::array<int64_t, 4> sizes = cache_sizes_of(a);
  sizes[3] = value_head_dim(a);
  return sizes;
}

// cache_batch_idx / cache_leftpad: contiguous caches only; every index in
// range, every pad within its sequence.
void check_batch_index_and_leftpad(const KvCacheArgs& a) {
  if (!a.cache_batch_idx && !a.cache_leftpad) return;
  if (paged(a))
    throw NotSupported(std::string(a.cache_batch_idx ? "cache_batch_idx" : "cache_leftpad") +
                       ": not supported with block_table (paged caches), as in FlashAttention-2");
  if (a.cache_batch < 0) fail("cache_batch must be >= 0, got " + str(a.cache_batch));
  for (int64_t b = 0; b < a.batch; ++b) {
    if (a.cache_batch_idx) {
      const int64_t row = a.cache_batch_idx[b];
      if (row < 0 || row >= cache_rows(a))
        fail("cache_batch_idx[" + str(b) + "] = " + str(row) + " is out of range 0.." + str(cache_rows(a) - 1) +
             " (the cache holds " + str(cache_rows(a)) + " sequences)");
    }
    if (a.cache_leftpad) {
      const int64_t pad = a.cache_leftpad[b];
      if (pad < 0 || pad > a.cache_seqlens[b])
        fail("cache_leftpad[" + str(b) + "] = " + str(pad) + " must be in 0..cache_seqlens[" + str(b) + "] (" +
             str(a.cache_seqlens[b]) + ")");
    }
  }
}

// Appending: two sequences writing one cache row would race (FlashAttention-2
// leaves the winner unspecified); refused before anything is written.
void check_distinct_written_rows(const KvCacheArgs& a, const AppendPlan& plan) {
  if (!a.cache_batch_idx) return;
  std::vector<std::pair<int32_t, int64_t>> written;  // (cache row, sequence)
  for (int64_t b = 0; b < a.batch; ++b)
    if (plan.counts[size_t(b)] > 0) written.emplace_back(a.cache_batch_idx[b], b);
  std::sort(written.begin(), written.end());
  for (size_t i = 1; i < written.size(); ++i)
    if (written[i].first == written[i - 1].first)
      fail("cache_batch_idx: sequences " + str(written[i - 1].second) + " and " + str(written[i].second) +
           " both append to cache row " + str(written[i].first));
}

// Paged: the table entries covering `lengths` exist and name real pages.
void check_table_coverage(const KvCacheArgs& a, const std::vector<int32_t>& old_lengths,
                          const std::vector<int32_t>& lengths) {
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t needed = pages_for(lengths[size_t(b)], a.page_size);
    if (needed > a.block_table_stride) {
      const int64_t appended = lengths[size_t(b)] - old_lengths[size_t(b)];
      fail("block_table: sequence " + str(b) + " needs " + str(needed) + " pages of " +
           str(a.page_size) + " tokens for " + str(lengths[size_t(b)]) + " tokens" +
           (appended > 0 ? " (cache_seqlens[" + str(b) + "] = " + str(old_lengths[size_t(b)]) +
                               " plus " + str(appended) + " appended)"
                         : std::string()) +
           " but the table has " + str(a.block_table_stride) + " entries per sequence");
    }
    for (int64_t i = 0; i < needed; ++i) {
      const int64_t page = a.block_table[b * a.block_table_stride + i];
      if (page < 0 || page >= a.num_pages)
        fail("block_table[" + str(b) + ", " + str(i) + "] = " + str(page) +
             " is out of range 0.." + str(a.num_pages - 1) + " (num_pages = " + str(a.num_pages) + ")");
    }
  }
}

// Paged: a page that receives new rows must belong to one table entry only;
// otherwise the append would overwrite keys another sequence (or another
// position of the same sequence) reads. Shared read-only prefix pages are fine.
// Decode writes one page per sequence, so the written pages are few: sort
// them and look every used entry up, O(entries x log(written)).
void check_write_conflicts(const KvCacheArgs& a, const AppendPlan& plan,
                           const std::vector<int32_t>& old_lengths) {
  struct Entry {
    int64_t page, sequence, index;
  };
  std::vector<Entry> written;
  for (int64_t b = 0; b < a.batch; ++b) {
    if (plan.counts[size_t(b)] == 0) continue;
    const int64_t used = pages_for(plan.new_lengths[size_t(b)], a.page_size);
    for (int64_t i = old_lengths[size_t(b)] / a.page_size; i < used; ++i)
      written.push_back({a.block_table[b * a.block_table_stride + i], b, i});
  }
  std::sort(written.begin(), written.end(), [](const Entry& x, const Entry& y) { return x.page < y.page; });
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t used = pages_for(plan.new_lengths[size_t(b)], a.page_size);
    for (int64_t i = 0; i < used; ++i) {
      const int64_t page = a.block_table[b * a.block_table_stride + i];
      auto it = std::lower_bound(written.begin(), written.end(), page,
                                 [](const Entry& e, int64_t p) { return e.page < p; });
      for (; it != written.end() && it->page == page; ++it)
        if (it->sequence != b || it->index != i)
          fail("block_table: page " + str(page) + " receives new tokens of sequence " +
               str(it->sequence) + " (entry " + str(it->index) + ") but is also used by sequence " +
               str(b) + " (entry " + str(i) + ")");
    }
  }
}

// Names the first of `others` that `range` overlaps: "<what> <name><why>".
struct NamedRange {
  const char* name;
  ViewSpan range;
};
void fail_if_overlapping(const char* what, const ViewSpan& range, std::initializer_list<NamedRange> others,
                         const char* why = "") {
  for (const NamedRange& other : others)
    if (views_overlap(range, other.range)) fail(std::string(what) + " " + other.name + why);
}

int64_t storage_size(const KvCacheArgs& a) { return int64_t(dtype_size(kv_storage_dtype(a.dtype, a.kv_quant))); }

// The views of k_scale and v_scale (empty without quantization).
struct ScaleRanges {
  ViewSpan k, v;
};
ScaleRanges scale_ranges(const KvCacheArgs& a) {
  ScaleRanges r;
  if (a.kv_quant == KvQuant::none) return r;
  if (a.kv_quant == KvQuant::fp8_e4m3) {
    const int64_t sizes[1] = {a.kv_heads}, strides[1] = {1};
    r.k = view_range("k_scale", a.k_scale, 4, sizes, strides, 1);
    r.v = view_range("v_scale", a.v_scale, 4, sizes, strides, 1);
    return r;
  }
  const std::array<int64_t, 4> cache = cache_sizes_of(a);
  const int64_t sizes[3] = {cache[0], cache[1], cache[2]};
  r.k = view_range("k_scale", a.k_scale, 4, sizes, a.k_scale_stride.data(), 3);
  r.v = view_range("v_scale", a.v_scale, 4, sizes, a.v_scale_stride.data(), 3);
  return r;
}

// kv_quant, and the scales it needs: present, in range, fp8 scales finite
// and > 0; in a call that writes the cache (`writes`), int8 scales writable
// without overlapping each other or the cache, and fp8 scales apart from the
// cache (an append would change the scale it reads). Without quantization no
// scale may be given.
void check_scales(const KvCacheArgs& a, const ViewSpan& k_cache, const ViewSpan& v_cache, bool writes) {
  if (a.kv_quant == KvQuant::none) {
    if (a.k_scale) fail("k_scale: given, but kv_quant is none (the cache holds " + std::string(dtype_name(a.dtype)) + ")");
    if (a.v_scale) fail("v_scale: given, but kv_quant is none (the cache holds " + std::string(dtype_name(a.dtype)) + ")");
    return;
  }
  const std::string kind = kv_quant_name(a.kv_quant);
  if (!a.k_scale) fail("k_scale: data is null (the cache is " + kind + ")");
  if (!a.v_scale) fail("v_scale: data is null (the cache is " + kind + ")");
  const ScaleRanges r = scale_ranges(a);
  if (a.kv_quant == KvQuant::fp8_e4m3) {
    if (writes) {
      fail_if_overlapping("k_scale: overlaps", r.k, {{"k_cache", k_cache}, {"v_cache", v_cache}});
      fail_if_overlapping("v_scale: overlaps", r.v, {{"k_cache", k_cache}, {"v_cache", v_cache}});
    }
    for (int64_t h = 0; h < a.kv_heads; ++h) {
      if (!(a.k_scale[h] > 0.0f) || !std::isfinite(a.k_scale[h]))
        fail("k_scale[" + str(h) + "] must be finite and > 0, got " + std::to_string(a.k_scale[h]));
      if (!(a.v_scale[h] > 0.0f) || !std::isfinite(a.v_scale[h]))
        fail("v_scale[" + str(h) + "] must be finite and > 0, got " + std::to_string(a.v_scale[h]));
    }
    return;
  }
  if (!writes) return;
  const std::array<int64_t, 4> cache = cache_sizes_of(a);
  const int64_t sizes[3] = {cache[0], cache[1], cache[2]};
  check_injective("k_scale", sizes, a.k_scale_stride.data(), 3);
  check_injective("v_scale", sizes, a.v_scale_stride.data(), 3);
  fail_if_overlapping("k_scale: overlaps", r.k, {{"k_cache", k_cache}, {"v_cache", v_cache}, {"v_scale", r.v}});
  fail_if_overlapping("v_scale: overlaps", r.v, {{"k_cache", k_cache}, {"v_cache", v_cache}});
}

void check_new_rows(const KvCacheArgs& a, const ViewSpan& k_cache, const ViewSpan& v_cache) {
  const int64_t esize = int64_t(dtype_size(a.dtype));
  const int64_t sizes[4] = {a.batch, a.kv_heads, a.seqlen_new, a.head_dim};
  const int64_t v_sizes[4] = {a.batch, a.kv_heads, a.seqlen_new, value_head_dim(a)};
  if (!a.k_new.data) fail("k_new: data is null (seqlen_new = " + str(a.seqlen_new) + ")");
  if (!a.v_new.data) fail("v_new: data is null (seqlen_new = " + str(a.seqlen_new) + ")");
  const ViewSpan k = view_range("k_new", a.k_new.data, esize, sizes, a.k_new.stride.data(), 4);
  const ViewSpan v = view_range("v_new", a.v_new.data, esize, v_sizes, a.v_new.stride.data(), 4);
  const ScaleRanges scales = scale_ranges(a);
  fail_if_overlapping("k_new: overlaps", k,
                      {{"k_cache", k_cache}, {"v_cache", v_cache}, {"k_scale", scales.k}, {"v_scale", scales.v}});
  fail_if_overlapping("v_new: overlaps", v,
                      {{"k_cache", k_cache}, {"v_cache", v_cache}, {"k_scale", scales.k}, {"v_scale", scales.v}});
}

// What an appending call reads besides the new rows (read while rows are
// written, or after) and cache_seqlens (which it advances): none may lie in
// the cache or in the int8 scales the append writes. `attends`: the call
// also reads the attention's sinks and ALiBi slopes. Rotary tables checked
// already (check_rotary_tables).
void check_apart_from_the_writes(const KvCacheArgs& a, const ViewSpan& k_cache, const ViewSpan& v_cache,
                                 bool attends) {
  ScaleRanges scales = scale_ranges(a);
  if (a.kv_quant != KvQuant::int8) scales = {};  // fp8 scales are only read
  const auto check = [&](const char* name, const void* data, int64_t rows, int64_t row_stride, int64_t count,
                         int64_t element_size) {
    if (!data || rows <= 0 || count <= 0) return;
    const int64_t sizes[2] = {rows, count}, strides[2] = {row_stride, 1};
    const ViewSpan range = view_range(name, data, element_size, sizes, strides, 2);
    const std::string what = std::string(name) + ": overlaps";
    fail_if_overlapping(what.c_str(), range,
                        {{"k_cache", k_cache}, {"v_cache", v_cache}, {"k_scale", scales.k}, {"v_scale", scales.v}},
                        ", which this call writes");
  };
  check("cache_seqlens", a.cache_seqlens, 1, 0, a.batch, 4);
  check("new_counts", a.new_counts, 1, 0, a.batch, 4);
  check("cache_batch_idx", a.cache_batch_idx, 1, 0, a.batch, 4);
  check("cache_leftpad", a.cache_leftpad, 1, 0, a.batch, 4);
  if (paged(a)) check("block_table", a.block_table, a.batch, a.block_table_stride, a.block_table_stride, 4);
  check("rotary_cos", a.rotary_cos, a.rotary_positions, a.rotary_dim / 2, a.rotary_dim / 2, 4);
  check("rotary_sin", a.rotary_sin, a.rotary_positions, a.rotary_dim / 2, a.rotary_dim / 2, 4);
  if (!attends) return;
  check("sinks", a.sinks, 1, 0, a.heads, 4);
  check("alibi_slopes", a.alibi_slopes, a.alibi_batch_stride > 0 ? a.batch : 1, a.alibi_batch_stride, a.heads, 4);
}

// Whether the call rotates (tables given), after checking the tables; a
// rotary size without tables would silently rotate nothing.
bool check_rotary_tables(const KvCacheArgs& a) {
  if (!a.rotary_cos && !a.rotary_sin) {
    if (a.rotary_dim != 0 || a.rotary_positions != 0)
      fail("rotary_dim / rotary_positions: set (" + str(a.rotary_dim) + ", " + str(a.rotary_positions) +
           ") without rotary_cos and rotary_sin");
    return false;
  }
  if ((a.rotary_cos == nullptr) != (a.rotary_sin == nullptr))
    fail("rotary_cos and rotary_sin must be given together");
  if (a.rotary_dim < 2 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim)
    fail("rotary_dim must be even and in 2..head_dim (" + str(a.head_dim) + "), got " +
         str(a.rotary_dim));
  if (a.rotary_positions < 0) fail("rotary_positions must be >= 0, got " + str(a.rotary_positions));
  const int64_t sizes[2] = {a.rotary_positions, a.rotary_dim / 2};
  const int64_t strides[2] = {a.rotary_dim / 2, 1};
  view_range("rotary_cos", a.rotary_cos, 4, sizes, strides, 2);
  view_range("rotary_sin", a.rotary_sin, 4, sizes, strides, 2);
  return true;
}

void check_rotary_position(const KvCacheArgs& a, const char* who, int64_t b, int64_t last) {
  if (last >= a.rotary_positions)
    fail(std::string("rotary_cos: ") + who + " of sequence " + str(b) + " reach position " +
         str(last) + " but the tables have " + str(a.rotary_positions) + " rows");
}

}  // namespace

void validate_cache(const KvCacheArgs& a, bool writes) {
  if (a.batch < 0) fail("batch must be >= 0, got " + str(a.batch));
  if (a.kv_heads < 1) fail("kv_heads must be >= 1, got " + str(a.kv_heads));
  validate_head_dims(a.head_dim, a.v_head_dim);
  if (!is_activation_dtype(a.dtype))
    fail("dtype: expected fp32, fp16 or bf16 (a quantized cache sets kv_quant)");
  if (a.kv_quant != KvQuant::none && a.kv_quant != KvQuant::int8 && a.kv_quant != KvQuant::fp8_e4m3)
    fail("kv_quant: expected none, int8 or fp8_e4m3");
  if (a.batch == 0) return;
  if (!a.cache_seqlens) fail("cache_seqlens: data is null");
  if (paged(a)) {
    if (a.page_size < 1) fail("page_size must be >= 1, got " + str(a.page_size));
    if (a.num_pages < 0) fail("num_pages must be >= 0, got " + str(a.num_pages));
    if (a.block_table_stride < 0) fail("block_table_stride must be >= 0, got " + str(a.block_table_stride));
  } else if (a.capacity < 0) {
    fail("capacity must be >= 0, got " + str(a.capacity));
  }
  std::vector<int32_t> lengths(size_t(a.batch));
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t n = a.cache_seqlens[b];
    if (n < 0) fail("cache_seqlens[" + str(b) + "] must be >= 0, got " + str(n));
    if (!paged(a) && n > a.capacity)
      fail("cache_seqlens[" + str(b) + "] = " + str(n) + " exceeds the cache capacity (" +
           str(a.capacity) + ")");
    lengths[size_t(b)] = int32_t(n);
  }
  if (paged(a)) check_table_coverage(a, lengths, lengths);
  check_batch_index_and_leftpad(a);

  const std::array<int64_t, 4> sizes = cache_sizes_of(a), v_sizes = v_cache_sizes_of(a);
  const int64_t esize = storage_size(a);
  const bool has_rows = sizes[0] > 0 && sizes[2] > 0;
  if (has_rows && !a.k_cache.data) fail("k_cache: data is null");
  if (has_rows && !a.v_cache.data) fail("v_cache: data is null");
  const ViewSpan k = view_range("k_cache", a.k_cache.data, esize, sizes.data(), a.k_cache.stride.data(), 4);
  const ViewSpan v = view_range("v_cache", a.v_cache.data, esize, v_sizes.data(), a.v_cache.stride.data(), 4);
  // Views that repeat or share elements are read as given (a broadcast
  // cache, MLA's V as the first dims of its K); only a write needs each
  // element once.
  if (writes) {
    check_injective("k_cache", sizes.data(), a.k_cache.stride.data(), 4);
    check_injective("v_cache", v_sizes.data(), a.v_cache.stride.data(), 4);
    if (views_overlap(k, v)) fail("v_cache: overlaps k_cache");
  }
  check_scales(a, k, v, writes);
}

AppendPlan validate_append(const KvCacheArgs& a, bool attends) {
  if (a.seqlen_new < 0) fail("seqlen_new must be >= 0, got " + str(a.seqlen_new));
  // Whether a row is written: new_counts of 0 everywhere append nothing.
  bool writes = a.batch > 0 && a.seqlen_new > 0;
  if (writes && a.new_counts) writes = std::any_of(a.new_counts, a.new_counts + a.batch, [](int32_t n) { return n > 0; });
  validate_cache(a, writes);
  AppendPlan plan;
  plan.counts.assign(size_t(a.batch), 0);
  plan.new_lengths.assign(a.cache_seqlens, a.cache_seqlens + a.batch);
  if (a.batch == 0 || a.seqlen_new == 0) return plan;

  const std::vector<int32_t> old_lengths = plan.new_lengths;
  for (int64_t b = 0; b < a.batch; ++b) {
    int64_t count = a.seqlen_new;
    if (a.new_counts) {
      count = a.new_counts[b];
      if (count < 0 || count > a.seqlen_new)
        fail("new_counts[" + str(b) + "] must be in 0..seqlen_new (" + str(a.seqlen_new) +
             "), got " + str(count));
    }
    const int64_t old_length = old_lengths[size_t(b)];
    // Compared before adding: seqlen_new may be near INT64_MAX.
    if (count > std::numeric_limits<int32_t>::max() - old_length)
      fail("cache_seqlens[" + str(b) + "]: appending " + str(count) + " tokens overflows int32");
    const int64_t new_length = old_length + count;
    if (!paged(a) && new_length > a.capacity)
      fail("k_new: appending " + str(count) + " tokens to sequence " + str(b) + " (cache_seqlens[" +
           str(b) + "] = " + str(old_length) + ") overflows the cache capacity (" +
           str(a.capacity) + ")");
    plan.counts[size_t(b)] = int32_t(count);
    plan.new_lengths[size_t(b)] = int32_t(new_length);
  }
  if (paged(a)) {
    check_table_coverage(a, old_lengths, plan.new_lengths);
    check_write_conflicts(a, plan, old_lengths);
  }
  check_distinct_written_rows(a, plan);

  const std::array<int64_t, 4> sizes = cache_sizes_of(a), v_sizes = v_cache_sizes_of(a);
  const int64_t cache_esize = storage_size(a);
  const ViewSpan k = view_range("k_cache", a.k_cache.data, cache_esize, sizes.data(), a.k_cache.stride.data(), 4);
  const ViewSpan v = view_range("v_cache", a.v_cache.data, cache_esize, v_sizes.data(), a.v_cache.stride.data(), 4);
  check_new_rows(a, k, v);
  const bool rotates = check_rotary_tables(a);
  if (writes) check_apart_from_the_writes(a, k, v, attends);

  if (rotates) {
    for (int64_t b = 0; b < a.batch; ++b)
      if (plan.counts[size_t(b)] > 0)
        check_rotary_position(a, "new keys", b, int64_t(plan.new_lengths[size_t(b)]) - 1);
  }
  return plan;
}

void validate_apart_from_cache(const KvCacheArgs& a, const AppendPlan& plan) {
  if (a.batch <= 0 || a.heads <= 0 || a.seqlen_q <= 0 || a.head_dim <= 0) return;
  if (!a.q.data || !a.o.data) return;  // the forward's validation, next, names them
  const std::array<int64_t, 4> sizes = cache_sizes_of(a), v_sizes = v_cache_sizes_of(a);
  const int64_t esize = int64_t(dtype_size(a.dtype));
  const int64_t cache_esize = storage_size(a);
  const ViewSpan k = view_range("k_cache", a.k_cache.data, cache_esize, sizes.data(), a.k_cache.stride.data(), 4);
  const ViewSpan v = view_range("v_cache", a.v_cache.data, cache_esize, v_sizes.data(), a.v_cache.stride.data(), 4);
  const ScaleRanges scales = scale_ranges(a);
  const int64_t q_sizes[4] = {a.batch, a.heads, a.seqlen_q, a.head_dim};
  const int64_t o_sizes[4] = {a.batch, a.heads, a.seqlen_q, value_head_dim(a)};
  const ViewSpan o = view_range("o", a.o.data, int64_t(dtype_size(output_dtype(a))), o_sizes, a.o.stride.data(), 4);
  fail_if_overlapping("o: output overlaps input", o,
                      {{"k_cache", k}, {"v_cache", v}, {"k_scale", scales.k}, {"v_scale", scales.v}});
  // lse, when asked for: its range, computed once for both checks below.
  const int64_t l_sizes[3] = {a.batch, a.heads, a.seqlen_q};
  const ViewSpan lse = a.lse ? view_range("lse", a.lse, 4, l_sizes, a.lse_stride.data(), 3) : ViewSpan{};
  if (a.lse)
    fail_if_overlapping("lse: output overlaps input", lse,
                        {{"k_cache", k}, {"v_cache", v}, {"k_scale", scales.k}, {"v_scale", scales.v}});
  // cache_seqlens: read by the call and written at its end, after O and LSE
  // (the forward sees the new lengths in a copy, so its check of o against
  // the index arrays does not cover this one).
  const int64_t seqlens_sizes[1] = {a.batch}, unit_stride[1] = {1};
  const ViewSpan seqlens = view_range("cache_seqlens", a.cache_seqlens, 4, seqlens_sizes, unit_stride, 1);
  fail_if_overlapping("o: output overlaps", o, {{"cache_seqlens", seqlens}}, ", which this call also writes");
  if (a.lse)
    fail_if_overlapping("lse: output overlaps", lse, {{"cache_seqlens", seqlens}}, ", which this call also writes");
  const bool appends = std::any_of(plan.counts.begin(), plan.counts.end(), [](int32_t n) { return n > 0; });
  const ViewSpan q = view_range("q", a.q.data, esize, q_sizes, a.q.stride.data(), 4);
  if (appends)
    fail_if_overlapping("q: overlaps", q, {{"k_cache", k}, {"v_cache", v}, {"k_scale", scales.k}, {"v_scale", scales.v}},
                        ", which this call appends to");
  // The new keys and values are inputs too: o and lse must not alias them
  // (the append happens to read them before O is written, but the contract
  // is that no output aliases an input).
  if (a.seqlen_new > 0 && a.k_new.data && a.v_new.data) {
    const int64_t new_sizes[4] = {a.batch, a.kv_heads, a.seqlen_new, a.head_dim};
    const int64_t v_new_sizes[4] = {a.batch, a.kv_heads, a.seqlen_new, value_head_dim(a)};
    const ViewSpan k_new = view_range("k_new", a.k_new.data, esize, new_sizes, a.k_new.stride.data(), 4);
    const ViewSpan v_new = view_range("v_new", a.v_new.data, esize, v_new_sizes, a.v_new.stride.data(), 4);
    fail_if_overlapping("o: output overlaps input", o, {{"k_new", k_new}, {"v_new", v_new}});
    if (a.lse) fail_if_overlapping("lse: output overlaps input", lse, {{"k_new", k_new}, {"v_new", v_new}});
  }
}

void validate_query_rotary(const KvCacheArgs& a, const std::vector<int32_t>& lengths) {
  if (!check_rotary_tables(a) || a.seqlen_q == 0) return;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t first = rotary_query_position(a, a.cache_seqlens[b], lengths[size_t(b)], 0);
    const int64_t last = rotary_query_position(a, a.cache_seqlens[b], lengths[size_t(b)], a.seqlen_q - 1);
    if (first < 0)
      fail("q: with rotary tables, the " + str(a.seqlen_q) + " queries of sequence " + str(b) +
           " need positions " + str(first) + ".." + str(last) +
           "; a query position must be >= 0 (sequence length " + str(lengths[size_t(b)]) + ")");
    check_rotary_position(a, "queries", b, last);
  }
}

}  // namespace tileattn::detail
