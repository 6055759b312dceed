"""tileattn.attention_with_kvcache (placeholder until the C++ KV cache is bound)."""


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                           rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
                           softmax_scale=None, is_causal=True, window=None, return_lse=False):
    """Append k/v into a KV cache in place and attend q to everything cached.

    Not supported yet: raises NotImplementedError until the bindings to
    include/tileattn/kv_cache.hpp are built.
    """
    raise NotImplementedError("attention_with_kvcache: not supported yet "
                              "(the Python binding of the C++ KV cache is not built)")
