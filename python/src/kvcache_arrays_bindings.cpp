// tileattn._tileattn.kvcache_arrays: attention_with_kvcache's array work in
// one C++ call -- frameworks, ranks, dtypes, devices, shapes, the cache
// lengths, block table and rotary tables, output allocation and the kernel
// call -- because a decode loop makes this call once per token and layer (see
// docs/python.md, "Call overhead"). The Python layer (tileattn/_kvcache.py)
// parses the scalar options first; every message names the argument it is
// about, in the words of the Python API.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>

#include "array_view.hpp"
#include "bindings.hpp"
#include "dtype_checks.hpp"
#include "kernel_timer.hpp"
#include "new_arrays.hpp"
#include "torch_eager.hpp"
#include "tileattn/kv_cache.hpp"

namespace tileattn::python {

namespace {

using namespace nb::literals;

// A 4-D view in [outer, head, row, dim] order (what KvCacheArgs takes): FlashAttention-2's
// [outer, row, head, dim] arrays (`token_major`) have their dims 1 and 2 swapped, no copy.
ArrayView swap_rows_and_heads(ArrayView a) {
  std::swap(a.shape[1], a.shape[2]);
  std::swap(a.stride[1], a.stride[2]);
  return a;
}

ArrayView read_rank4(const char* name, nb::handle obj, const char* what,
                     Access access = Access::read, bool token_major = false) {
  ArrayView a = read_array(name, obj, access);
  if (a.rank != 4) {
    fail_value(std::string(name) + ": expected a 4-D array " + what + ", got shape " + shape_text(a));
  }
  return token_major ? swap_rows_and_heads(a) : a;
}

// Row-major without gaps (the strides of size-1 dims do not matter).
bool is_dense(const ArrayView& a) {
  int64_t expected = 1;
  for (int i = a.rank - 1; i >= 0; --i) {
    if (a.shape[i] != 1 && a.stride[i] != expected) return false;
    expected *= a.shape[i];
  }
  return true;
}

nb::handle numpy_ascontiguousarray() {
  static nb::handle f = nb::object(nb::module_::import_("numpy").attr("ascontiguousarray")).release();
  return f;
}

// `obj` (read as `a`) as a dense array of `type` (i32 or f32): itself when it
// is one, else one converted copy, which `kept` holds for the call.
ArrayView dense_as(const char* name, nb::handle obj, const ArrayView& a, ElementType type, nb::object& kept) {
  if (a.type == type && is_dense(a)) return a;
  const bool is_int = type == ElementType::i32;
  if (a.framework == Framework::torch) {
    kept = is_int ? obj.attr("int")().attr("contiguous")() : obj.attr("detach")().attr("float")().attr("contiguous")();
  } else {
    kept = numpy_ascontiguousarray()(obj, "dtype"_a = is_int ? "int32" : "float32");
  }
  return read_array(name, kept, Access::read);
}

// The kernel's page indices are int32: a wider integer table [B, max_pages]
// (`a`) is checked entry by entry before it is narrowed, which would wrap
// (2^32 + 3 to page 3). Other integer types are widened to int64 first, as
// the cache lengths are (uint64 entries from 2^63 up wrap to negatives there,
// which the library refuses as pages).
void check_fits_int32(const char* name, nb::handle obj, const ArrayView& a) {
  nb::object wide;
  ArrayView w = a;
  if (a.type == ElementType::other_int) {
    wide = a.framework == Framework::torch ? obj.attr("long")() : obj.attr("astype")("int64");
    w = read_array(name, wide, Access::read);
  }
  const auto* data = static_cast<const int64_t*>(w.data);
  for (int64_t i = 0; i < w.shape[0]; ++i) {
    for (int64_t j = 0; j < w.shape[1]; ++j) {
      const int64_t entry = data[i * w.stride[0] + j * w.stride[1]];
      if (entry < std::numeric_limits<int32_t>::min() || entry > std::numeric_limits<int32_t>::max()) {
        fail_value(std::string(name) + "[" + std::to_string(i) + ", " + std::to_string(j) + "] = " +
                   std::to_string(entry) + " does not fit in int32 (the kernel's page indices)");
      }
    }
  }
}

// An int or a NumPy integer scalar (what the Python API takes as one length for every sequence).
bool is_integer_scalar(nb::handle x) {
  return PyLong_Check(x.ptr()) || (!is_array(x) && PyIndex_Check(x.ptr()));
}

// The private int32 [B] copy of the cache lengths: on the stack for the
// usual small batches (no allocation per decode step), else on the heap.
class CacheLengths {
 public:
  explicit CacheLengths(int64_t batch) {
    if (batch > int64_t(small_.size())) heap_.resize(batch);
    data_ = heap_.empty() ? small_.data() : heap_.data();
  }
  CacheLengths(const CacheLengths&) = delete;
  CacheLengths& operator=(const CacheLengths&) = delete;
  int32_t* data() { return data_; }

 private:
  std::array<int32_t, 64> small_{};
  std::vector<int32_t> heap_;
  int32_t* data_ = nullptr;
};

// Fills `out` (batch entries) with the cache lengths; the kernel advances
// them, the caller's stay as they were (as in FlashAttention-2).
void cache_lengths(nb::handle seqlens, int64_t batch, bool paged, bool appending, int64_t capacity,
                   int32_t* out) {
  static constexpr const char* kLengthsRange = "cache_seqlens: entries must be in 0 .. 2^31 - 1";
  auto in_range = [](int64_t n) {
    if (n < 0 || n > std::numeric_limits<int32_t>::max()) fail_value(kLengthsRange);
    return static_cast<int32_t>(n);
  };
  if (seqlens.is_none()) {
    if (paged || appending) fail_value("cache_seqlens: required with block_table or when appending k/v");
    std::fill(out, out + batch, in_range(capacity));
    return;
  }
  if (PyBool_Check(seqlens.ptr())) {
    fail_type("cache_seqlens: expected an int or an integer array, got dtype bool");
  }
  if (is_integer_scalar(seqlens)) {
    const long long n = PyLong_AsLongLong(seqlens.ptr());  // ints and NumPy integers
    if (n == -1 && PyErr_Occurred()) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw nb::python_error();
      PyErr_Clear();  // beyond int64: say which argument is out of range
      fail_value(kLengthsRange);
    }
    std::fill(out, out + batch, in_range(n));
    return;
  }
  ArrayView a = read_array("cache_seqlens", seqlens, Access::read);
  nb::object converted;
  if (a.type == ElementType::other_int) {
    converted = a.framework == Framework::torch ? seqlens.attr("long")() : seqlens.attr("astype")("int64");
    a = read_array("cache_seqlens", converted, Access::read);
  }
  if (a.type != ElementType::i32 && a.type != ElementType::i64) {
    fail_type("cache_seqlens: expected an int or an integer array, got dtype " + dtype_text(seqlens));
  }
  if (a.rank != 1 || a.shape[0] != batch) {
    fail_value("cache_seqlens: expected shape [B] = (" + std::to_string(batch) + ",), got " + shape_text(a));
  }
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = a.type == ElementType::i32 ? static_cast<const int32_t*>(a.data)[b * a.stride[0]]
                                                 : static_cast<const int64_t*>(a.data)[b * a.stride[0]];
    out[b] = in_range(n);
  }
}

bool is_float(ElementType t) {
  return t == ElementType::f32 || t == ElementType::f16 || t == ElementType::bf16 || t == ElementType::other_float;
}

const char* kind_word(Framework fw) { return fw == Framework::torch ? "tensor" : "array"; }

// The quantization of a cache array given with k_scale / v_scale: int8
// (torch.int8, NumPy int8) or fp8 e4m3 (torch.float8_e4m3fn); anything else
// is a TypeError naming the array.
KvQuant cache_quant(const char* name, nb::handle cache, Framework fw) {
  const std::string dtype = dtype_text(cache);
  if (dtype == "int8" || dtype == "torch.int8") return KvQuant::int8;
  if (fw == Framework::torch && dtype == "torch.float8_e4m3fn") return KvQuant::fp8_e4m3;
  fail_type(std::string(name) + ": with k_scale and v_scale the cache must be int8 (torch or NumPy) or "
            "torch.float8_e4m3fn, got dtype " + dtype);
}

// A quantized cache array as bytes: fp8 tensors are read through a uint8
// view of the same memory (their element strides are byte strides either way).
ArrayView read_quantized_cache(const char* name, nb::handle cache, KvQuant quant, Access access, nb::object& kept) {
  if (quant != KvQuant::fp8_e4m3) return read_array(name, cache, access);
  static nb::handle uint8 = nb::object(nb::module_::import_("torch").attr("uint8")).release();
  kept = cache.attr("view")(uint8);
  return read_array(name, kept, access);
}

// k_scale / v_scale: float32; int8: [B, Hkv, capacity] (paged: [num_pages,
// Hkv, page_size]) with any strides, written by appends; fp8: [Hkv], dense.
void read_scales(const char* name, nb::handle scales, Framework fw, KvQuant quant, const int64_t* cache_shape,
                 Access access, float*& data, std::array<int64_t, 3>& stride) {
  check_framework(name, scales, fw);
  const bool int8 = quant == KvQuant::int8;
  const ArrayView s = read_array(name, scales, int8 ? access : Access::read);
  if (s.type != ElementType::f32) {
    fail_type(std::string(name) + ": expected float32 scales, got dtype " + dtype_text(scales));
  }
  if (int8) {
    if (s.rank != 3 || s.shape[0] != cache_shape[0] || s.shape[1] != cache_shape[1] || s.shape[2] != cache_shape[2]) {
      fail_value(std::string(name) + ": an int8 cache takes one scale per (token, KV head), shape (" +
                 std::to_string(cache_shape[0]) + ", " + std::to_string(cache_shape[1]) + ", " +
                 std::to_string(cache_shape[2]) + ") (the cache's first three dims), got " + shape_text(s));
    }
    stride = {s.stride[0], s.stride[1], s.stride[2]};
  } else if (s.rank != 1 || s.shape[0] != cache_shape[1] || (s.shape[0] > 1 && s.stride[0] != 1)) {
    fail_value(std::string(name) + ": an fp8_e4m3 cache takes one scale per KV head, a contiguous (" +
               std::to_string(cache_shape[1]) + ",) array, got shape " + shape_text(s));
  }
  data = static_cast<float*>(const_cast<void*>(s.data));
}

// torch bumps the version counter of a tensor written in place (so autograd
// can tell a saved tensor changed); the binding writes the caches (and an
// int8 cache's scales, where it appends) itself.
void increment_versions(nb::tuple written) {
  static nb::handle increment =
      nb::object(nb::module_::import_("torch").attr("_C").attr("_increment_version")).release();
  increment(written);
}

nb::object kvcache_arrays(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle k,
                         nb::handle v, nb::handle cache_seqlens, nb::handle block_table,
                         nb::handle rotary_cos, nb::handle rotary_sin, bool rotary_interleaved,
                         std::optional<double> scale, bool causal, int64_t window_left,
                         int64_t window_right, int threads, bool with_lse, nb::handle o_given,
                         bool eager_only, double softcap, nb::handle alibi_slopes, nb::handle sinks,
                         nb::handle cache_batch_idx, nb::handle cache_leftpad, bool rotary_fa2_positions,
                         bool token_major, nb::handle k_scale, nb::handle v_scale) {
  const Framework fw = framework_of("q", q);
  if (eager_only && fw == Framework::torch &&
      !torch_call_is_plain_eager(
          {q, k_cache, v_cache, k, v, cache_seqlens, block_table, rotary_cos, rotary_sin, o_given,
           alibi_slopes, sinks, cache_batch_idx, cache_leftpad, k_scale, v_scale})) {
    return nb::none();
  }
  const std::pair<const char*, nb::handle> others[] = {
      {"k_cache", k_cache}, {"v_cache", v_cache}, {"k", k}, {"v", v}, {"block_table", block_table},
      {"rotary_cos", rotary_cos}, {"rotary_sin", rotary_sin}, {"cache_batch_idx", cache_batch_idx},
      {"cache_leftpad", cache_leftpad}};
  for (const auto& [name, x] : others) {
    if (!x.is_none()) check_framework(name, x, fw);
  }
  if (!cache_seqlens.is_none() && !PyLong_Check(cache_seqlens.ptr()) && !is_integer_scalar(cache_seqlens)) {
    check_framework("cache_seqlens", cache_seqlens, fw);
  }
  if (k.is_none() != v.is_none()) fail_value("k, v: give both new keys and new values, or neither");
  if (rotary_cos.is_none() != rotary_sin.is_none()) {
    fail_value("rotary_cos, rotary_sin: give both tables or neither");
  }
  const bool paged = !block_table.is_none();
  const bool appending = !k.is_none();
  const char* cache_what = paged ? "[num_pages, Hkv, page_size, D]" : "[B, Hkv, capacity, D]";

  // token_major: FlashAttention-2's layouts (q, o [B, Nq, H, D], caches [B, S, Hkv, D] or
  // [blocks, block_size, Hkv, D], k, v [B, Nnew, Hkv, D]) read in place; the shapes in the
  // messages below are then in [B, H, N, D] order.
  const bool tm = token_major;
  const ArrayView qa = read_rank4("q", q, tm ? "[B, Nq, H, D]" : "[B, H, Nq, D]", Access::read, tm);
  KvCacheArgs a;
  a.dtype = attention_dtype("q", q, qa);
  // The cache is written only when k/v are appended; attending alone may read a read-only one.
  const Access cache_access = appending ? Access::write : Access::read;
  // A quantized cache (int8 / fp8 e4m3) comes with its scales.
  if (k_scale.is_none() != v_scale.is_none()) fail_value("k_scale, v_scale: give both scales or neither");
  const bool quantized = !k_scale.is_none();
  nb::object k_bytes, v_bytes;
  ArrayView kc, vc;
  if (quantized && tm)
    throw NotSupported("k_scale, v_scale: quantized caches are not supported in FlashAttention-2's token-major "
                       "cache layout (flash_attn_with_kvcache); use attention_with_kvcache");
  if (quantized) {
    check_framework("k_cache", k_cache, fw);
    check_framework("v_cache", v_cache, fw);
    a.kv_quant = cache_quant("k_cache", k_cache, fw);
    if (cache_quant("v_cache", v_cache, fw) != a.kv_quant) {
      fail_type("v_cache: dtype " + dtype_text(v_cache) + " differs from k_cache's " + dtype_text(k_cache));
    }
    kc = read_quantized_cache("k_cache", k_cache, a.kv_quant, cache_access, k_bytes);
    vc = read_quantized_cache("v_cache", v_cache, a.kv_quant, cache_access, v_bytes);
    if (kc.rank != 4) fail_value(std::string("k_cache: expected a 4-D array ") + cache_what + ", got shape " + shape_text(kc));
    if (vc.rank != 4) fail_value(std::string("v_cache: expected a 4-D array ") + cache_what + ", got shape " + shape_text(vc));
    read_scales("k_scale", k_scale, fw, a.kv_quant, kc.shape.data(), cache_access, a.k_scale, a.k_scale_stride);
    read_scales("v_scale", v_scale, fw, a.kv_quant, kc.shape.data(), cache_access, a.v_scale, a.v_scale_stride);
  } else {
    kc = read_rank4("k_cache", k_cache, cache_what, cache_access, tm);
    check_dtype_like_q("k_cache", k_cache, kc, q, qa);
    vc = read_rank4("v_cache", v_cache, cache_what, cache_access, tm);
    check_dtype_like_q("v_cache", v_cache, vc, q, qa);
  }
  ArrayView ka, va;
  if (appending) {
    ka = read_rank4("k", k, "[B, Hkv, Nnew, D]", Access::read, tm);
    check_dtype_like_q("k", k, ka, q, qa);
    va = read_rank4("v", v, "[B, Hkv, Nnew, D]", Access::read, tm);
    check_dtype_like_q("v", v, va, q, qa);
  }
  // V's head dim may differ from K's (DeepSeek MLA: 576 / 512); the rest of the shapes match.
  const auto same_but_head_dim = [](const ArrayView& x, const ArrayView& y) {
    return x.shape[0] == y.shape[0] && x.shape[1] == y.shape[1] && x.shape[2] == y.shape[2];
  };
  if (!same_but_head_dim(vc, kc)) {
    fail_value("v_cache: shape " + shape_text(vc) + " must equal k_cache's " + shape_text(kc) +
               " but for the head dim (the last dimension)");
  }
  const int64_t b = qa.shape[0], h = qa.shape[1], d = qa.shape[3], hk = kc.shape[1], dv = vc.shape[3];
  if (dv < 1 || dv > kMaxValueHeadDim) {
    fail_value("v_cache: head_dim must be in 1.." + std::to_string(kMaxValueHeadDim) +
               " (V's may differ from K's), got " + std::to_string(dv));
  }
  if (kc.shape[3] != d) {
    fail_value("k_cache: head_dim " + std::to_string(kc.shape[3]) + " differs from q's " + std::to_string(d));
  }
  if (hk < 1 || h % hk != 0) {
    fail_value("k_cache: " + std::to_string(hk) + " heads must divide q's " + std::to_string(h) +
               " heads (GQA/MQA)");
  }
  const bool indexed = !cache_batch_idx.is_none();
  if (!paged && !indexed && kc.shape[0] != b) {
    fail_value("k_cache: batch " + std::to_string(kc.shape[0]) + " differs from q's " + std::to_string(b));
  }
  if (appending) {
    if (!same_but_head_dim(va, ka) || va.shape[3] != dv) {
      fail_value("v: shape " + shape_text(va) + " must equal k's " + shape_text(ka) +
                 " but for the head dim, which is v_cache's (" + std::to_string(dv) + ")");
    }
    if (ka.shape[0] != b || ka.shape[1] != hk || ka.shape[3] != d) {
      fail_value("k: expected [B, Hkv, Nnew, D] = [" + std::to_string(b) + ", " + std::to_string(hk) +
                 ", Nnew, " + std::to_string(d) + "], got " + shape_text(ka));
    }
  }

  CacheLengths seqlens(b);
  cache_lengths(cache_seqlens, b, paged, appending, kc.shape[2], seqlens.data());
  nb::object table_kept, cos_kept, sin_kept;
  if (paged) {
    const ArrayView t0 = read_array("block_table", block_table, Access::read);
    if (t0.type != ElementType::i32 && t0.type != ElementType::i64 && t0.type != ElementType::other_int) {
      fail_type(std::string("block_table: expected an integer ") + kind_word(fw) + ", got dtype " +
                dtype_text(block_table));
    }
    if (t0.rank != 2 || t0.shape[0] != b) {
      fail_value("block_table: expected shape [B, max_pages] with B = " + std::to_string(b) + ", got " +
                 shape_text(t0));
    }
    if (t0.type != ElementType::i32) check_fits_int32("block_table", block_table, t0);
    const ArrayView t = dense_as("block_table", block_table, t0, ElementType::i32, table_kept);
    a.block_table = static_cast<const int32_t*>(t.data);
    a.block_table_stride = t.shape[1];
    a.page_size = kc.shape[2];
    a.num_pages = kc.shape[0];
  } else {
    a.capacity = kc.shape[2];
  }
  if (!rotary_cos.is_none()) {
    ArrayView tables[2];
    nb::object* kept[2] = {&cos_kept, &sin_kept};
    const std::pair<const char*, nb::handle> named[2] = {{"rotary_cos", rotary_cos}, {"rotary_sin", rotary_sin}};
    for (int i = 0; i < 2; ++i) {
      const auto [name, x] = named[i];
      const ArrayView m = read_array(name, x, Access::read);
      if (!is_float(m.type)) {
        fail_type(std::string(name) + ": expected a float " + kind_word(fw) + ", got dtype " + dtype_text(x));
      }
      tables[i] = dense_as(name, x, m, ElementType::f32, *kept[i]);
      if (tables[i].rank != 2) {
        fail_value(std::string(name) + ": expected [positions, rotary_dim / 2], got shape " +
                   shape_text(tables[i]));
      }
    }
    if (tables[1].shape[0] != tables[0].shape[0] || tables[1].shape[1] != tables[0].shape[1]) {
      fail_value("rotary_sin: shape " + shape_text(tables[1]) + " must equal rotary_cos's " +
                 shape_text(tables[0]));
    }
    a.rotary_cos = static_cast<const float*>(tables[0].data);
    a.rotary_sin = static_cast<const float*>(tables[1].data);
    a.rotary_dim = 2 * tables[0].shape[1];
    a.rotary_positions = tables[0].shape[0];
    a.rotary_interleaved = rotary_interleaved;
  }

  // cache_batch_idx / cache_leftpad: integer [B], int32 read in place when dense; the library
  // checks the values (rows in range, distinct when appending, pads within the lengths).
  nb::object index_kept, pad_kept;
  const std::pair<const char*, nb::handle> per_sequence[2] = {{"cache_batch_idx", cache_batch_idx},
                                                             {"cache_leftpad", cache_leftpad}};
  nb::object* kept_per_sequence[2] = {&index_kept, &pad_kept};
  const int32_t** targets[2] = {&a.cache_batch_idx, &a.cache_leftpad};
  for (int i = 0; i < 2; ++i) {
    const auto [name, x] = per_sequence[i];
    if (x.is_none()) continue;
    const ArrayView t0 = read_array(name, x, Access::read);
    if (t0.type != ElementType::i32 && t0.type != ElementType::i64 && t0.type != ElementType::other_int) {
      fail_type(std::string(name) + ": expected an integer " + kind_word(fw) + ", got dtype " + dtype_text(x));
    }
    if (t0.rank != 1 || t0.shape[0] != b) {
      fail_value(std::string(name) + ": expected shape [B] = (" + std::to_string(b) + ",), got " + shape_text(t0));
    }
    if (t0.type != ElementType::i32) {  // checked before narrowing, as block_table is
      nb::object wide = nb::borrow(x);
      if (t0.type == ElementType::other_int) wide = fw == Framework::torch ? x.attr("long")() : x.attr("astype")("int64");
      const ArrayView w = read_array(name, wide, Access::read);
      for (int64_t j = 0; j < b; ++j) {
        const int64_t entry = static_cast<const int64_t*>(w.data)[j * w.stride[0]];
        if (entry < std::numeric_limits<int32_t>::min() || entry > std::numeric_limits<int32_t>::max())
          fail_value(std::string(name) + "[" + std::to_string(j) + "] = " + std::to_string(entry) +
                     " does not fit in int32");
      }
    }
    *targets[i] = static_cast<const int32_t*>(dense_as(name, x, t0, ElementType::i32, *kept_per_sequence[i]).data);
  }
  if (indexed) a.cache_batch = kc.shape[0];
  a.rotary_fa2_query_positions = rotary_fa2_positions;
  a.batch = b;
  a.heads = h;
  a.kv_heads = hk;
  a.head_dim = d;
  a.v_head_dim = dv;
  a.seqlen_q = qa.shape[2];
  a.q = InputView{qa.data, {qa.stride[0], qa.stride[1], qa.stride[2], qa.stride[3]}};
  a.k_cache = OutputView{kc.data, {kc.stride[0], kc.stride[1], kc.stride[2], kc.stride[3]}};
  a.v_cache = OutputView{vc.data, {vc.stride[0], vc.stride[1], vc.stride[2], vc.stride[3]}};
  a.cache_seqlens = seqlens.data();
  if (appending) {
    a.seqlen_new = ka.shape[2];
    a.k_new = InputView{ka.data, {ka.stride[0], ka.stride[1], ka.stride[2], ka.stride[3]}};
    a.v_new = InputView{va.data, {va.stride[0], va.stride[1], va.stride[2], va.stride[3]}};
  }
  // The same value as flash_attention's default (and the custom op's float).
  a.scale = static_cast<float>(scale ? *scale : d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0);
  a.softcap = static_cast<float>(softcap);
  a.bf16_probabilities = bf16_probabilities_setting().load(std::memory_order_relaxed);
  read_alibi_slopes(alibi_slopes, Access::read, b, h, a.alibi_slopes, a.alibi_batch_stride);
  a.sinks = read_sinks(sinks, Access::read, h);
  a.causal = causal;
  a.window_left = window_left;
  a.window_right = window_right;
  a.threads = threads;

  const ArrayView q_given = tm ? swap_rows_and_heads(qa) : qa;  // q as the caller shaped it
  ArrayView o_shape = q_given;  // q's shape with V's head dim last
  o_shape.shape[3] = dv;
  const nb::object o = !o_given.is_none() ? nb::borrow(o_given)
                       : dv == d          ? new_array_like(q, q_given)
                                          : new_array_shaped(q, o_shape);
  ArrayView ov = o_given.is_none() ? read_array("o", o, Access::allocated)
                                   : read_output("out", o, fw, qa.type, q, o_shape.shape.data(), 4,
                                                 /*float32_too=*/true);
  a.fp32_output = ov.type == ElementType::f32 && qa.type != ElementType::f32;
  if (tm) ov = swap_rows_and_heads(ov);
  a.o = OutputView{ov.data, {ov.stride[0], ov.stride[1], ov.stride[2], ov.stride[3]}};
  nb::object lse = nb::none();
  if (with_lse) {
    lse = new_float32(fw, {b, h, qa.shape[2]});
    const ArrayView lv = read_array("lse", lse, Access::allocated);
    a.lse = static_cast<float*>(lv.data);
    a.lse_stride = {lv.stride[0], lv.stride[1], lv.stride[2]};
  }
  try {
    // Every array stays referenced by the caller, the converted copies and
    // outputs by this frame.
    nb::gil_scoped_release release;
    run_timed([&] { tileattn::attention_with_kvcache(a); });
  } catch (const Error& e) {
    const Error renamed = with_python_kv_names(e);
    if (!o_given.is_none()) fail_for_out(renamed);
    throw renamed;
  }
  if (fw == Framework::torch) {
    if (a.kv_quant == KvQuant::int8 && a.seqlen_new > 0)
      increment_versions(nb::make_tuple(k_cache, v_cache, k_scale, v_scale));
    else
      increment_versions(nb::make_tuple(k_cache, v_cache));
  }
  return nb::make_tuple(o, lse);
}

}  // namespace

void bind_kvcache_arrays(nb::module_& m) {
  // The arrays accept None so that the checks name the argument (nanobind would refuse the call).
  m.def("kvcache_arrays", &kvcache_arrays, "q"_a.none(), "k_cache"_a.none(), "v_cache"_a.none(),
        "k"_a.none(), "v"_a.none(),
        "cache_seqlens"_a.none(), "block_table"_a.none(), "rotary_cos"_a.none(), "rotary_sin"_a.none(),
        "rotary_interleaved"_a, "scale"_a.none(), "causal"_a, "window_left"_a, "window_right"_a,
        "threads"_a, "with_lse"_a, "o"_a.none() = nb::none(), "eager_only"_a = false, "softcap"_a = 0.0,
        "alibi_slopes"_a.none() = nb::none(), "sinks"_a.none() = nb::none(), "cache_batch_idx"_a.none() = nb::none(),
        "cache_leftpad"_a.none() = nb::none(), "rotary_fa2_positions"_a = false, "token_major"_a = false,
        "k_scale"_a.none() = nb::none(), "v_scale"_a.none() = nb::none(),
        "attention_with_kvcache on NumPy arrays or torch CPU tensors, checked; writes o (q's shape "
        "and dtype) when given, else allocates it; returns (o, lse or None), or None (nothing done) with eager_only when torch could observe the custom op "
        "torch.ops.tileattn.attention_with_kvcache (a tensor subclass, autograd, a tracer or mode)");
}

}  // namespace tileattn::python
