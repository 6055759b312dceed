// tileattn._tileattn.attention_with_kvcache: kv_cache.hpp's append + attend on
// caller-owned memory. The Python layer (tileattn/_kvcache.py) builds the arguments.
#include <array>
#include <cstdint>

#include <nanobind/stl/array.h>

#include "bindings.hpp"
#include "kernel_timer.hpp"
#include "tileattn/kv_cache.hpp"

namespace tileattn::python {

namespace {

// sizes: [batch, heads, kv_heads, head_dim, seqlen_q, seqlen_new]
// cache: [capacity, block_table_stride, page_size, num_pages] (paged when block_table != 0)
// rotary: [rotary_dim, rotary_positions]
void attention_with_kvcache(int dtype, const std::array<int64_t, 6>& sizes, Address q,
                            const Stride4& q_stride, Address o, const Stride4& o_stride,
                            Address lse, const Stride3& lse_stride, Address k_cache,
                            const Stride4& k_cache_stride, Address v_cache,
                            const Stride4& v_cache_stride, const std::array<int64_t, 4>& cache,
                            Address cache_seqlens, Address block_table, Address k_new,
                            const Stride4& k_new_stride, Address v_new,
                            const Stride4& v_new_stride, Address rotary_cos, Address rotary_sin,
                            const std::array<int64_t, 2>& rotary, bool rotary_interleaved,
                            float scale, bool causal, int64_t window_left, int64_t window_right,
                            int threads, float softcap, Address alibi_slopes, int64_t alibi_batch_stride,
                            Address sinks, Address cache_batch_idx, int64_t cache_batch, Address cache_leftpad,
                            bool rotary_fa2_positions, int64_t v_head_dim) {
  if (dtype < 0 || dtype > int(DType::bf16)) throw Error("dtype: unknown code");
  KvCacheArgs a;
  a.dtype = DType(dtype);
  a.batch = sizes[0];
  a.heads = sizes[1];
  a.kv_heads = sizes[2];
  a.head_dim = sizes[3];
  a.v_head_dim = v_head_dim;
  a.seqlen_q = sizes[4];
  a.seqlen_new = sizes[5];
  a.q = InputView{from_address<const void>(q), q_stride};
  a.o = OutputView{from_address<void>(o), o_stride};
  a.lse = from_address<float>(lse);
  a.lse_stride = lse_stride;
  a.k_cache = OutputView{from_address<void>(k_cache), k_cache_stride};
  a.v_cache = OutputView{from_address<void>(v_cache), v_cache_stride};
  a.capacity = cache[0];
  a.block_table_stride = cache[1];
  a.page_size = cache[2];
  a.num_pages = cache[3];
  a.cache_seqlens = from_address<int32_t>(cache_seqlens);
  a.block_table = from_address<const int32_t>(block_table);
  a.k_new = InputView{from_address<const void>(k_new), k_new_stride};
  a.v_new = InputView{from_address<const void>(v_new), v_new_stride};
  a.rotary_cos = from_address<const float>(rotary_cos);
  a.rotary_sin = from_address<const float>(rotary_sin);
  a.rotary_dim = rotary[0];
  a.rotary_positions = rotary[1];
  a.rotary_interleaved = rotary_interleaved;
  a.scale = scale;
  a.softcap = softcap;
  a.bf16_probabilities = bf16_probabilities_setting().load(std::memory_order_relaxed);
  a.alibi_slopes = from_address<const float>(alibi_slopes);
  a.alibi_batch_stride = alibi_batch_stride;
  a.sinks = from_address<const float>(sinks);
  a.cache_batch_idx = from_address<const int32_t>(cache_batch_idx);
  a.cache_batch = cache_batch;
  a.cache_leftpad = from_address<const int32_t>(cache_leftpad);
  a.rotary_fa2_query_positions = rotary_fa2_positions;
  a.causal = causal;
  a.window_left = window_left;
  a.window_right = window_right;
  a.threads = threads;
  nb::gil_scoped_release release;
  try {
    run_timed([&] { tileattn::attention_with_kvcache(a); });
  } catch (const Error& e) {
    throw with_python_kv_names(e);
  }
}

}  // namespace

void bind_kvcache(nb::module_& m) {
  m.def("attention_with_kvcache", &attention_with_kvcache, nb::arg("dtype"), nb::arg("sizes"),
        nb::arg("q"), nb::arg("q_stride"), nb::arg("o"), nb::arg("o_stride"), nb::arg("lse"),
        nb::arg("lse_stride"), nb::arg("k_cache"), nb::arg("k_cache_stride"), nb::arg("v_cache"),
        nb::arg("v_cache_stride"), nb::arg("cache"), nb::arg("cache_seqlens"),
        nb::arg("block_table"), nb::arg("k_new"), nb::arg("k_new_stride"), nb::arg("v_new"),
        nb::arg("v_new_stride"), nb::arg("rotary_cos"), nb::arg("rotary_sin"), nb::arg("rotary"),
        nb::arg("rotary_interleaved"), nb::arg("scale"), nb::arg("causal"),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("threads"), nb::arg("softcap") = 0.0f, nb::arg("alibi_slopes") = Address(0),
        nb::arg("alibi_batch_stride") = int64_t(0), nb::arg("sinks") = Address(0),
        nb::arg("cache_batch_idx") = Address(0), nb::arg("cache_batch") = int64_t(0),
        nb::arg("cache_leftpad") = Address(0), nb::arg("rotary_fa2_positions") = false,
        nb::arg("v_head_dim") = int64_t(0),
        "kv_cache.hpp attention_with_kvcache on raw addresses (element strides)");
}

}  // namespace tileattn::python
