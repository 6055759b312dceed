// One validation layer for the forward call: every pointer, size, stride and
// option is checked before anything is allocated or written. Errors name the
// argument and what was expected.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "core/problem.hpp"
#include "core/validate.hpp"

namespace tileattn::detail {

namespace {

[[noreturn]] void fail(const std::string& message) { throw Error(message); }

std::string str(int64_t v) { return std::to_string(v); }

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(std::string(what) + ": size overflows int64");
  return r;
}
int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(std::string(what) + ": size overflows int64");
  return r;
}

}  // namespace

ViewSpan view_range(const char* name, const void* data, int64_t element_size,
                    const int64_t* sizes, const int64_t* strides, int rank) {
  if (rank < 0 || rank > ViewSpan::kMaxRank) fail(std::string(name) + ": rank above " + str(ViewSpan::kMaxRank));
  int64_t lo = 0, hi = 0;  // element offsets relative to data
  for (int i = 0; i < rank; ++i) {
    if (sizes[i] < 0) fail(std::string(name) + ": negative size");
    if (sizes[i] == 0) return ViewSpan{};  // empty view: nothing is touched
  }
  for (int i = 0; i < rank; ++i) {
    const int64_t span = checked_mul(sizes[i] - 1, strides[i], name);
    if (span < 0) lo = checked_add(lo, span, name);
    else hi = checked_add(hi, span, name);
  }
  ViewSpan r;
  r.lo = checked_mul(lo, element_size, name);
  r.hi = checked_add(checked_mul(hi, element_size, name), element_size, name);
  const auto base = reinterpret_cast<uintptr_t>(data);
  // Byte addresses must stay inside the address space.
  // (unsigned negation: r.lo may be INT64_MIN, whose signed negation overflows)
  if (r.lo < 0 && uintptr_t(0) - uintptr_t(r.lo) > base) fail(std::string(name) + ": strides reach below address 0");
  // Addresses are compared as int64 below: base + hi must stay below 2^63.
  if (uintptr_t(r.hi) > uintptr_t(INT64_MAX) - base)
    fail(std::string(name) + ": strides overflow the address space");
  // The element at index 0 sits at base; lo and hi become addresses (fits:
  // user-space addresses < 2^63).
  r.element_size = element_size;
  r.rank = rank;
  for (int i = 0; i < rank; ++i) {
    r.sizes[i] = sizes[i];
    r.strides[i] = strides[i];
  }
  r.lo = int64_t(base) + r.lo;
  r.hi = int64_t(base) + r.hi;
  r.empty = false;
  r.origin = int64_t(base);
  return r;
}

namespace {

// One dimension of the search: index differences k in [k_lo, k_hi] times a
// step in bytes (> 0).
struct Term {
  __int128 step, k_lo, k_hi;
};

__int128 floor_div(__int128 x, __int128 y) { return x / y - ((x % y != 0) && ((x < 0) != (y < 0))); }

// Whether some k, terms[l].k_lo <= k[l] <= terms[l].k_hi, has sum_l k[l] *
// terms[l].step in [lo, hi]; terms from `level` on, in descending steps
// (least[l], most[l]: the smallest and largest sums the terms past l make).
// Gives up (true: assume an overlap) past `budget` nodes.
bool reachable(const Term* terms, const __int128* least, const __int128* most, int count, int level, __int128 lo,
               __int128 hi, int& budget) {
  if (--budget < 0) return true;
  if (level == count) return lo <= 0 && 0 <= hi;
  const Term& t = terms[level];
  // k such that k step + (the rest) can land in [lo, hi].
  const __int128 k_lo = std::max(t.k_lo, -floor_div(-(lo - most[level]), t.step));
  const __int128 k_hi = std::min(t.k_hi, floor_div(hi - least[level], t.step));
  for (__int128 k = k_lo; k <= k_hi; ++k)
    if (reachable(terms, least, most, count, level + 1, lo - k * t.step, hi - k * t.step, budget)) return true;
  return false;
}

}  // namespace

bool views_overlap(const ViewSpan& a, const ViewSpan& b) {
  if (a.empty || b.empty || a.hi <= b.lo || b.hi <= a.lo) return false;
  // Element i of a covers bytes [A + x, A + x + e_a), x = sum_d i[d] stride_a[d] e_a; element j of b
  // [B + y, B + y + e_b). They share a byte iff x - y lies in [B - A - e_a + 1, B - A + e_b - 1]:
  // a sum of terms, a's dims with k in [0, size - 1] and b's with k in [-(size - 1), 0], one term
  // per step (equal steps, as in views of one buffer, merge into one wider range).
  Term terms[2 * ViewSpan::kMaxRank];
  int count = 0;
  const auto add = [&](const ViewSpan& v, bool minus) {
    for (int d = 0; d < v.rank; ++d) {
      if (v.sizes[d] <= 1 || v.strides[d] == 0) continue;
      __int128 step = __int128(v.strides[d]) * v.element_size, k_lo = 0, k_hi = v.sizes[d] - 1;
      if (minus) k_lo = -k_hi, k_hi = 0;
      if (step < 0) step = -step, std::swap(k_lo, k_hi), k_lo = -k_lo, k_hi = -k_hi;
      int t = 0;
      while (t < count && terms[t].step != step) ++t;
      if (t == count) terms[count++] = Term{step, 0, 0};
      terms[t].k_lo += k_lo;
      terms[t].k_hi += k_hi;
    }
  };
  add(a, false);
  add(b, true);
  for (int i = 0; i < count; ++i)  // descending steps: few candidates per level for nested strides
    for (int j = i + 1; j < count; ++j)
      if (terms[j].step > terms[i].step) std::swap(terms[i], terms[j]);
  __int128 least[2 * ViewSpan::kMaxRank + 1], most[2 * ViewSpan::kMaxRank + 1];
  least[count] = most[count] = 0;
  for (int l = count - 1; l >= 0; --l) {
    least[l] = least[l + 1] + terms[l].k_lo * terms[l].step;
    most[l] = most[l + 1] + terms[l].k_hi * terms[l].step;
  }
  for (int l = 0; l < count; ++l) least[l] = least[l + 1], most[l] = most[l + 1];  // what the terms after l make
  const __int128 delta = __int128(b.origin) - __int128(a.origin);
  int budget = 1 << 16;
  return reachable(terms, least, most, count, 0, delta - a.element_size + 1, delta + b.element_size - 1, budget);
}

void check_injective(const char* name, const int64_t* sizes, const int64_t* strides, int rank) {
  // An output written through these strides must never hit one element twice:
  // sorted by stride, each stride must step over everything the smaller ones span.
  // An empty tensor is written nowhere (dense_strides gives it zero strides).
  for (int i = 0; i < rank; ++i)
    if (sizes[i] == 0) return;
  int order[4] = {0, 1, 2, 3};
  for (int i = 0; i < rank; ++i)
    for (int j = i + 1; j < rank; ++j)
      if (strides[order[j]] < strides[order[i]]) std::swap(order[i], order[j]);
  int64_t reach = 0;  // largest offset reachable with the dims seen so far
  for (int i = 0; i < rank; ++i) {
    const int d = order[i];
    if (sizes[d] <= 1) continue;
    if (strides[d] <= 0)
      fail(std::string(name) + ": output strides must be positive (dimension " + str(d) +
           " has stride " + str(strides[d]) + ")");
    if (strides[d] <= reach)
      fail(std::string(name) + ": output strides overlap (dimension " + str(d) + " stride " +
           str(strides[d]) + " does not step over " + str(reach) + ")");
    reach = checked_add(reach, checked_mul(sizes[d] - 1, strides[d], name), name);
  }
}

void validate_head_dims(int64_t head_dim, int64_t v_head_dim) {
  if (head_dim < 1 || head_dim > kMaxHeadDim)
    fail("head_dim must be in 1.." + str(kMaxHeadDim) + ", got " + str(head_dim));
  if (v_head_dim < 0 || v_head_dim > kMaxValueHeadDim)
    fail("v_head_dim must be in 1.." + str(kMaxValueHeadDim) + " (0: head_dim), got " + str(v_head_dim));
  if (v_head_dim == 0 && head_dim > kMaxValueHeadDim)
    fail("v_head_dim: V's head dim is head_dim (" + str(head_dim) + ") when v_head_dim is 0, and must be in 1.." +
         str(kMaxValueHeadDim) + "; set v_head_dim");
}

void validate_cu_seqlens(const char* name, const int32_t* cu, int64_t batch, int64_t total_rows) {
  if (cu[0] < 0) fail(std::string(name) + "[0] must be >= 0, got " + str(cu[0]));
  for (int64_t b = 0; b < batch; ++b) {
    if (cu[b + 1] < cu[b])
      fail(std::string(name) + " must be non-decreasing: entry " + str(b + 1) + " (" +
           str(cu[b + 1]) + ") < entry " + str(b) + " (" + str(cu[b]) + ")");
  }
  if (cu[batch] > total_rows)
    fail(std::string(name) + "[" + str(batch) + "] = " + str(cu[batch]) +
         " exceeds the packed rows of the tensor (" + str(total_rows) + ")");
}

// The scales of a quantized K or V (KvSource): present, inside the address
// space for every (outer, head, row) of the cache's sizes; an fp8 cache's are
// one per KV head (strides {0, stride, 0}) and each finite and > 0 (int8
// scales are per token, written by the append like the cache's elements, and
// not read here: a NaN scale gives NaN scores like a NaN key).
static ViewSpan validate_kv_scales(const char* name, const ForwardArgs& a, const float* scales,
                             const std::array<int64_t, 3>& stride, const int64_t* kv_sizes) {
  if (!scales) fail(std::string(name) + ": data is null (the cache is " + kv_quant_name(a.kv.quant) + ")");
  const int64_t sizes[3] = {kv_sizes[0], kv_sizes[1], kv_sizes[2]};
  const ViewSpan range = view_range(name, scales, 4, sizes, stride.data(), 3);
  if (a.kv.quant == KvQuant::fp8_e4m3) {
    if (stride[0] != 0 || stride[2] != 0)
      fail(std::string(name) + ": an fp8_e4m3 cache takes one scale per KV head (strides {0, s, 0}), got strides {" +
           str(stride[0]) + ", " + str(stride[1]) + ", " + str(stride[2]) + "}");
    for (int64_t h = 0; h < a.shape.kv_heads; ++h) {
      const float value = scales[h * stride[1]];
      if (!(value > 0.0f) || !std::isfinite(value))
        fail(std::string(name) + "[" + str(h) + "] must be finite and > 0, got " + std::to_string(value));
    }
  }
  return range;
}

ViewSpan alibi_slopes_view(const ForwardArgs& a) {
  const AttentionShape& s = a.shape;
  if (!a.alibi_slopes || s.batch <= 0 || s.heads <= 0) return {};
  const int64_t sizes[2] = {a.alibi_batch_stride > 0 ? s.batch : 1, s.heads};
  const int64_t strides[2] = {a.alibi_batch_stride, 1};
  return view_range("alibi_slopes", a.alibi_slopes, 4, sizes, strides, 2);
}

ViewSpan sinks_view(const ForwardArgs& a) {
  if (!a.sinks) return {};
  const int64_t sizes[1] = {a.shape.heads}, strides[1] = {1};
  return view_range("sinks", a.sinks, 4, sizes, strides, 1);
}

std::array<NamedView, 6> index_array_views(const ForwardArgs& a) {
  const int64_t batch = a.shape.batch;
  const auto list = [&](const char* name, const int32_t* data, int64_t count) {
    if (!data || batch <= 0) return NamedView{name, ViewSpan{}};
    const int64_t sizes[1] = {count}, strides[1] = {1};
    return NamedView{name, view_range(name, data, 4, sizes, strides, 1)};
  };
  // The table's entries the call reads: each sequence's pages (the longest
  // sequence's count in every row; a row stride may be larger).
  NamedView table{"block_table", ViewSpan{}};
  if (a.kv.block_table && a.kv.seqlens && a.kv.page_size > 0 && batch > 0) {
    int64_t pages = 0;
    for (int64_t b = 0; b < batch; ++b)
      if (a.kv.seqlens[b] > 0) pages = std::max<int64_t>(pages, (a.kv.seqlens[b] - 1) / a.kv.page_size + 1);
    const int64_t sizes[2] = {batch, pages}, strides[2] = {a.kv.block_table_stride, 1};
    table.view = view_range("block_table", a.kv.block_table, 4, sizes, strides, 2);
  }
  return {list("cu_seqlens_q", a.cu_seqlens_q, batch + 1), list("cu_seqlens_k", a.cu_seqlens_k, batch + 1),
          list("cache_seqlens", a.kv.seqlens, batch),      list("cache_batch_idx", a.kv.batch_index, batch),
          list("cache_leftpad", a.kv.row_start, batch),    table};
}

void validate(const ForwardArgs& a, OutputUse o_use) {
  const AttentionShape& s = a.shape;
  if (s.batch < 0) fail("batch must be >= 0, got " + str(s.batch));
  if (s.heads < 1) fail("heads must be >= 1, got " + str(s.heads));
  if (s.kv_heads < 1) fail("kv_heads must be >= 1, got " + str(s.kv_heads));
  if (s.heads % s.kv_heads != 0)
    fail("kv_heads (" + str(s.kv_heads) + ") must divide heads (" + str(s.heads) + ")");
  validate_head_dims(s.head_dim, s.v_head_dim);
  if (s.seqlen_q < 0) fail("seqlen_q must be >= 0, got " + str(s.seqlen_q));
  if (s.seqlen_k < 0) fail("seqlen_k must be >= 0, got " + str(s.seqlen_k));
  if (!is_activation_dtype(a.dtype))
    fail("dtype: expected fp32, fp16 or bf16");
  if (a.kv.quant != KvQuant::none && a.kv.quant != KvQuant::int8 && a.kv.quant != KvQuant::fp8_e4m3)
    fail("kv quant: expected none, int8 or fp8_e4m3");
  if (!std::isnan(a.scale) && !std::isfinite(a.scale))
    fail("scale must be finite (or NaN for 1/sqrt(head_dim))");
  if (!(a.softcap >= 0.0f && std::isfinite(a.softcap)))
    fail("softcap must be finite and >= 0 (0: off), got " + std::to_string(a.softcap));
  if (a.alibi_batch_stride < 0)
    fail("alibi_batch_stride must be >= 0, got " + str(a.alibi_batch_stride));
  if (a.alibi_slopes && s.batch > 0) {
    // The slopes are few (heads, or batch x heads): read them all now.
    if (s.batch > 1 && a.alibi_batch_stride > 0 &&
        a.alibi_batch_stride > (std::numeric_limits<int64_t>::max() - s.heads) / (s.batch - 1))
      fail("alibi_slopes: batch stride x batch overflows");
    for (int64_t b = 0; b < (a.alibi_batch_stride > 0 ? s.batch : 1); ++b)
      for (int64_t h = 0; h < s.heads; ++h) {
        const float slope = a.alibi_slopes[b * a.alibi_batch_stride + h];
        if (!std::isfinite(slope))
          fail("alibi_slopes[" + str(b) + ", " + str(h) + "] must be finite, got " + std::to_string(slope));
      }
  }
  if (a.sinks)
    for (int64_t h = 0; h < s.heads; ++h)  // (the kernels scale it by log2(e): 1e38 keeps it finite)
      if (!(std::fabs(a.sinks[h]) <= 1e38f))
        fail("sinks[" + str(h) + "] must be finite (|sink| <= 1e38), got " + std::to_string(a.sinks[h]));
  if (!(a.dropout_p >= 0.0f && a.dropout_p < 1.0f))
    fail("dropout_p must be in [0, 1), got " + std::to_string(a.dropout_p));
  if (a.threads < 0) fail("threads must be >= 0, got " + str(a.threads));
  if (a.block_q < 0 || a.block_q > 1024) fail("block_q must be in 0..1024, got " + str(a.block_q));
  if (a.block_kv < 0 || a.block_kv > 1024)
    fail("block_kv must be in 0..1024, got " + str(a.block_kv));
  if (a.mask.window_left < -1) fail("window_left must be >= -1, got " + str(a.mask.window_left));
  if (a.mask.window_right < -1) fail("window_right must be >= -1, got " + str(a.mask.window_right));

  const int64_t esize = int64_t(dtype_size(a.dtype));
  const bool varlen_q = a.cu_seqlens_q != nullptr, varlen_k = a.cu_seqlens_k != nullptr;
  const bool paged = a.kv.block_table != nullptr;
  if (paged && varlen_k) fail("block_table and cu_seqlens_k cannot be combined");
  if (paged && !a.kv.seqlens) fail("block_table requires kv seqlens (cache_seqlens)");
  if (varlen_k && a.kv.seqlens) fail("cu_seqlens_k and kv seqlens cannot be combined");

  // Per-sequence lengths, and the largest, for the mask's extent.
  if (varlen_q) validate_cu_seqlens("cu_seqlens_q", a.cu_seqlens_q, s.batch, s.seqlen_q);
  if (varlen_k) validate_cu_seqlens("cu_seqlens_k", a.cu_seqlens_k, s.batch, s.seqlen_k);
  int64_t max_nq = varlen_q ? 0 : s.seqlen_q, max_nk = varlen_k ? 0 : s.seqlen_k;
  for (int64_t b = 0; (varlen_q || varlen_k) && b < s.batch; ++b) {  // no walk over a batch without arrays
    if (varlen_q) max_nq = std::max<int64_t>(max_nq, a.cu_seqlens_q[b + 1] - a.cu_seqlens_q[b]);
    if (varlen_k) max_nk = std::max<int64_t>(max_nk, a.cu_seqlens_k[b + 1] - a.cu_seqlens_k[b]);
  }
  if ((a.kv.batch_index || a.kv.row_start) && (paged || !a.kv.seqlens))
    throw NotSupported("kv batch_index / row_start (cache_batch_idx / cache_leftpad): only with a contiguous "
                       "cache and kv seqlens, not with block_table");
  if (a.kv.batch_index && a.kv.cache_batch < 0) fail("kv cache_batch must be >= 0, got " + str(a.kv.cache_batch));
  if (a.kv.seqlens) {
    max_nk = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t n = a.kv.seqlens[b];
      if (n < 0) fail("kv seqlens[" + str(b) + "] must be >= 0, got " + str(n));
      if (!paged && n > s.seqlen_k)
        fail("kv seqlens[" + str(b) + "] = " + str(n) + " exceeds the cache capacity (" +
             str(s.seqlen_k) + ")");
      const int64_t start = a.kv.row_start ? a.kv.row_start[b] : 0;
      if (start < 0 || start > n)
        fail("kv row_start[" + str(b) + "] = " + str(start) + " must be in 0..kv seqlens[" + str(b) + "] (" +
             str(n) + ")");
      if (a.kv.batch_index && (a.kv.batch_index[b] < 0 || a.kv.batch_index[b] >= a.kv.cache_batch))
        fail("kv batch_index[" + str(b) + "] = " + str(a.kv.batch_index[b]) + " is out of range 0.." +
             str(a.kv.cache_batch - 1));
      max_nk = std::max(max_nk, n - start);
    }
  }
  if (paged) {
    if (a.kv.page_size < 1) fail("page_size must be >= 1, got " + str(a.kv.page_size));
    if (a.kv.num_pages < 0) fail("num_pages must be >= 0, got " + str(a.kv.num_pages));
    if (a.kv.block_table_stride < 0) fail("block_table stride must be >= 0");
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t n = a.kv.seqlens[b];  // >= 0 here; n + page_size - 1 could overflow
      const int64_t blocks = n == 0 ? 0 : (n - 1) / a.kv.page_size + 1;
      if (blocks > a.kv.block_table_stride)
        fail("block_table: sequence " + str(b) + " needs " + str(blocks) +
             " pages but the table has " + str(a.kv.block_table_stride) + " per sequence");
      for (int64_t i = 0; i < blocks; ++i) {
        const int64_t page = a.kv.block_table[b * a.kv.block_table_stride + i];
        if (page < 0 || page >= a.kv.num_pages)
          fail("block_table[" + str(b) + ", " + str(i) + "] = " + str(page) +
               " is out of range 0.." + str(a.kv.num_pages - 1));
      }
    }
  }

  const bool has_work = s.batch > 0 && max_nq > 0;
  const int64_t q_batches = varlen_q ? 1 : s.batch, k_batches = varlen_k ? 1 : s.batch;
  const int64_t dv = value_head_dim(s);
  const int64_t q_sizes[4] = {q_batches, s.heads, s.seqlen_q, s.head_dim};
  const int64_t o_sizes[4] = {q_batches, s.heads, s.seqlen_q, dv};
  int64_t k_sizes[4] = {a.kv.batch_index ? a.kv.cache_batch : k_batches, s.kv_heads, s.seqlen_k, s.head_dim};
  if (paged) {
    k_sizes[0] = a.kv.num_pages;
    k_sizes[2] = a.kv.page_size;
  }
  const int64_t v_sizes[4] = {k_sizes[0], k_sizes[1], k_sizes[2], dv};
  // Total element counts must fit int64 even for views we will not touch.
  checked_mul(checked_mul(checked_mul(q_sizes[0], q_sizes[1], "q"), q_sizes[2], "q"), q_sizes[3], "q");
  checked_mul(checked_mul(checked_mul(k_sizes[0], k_sizes[1], "k"), k_sizes[2], "k"), k_sizes[3], "k");
  checked_mul(checked_mul(checked_mul(v_sizes[0], v_sizes[1], "v"), v_sizes[2], "v"), v_sizes[3], "v");
  checked_mul(checked_mul(checked_mul(o_sizes[0], o_sizes[1], "o"), o_sizes[2], "o"), o_sizes[3], "o");
  if (!has_work) return;

  if (!a.q.data) fail("q: data is null");
  if (!a.o.data) fail("o: data is null");
  const bool keys_needed = max_nk > 0;
  if (keys_needed && !a.k.data) fail("k: data is null");
  if (keys_needed && !a.v.data) fail("v: data is null");

  ViewSpan q = view_range("q", a.q.data, esize, q_sizes, a.q.stride.data(), 4);
  ViewSpan o = view_range("o", a.o.data, int64_t(dtype_size(output_dtype(a))), o_sizes, a.o.stride.data(), 4);
  const bool o_written = o_use == OutputUse::written;
  if (o_written) check_injective("o", o_sizes, a.o.stride.data(), 4);
  ViewSpan k, v, k_scale, v_scale;
  if (keys_needed) {
    const int64_t kv_esize = int64_t(dtype_size(kv_storage_dtype(a.dtype, a.kv.quant)));
    k = view_range("k", a.k.data, kv_esize, k_sizes, a.k.stride.data(), 4);
    v = view_range("v", a.v.data, kv_esize, v_sizes, a.v.stride.data(), 4);
    if (a.kv.quant != KvQuant::none) {
      k_scale = validate_kv_scales("k_scale", a, a.kv.k_scale, a.kv.k_scale_stride, k_sizes);
      v_scale = validate_kv_scales("v_scale", a, a.kv.v_scale, a.kv.v_scale_stride, k_sizes);
    }
  }
  ViewSpan mask;
  if (a.mask.kind != MaskSpec::Kind::none) {
    if (a.mask.kind != MaskSpec::Kind::boolean && a.mask.kind != MaskSpec::Kind::additive)
      fail("mask: unknown kind");
  } else if (a.mask.data) {
    // A mask given without its kind would be ignored, silently.
    fail("mask: data given with kind none (boolean or additive says how to read it)");
  }
  // Without keys a mask has no element to read (an empty [Nq, 0] array may have null data).
  if (a.mask.kind != MaskSpec::Kind::none && keys_needed) {
    if (!a.mask.data) fail("mask: data is null");
    const int64_t m_sizes[4] = {s.batch, s.heads, max_nq, max_nk};
    mask = view_range("mask", a.mask.data, a.mask.kind == MaskSpec::Kind::boolean ? 1 : 4, m_sizes,
                      a.mask.stride.data(), 4);
  }
  // The score modifiers' per-head inputs, read while O and LSE are written.
  const ViewSpan alibi = alibi_slopes_view(a), sinks = sinks_view(a);
  const std::array<NamedView, 6> index_arrays = index_array_views(a);
  if (o_written) {
    for (const NamedView& x : index_arrays)
      if (views_overlap(o, x.view)) fail(std::string("o: output overlaps input ") + x.name);
    if (views_overlap(o, alibi)) fail("o: output overlaps input alibi_slopes");
    if (views_overlap(o, sinks)) fail("o: output overlaps input sinks");
    if (views_overlap(o, q)) fail("o: output overlaps input q");
    if (views_overlap(o, k)) fail("o: output overlaps input k");
    if (views_overlap(o, v)) fail("o: output overlaps input v");
    if (views_overlap(o, mask)) fail("o: output overlaps the mask");
    if (views_overlap(o, k_scale)) fail("o: output overlaps input k_scale");
    if (views_overlap(o, v_scale)) fail("o: output overlaps input v_scale");
  }
  if (a.lse) {
    const int64_t l_sizes[3] = {q_batches, s.heads, s.seqlen_q};
    ViewSpan lse = view_range("lse", a.lse, 4, l_sizes, a.lse_stride.data(), 3);
    check_injective("lse", l_sizes, a.lse_stride.data(), 3);
    if (views_overlap(lse, o)) fail("lse: overlaps output o");
    if (views_overlap(lse, q) || views_overlap(lse, k) || views_overlap(lse, v))
      fail("lse: overlaps an input");
    if (views_overlap(lse, mask)) fail("lse: overlaps the mask");
    if (views_overlap(lse, k_scale) || views_overlap(lse, v_scale)) fail("lse: overlaps an input");
    if (views_overlap(lse, alibi)) fail("lse: overlaps input alibi_slopes");
    if (views_overlap(lse, sinks)) fail("lse: overlaps input sinks");
    for (const NamedView& x : index_arrays)
      if (views_overlap(lse, x.view)) fail(std::string("lse: overlaps input ") + x.name);
  }
}

}  // namespace tileattn::detail

namespace tileattn {
void validate(const ForwardArgs& args) { detail::validate(args); }
}  // namespace tileattn
