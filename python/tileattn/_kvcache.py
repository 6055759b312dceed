"""tileattn.attention_with_kvcache: append to a KV cache in place and attend, for NumPy and torch."""
import numpy as np

from . import _arrays, _kernel
from . import _tileattn as _C
from ._problem import (alibi_address, as_alibi_slopes, as_sinks, check_alibi_shape, check_sinks_shape, parse_bool,
                       parse_causal_window, parse_scale, parse_softcap, sinks_address)

# torch.Tensor, _torch_ops.dynamo_is_tracing and the custom op path _torch_ops.attention_with_kvcache,
# bound at the first call with torch tensors (tileattn never imports torch itself):
_torch_tensor = _is_compiling = _torch_attention_with_kvcache = None


def _bind_torch():
    global _torch_tensor, _is_compiling, _torch_attention_with_kvcache
    _torch_tensor, _is_compiling, _torch_attention_with_kvcache = _arrays.torch_entry_point(
        "attention_with_kvcache")


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                           rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
                           softmax_scale=None, is_causal=True, window=None, return_lse=False,
                           out=None, softcap=0.0, alibi_slopes=None, sinks=None, cache_batch_idx=None,
                           cache_leftpad=None, k_scale=None, v_scale=None, *, _rotary_fa2=False,
                           _token_major=False):
    """Append ``k``/``v`` into a KV cache in place and attend ``q`` to everything cached.

    Modeled on FlashAttention-2's ``flash_attn_with_kvcache``, with tileattn's ``[B, H, N, D]``
    ("bhsd") layout throughout.

    Args:
        q: new queries ``[B, H, Nq, D]``: float32/float16 NumPy arrays or float32/float16/bfloat16
            torch CPU tensors; every array argument comes from the same framework, any strides.
        k_cache, v_cache: the cache, q's dtype, updated in place. Contiguous cache:
            ``[B, Hkv, capacity, D]``; paged cache (with ``block_table``):
            ``[num_pages, Hkv, page_size, D]``. ``Hkv`` divides ``H``. ``v_cache`` (and ``v``,
            and the output) may have its own head dim ``Dv`` (1..512; D is 1..576): DeepSeek's
            MLA keeps a 576-wide K cache and a 512-wide V cache with one KV head. When ``k``/``v`` are
            appended they must be writable: a read-only NumPy array, or an inference tensor
            outside ``torch.inference_mode()``, is refused (ValueError); attending alone only
            reads them.
        k, v: optional new keys/values ``[B, Hkv, Nnew, D]`` written at positions
            ``cache_seqlens[b] .. cache_seqlens[b] + Nnew - 1`` (both or neither).
        cache_seqlens: tokens each sequence holds before this call: an int or an integer array
            ``[B]``. It is NOT modified (as in FlashAttention-2): after appending ``Nnew`` tokens
            the caller adds ``Nnew``. None means a full contiguous cache (``capacity`` tokens),
            which allows no append.
        block_table: integer ``[B, max_pages]``: entry ``[b, i]`` is the page holding tokens
            ``i * page_size ..`` of sequence ``b`` (vLLM style). int32 is read in place; another
            integer type is converted, and its entries must fit in int32 (ValueError otherwise).
        rotary_cos, rotary_sin: optional rotary tables ``[positions, rotary_dim / 2]``: the
            new keys are rotated as they are stored (the cache keeps rotated keys) and the
            queries are rotated to their positions; values are never rotated.
        rotary_interleaved: False: GPT-NeoX/Llama pairs (i, i + rotary_dim/2); True: GPT-J
            pairs (2i, 2i+1).
        softmax_scale: None means ``1 / sqrt(D)``.
        softcap: c > 0 caps each scaled score x to ``c * tanh(x / c)`` before the causal mask
            and window; 0 (the default) is off.
        alibi_slopes: None, or float32 ``[H]`` or ``[B, H]`` ALiBi slopes: ``-slope * |i + L - Nq - j|``
            (L the sequence's cache length after the append) is added after the soft cap.
        sinks: None, or ``[H]`` attention-sink logits (gpt-oss): ``exp(sinks[h])`` joins each
            row's softmax denominator with no value (not scaled, not capped); the lse includes
            it (see flash_attention). Added once per row, also when the keys are split.
        cache_batch_idx: None, or integer ``[B]`` (FlashAttention-2's): sequence ``b`` reads and
            appends cache row ``cache_batch_idx[b]`` of a contiguous cache of any number of rows
            ``[B_cache, Hkv, capacity, D]``; cache_seqlens, q, k, v stay indexed by ``b``. Rows
            out of range, or two appending sequences naming one row, raise ValueError before
            anything is written (FlashAttention-2 leaves which write wins unspecified). Not with
            ``block_table`` (NotImplementedError, as FlashAttention-2 refuses it).
        cache_leftpad: None, or integer ``[B]`` (FlashAttention-2's): sequence ``b``'s keys start at
            cache row ``cache_leftpad[b]`` (0 .. cache_seqlens[b]); the rows before are ignored.
            ``cache_seqlens`` stays the end row (the pad included), so appends land at
            cache_seqlens[b] and rotary positions are cache rows; causal, window and ALiBi align
            to the sequence's own length ``cache_seqlens[b] - cache_leftpad[b]`` (+ appended).
            Contiguous caches only. Both are read in place when int32, else converted.
        k_scale, v_scale: scales of a quantized cache (both or neither; docs/inference.md,
            "Quantized caches"). An int8 cache (torch.int8 or NumPy int8 ``k_cache``/``v_cache``)
            takes float32 ``[B, Hkv, capacity]`` (paged: ``[num_pages, Hkv, page_size]``), one
            symmetric scale per (token, KV head), written in place by appends (``max|x| / 127``);
            a torch.float8_e4m3fn cache takes float32 ``[Hkv]``, one scale per KV head, set by
            the caller (finite, > 0). The value of a cached element is element x scale; appended
            rows (after RoPE) are quantized on write and attention dequantizes in registers.
            Quantized caches run on the eager path only (NotImplementedError under autograd,
            tracing or torch.compile).
        is_causal: query ``t`` of sequence ``b`` sits at position ``L_b - Nq + t`` (``L_b`` the
            length after the append) and sees keys up to its own position (bottom-right
            alignment).
        window: ``(left, right)`` sliding window, inclusive, -1 = unbounded.
        return_lse: also return the float32 ``[B, H, Nq]`` log-sum-exp.
        out: optional output ``[B, H, Nq, D]`` to write instead of allocating one (q's dtype, or
            float32 for fp16 / bf16 queries: O before its rounding, as in flash_attention; q's
            framework, writable, positive strides, sharing no element with the inputs or the
            cache); a
            decode loop reuses one. With torch tensors only for calls that autograd, tracers
            and torch.compile do not see (plain tensors, no input requiring grad under grad
            mode); otherwise ValueError.

    Returns:
        ``o`` ``[B, H, Nq, D]`` in q's dtype and framework (``out`` when given, which may be
        float32 for 16-bit queries), or ``(o, lse)``.

    Copies: q, k, v, k_cache, v_cache are never copied. Small index and table arguments are
    converted when they are not already in the kernel's form: cache_seqlens is always copied
    (``[B]`` int32, so the caller's stays untouched), block_table when it is not a row-dense
    int32 array, rotary tables when they are not dense float32 (one copy each).
    Every argument is checked before anything is written: on an error the cache is unchanged.
    Torch tensors go through the custom op ``torch.ops.tileattn.attention_with_kvcache``
    (declared as mutating k_cache and v_cache); it has no autograd.
    """
    # Python checks the scalar options; one C++ call checks the arrays, converts the small
    # index and rotary tables where needed, allocates the outputs and runs the kernel.
    scale = None if softmax_scale is None else parse_scale(softmax_scale, 0)
    is_causal, left, right = parse_causal_window(is_causal, window)
    interleaved = rotary_interleaved
    if interleaved is not False and interleaved is not True:
        interleaved = parse_bool("rotary_interleaved", interleaved)
    if return_lse is not False and return_lse is not True:
        return_lse = parse_bool("return_lse", return_lse)
    if type(softcap) is not float or softcap != 0.0:
        softcap = parse_softcap(softcap)
    if alibi_slopes is not None:
        alibi_slopes = as_alibi_slopes(alibi_slopes, q)
    if sinks is not None:
        shape = getattr(q, "shape", ())
        sinks = as_sinks(sinks, q, shape[2 if _token_major else 1] if len(shape) == 4 else None)
        if _arrays.is_torch(sinks):
            sinks = sinks.detach()  # attention_with_kvcache has no backward
    threads = _kernel._settings["threads"]
    if type(q) is not np.ndarray and (type(q) is _torch_tensor or _arrays.is_torch(q)):
        if _torch_tensor is None:
            _bind_torch()
        result = None
        if not _is_compiling():
            # One C++ call, which declines (None) when torch could observe the custom op (a
            # tensor subclass, autograd, a tracer or mode); Dynamo must see is_compiling() here.
            try:
                result = _C.kvcache_arrays(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                           rotary_cos, rotary_sin, interleaved, scale, is_causal, left,
                                           right, threads, return_lse, o=out, eager_only=True,
                                           softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                                           cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                                           rotary_fa2_positions=_rotary_fa2, token_major=_token_major,
                                           k_scale=k_scale, v_scale=v_scale)
            except ValueError:
                # Tensors all on the meta device (shape inference) take the op, whose fake kernel
                # gives the outputs' shapes; any other device error stands.
                if not _arrays.on_meta(_kvcache_tensors(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                                        rotary_cos, rotary_sin, alibi_slopes, sinks,
                                                        cache_batch_idx, cache_leftpad)):
                    raise
        if result is None and (k_scale is not None or v_scale is not None):
            raise NotImplementedError(_QUANTIZED_ON_OP_PATH)
        if result is None and out is not None:
            raise ValueError(_OUT_ON_OP_PATH)
        if result is not None:
            o, lse = result
        else:
            # The op takes [B, H, N, D] views; FlashAttention-2's token-major arrays are swapped.
            views = [None if x is None or not _token_major else x.transpose(1, 2) for x in (q, k_cache, v_cache, k, v)]
            o, lse = _torch_attention_with_kvcache(
                *(x if not _token_major else view for x, view in zip((q, k_cache, v_cache, k, v), views)),
                cache_seqlens, block_table, rotary_cos, rotary_sin, interleaved, scale, is_causal, left, right,
                softcap, alibi_slopes, sinks, cache_batch_idx, cache_leftpad, _rotary_fa2)
            if _token_major:  # FlashAttention-2's out is a contiguous [B, Nq, H, D], as the direct call's
                o = o.transpose(1, 2).contiguous()
    else:
        o, lse = _C.kvcache_arrays(q, k_cache, v_cache, k, v, cache_seqlens, block_table, rotary_cos,
                                   rotary_sin, interleaved, scale, is_causal, left, right, threads,
                                   return_lse, o=out, softcap=softcap, alibi_slopes=alibi_slopes,
                                   sinks=sinks, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                                   rotary_fa2_positions=_rotary_fa2, token_major=_token_major,
                                   k_scale=k_scale, v_scale=v_scale)
    return (o, lse) if return_lse else o


_QUANTIZED_ON_OP_PATH = ("k_scale, v_scale: quantized KV caches are not supported when torch can observe "
                         "the call (an input that requires grad with grad mode on, a tensor subclass, "
                         "tracing or torch.compile); call eagerly")


_OUT_ON_OP_PATH = ("out: not supported when torch can observe the call (an input that requires grad "
                   "with grad mode on, a tensor subclass, tracing or torch.compile); call without out")


def inference_cache_message(name):
    """The error for an inference tensor appended to outside inference mode, worded as
    _tileattn.kvcache_arrays words it (array_view.cpp)."""
    return (f"{name}: is an inference tensor (created under torch.inference_mode()), which torch "
            "does not let anything update in place outside inference mode; call inside "
            "torch.inference_mode(), or pass a clone made outside it")


def _kvcache_tensors(q, k_cache, v_cache, k, v, cache_seqlens, block_table, rotary_cos, rotary_sin,
                     alibi_slopes, sinks, cache_batch_idx, cache_leftpad):
    """(name, x) pairs of attention_with_kvcache's array arguments, for _arrays.on_meta."""
    return (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
            ("cache_seqlens", cache_seqlens), ("block_table", block_table), ("rotary_cos", rotary_cos),
            ("rotary_sin", rotary_sin), ("alibi_slopes", alibi_slopes), ("sinks", sinks),
            ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad))


def op_arguments(q, k_cache, v_cache, k, v, cache_seqlens, block_table, rotary_cos, rotary_sin,
                 softmax_scale, cache_batch_idx=None, cache_leftpad=None, alibi_slopes=None, sinks=None):
    """The arguments of the custom op torch.ops.tileattn.attention_with_kvcache, checked in
    Python on the tensors' metadata (this path runs under tracing, with fake tensors):
    (cache_seqlens as a private int32 tensor [B], block_table an integer tensor [B, max_pages] or None,
    rotary_cos, rotary_sin float32 contiguous or None, softmax_scale as a float). The same
    checks and messages as _tileattn.kvcache_arrays, which the direct path calls. alibi_slopes
    and sinks (from as_alibi_slopes / as_sinks) are checked, not returned: the op hands the
    kernel bare pointers to them, so their shapes are checked here."""
    torch = _arrays.torch_module()
    fw = _arrays.framework("q", q)
    arrays = {"k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v, "block_table": block_table,
              "rotary_cos": rotary_cos, "rotary_sin": rotary_sin, "cache_batch_idx": cache_batch_idx,
              "cache_leftpad": cache_leftpad, "alibi_slopes": alibi_slopes, "sinks": sinks}
    if not isinstance(cache_seqlens, (int, np.integer)) and cache_seqlens is not None:
        arrays["cache_seqlens"] = cache_seqlens
    for name, x in arrays.items():
        if (x is not None or name in ("k_cache", "v_cache")) and _arrays.framework(name, x) != fw:
            raise TypeError(f"{name}: must be a {fw} array like q")
    if (k is None) != (v is None):
        raise ValueError("k, v: give both new keys and new values, or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos, rotary_sin: give both tables or neither")
    if fw == "torch":
        meta = _arrays.on_meta([("q", q)] + list(arrays.items()))  # all on meta: shape inference
        for name, x in arrays.items():
            if x is not None:
                _arrays.check_torch_device(name, x, meta)
        dtype_code = _arrays.torch_dtype_code
    else:
        dtype_code = _arrays.numpy_dtype_code
    _arrays.check_rank("q", q, 4, "[B, H, Nq, D]")
    code = dtype_code("q", q)
    paged = block_table is not None
    cache_what = "[num_pages, Hkv, page_size, D]" if paged else "[B, Hkv, capacity, D]"
    for name in ("k_cache", "v_cache") + (("k", "v") if k is not None else ()):
        x = arrays[name]
        _arrays.check_rank(name, x, 4, cache_what if "cache" in name else "[B, Hkv, Nnew, D]")
        if dtype_code(name, x) != code:
            raise TypeError(f"{name}: dtype {x.dtype} differs from q's {q.dtype}")
    # V's head dim may differ from K's (DeepSeek MLA: 576 / 512); the rest of the shapes match.
    if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} must equal k_cache's {tuple(k_cache.shape)} "
                         "but for the head dim (the last dimension)")
    b, h, nq, d = q.shape
    hk = k_cache.shape[1]
    if k_cache.shape[3] != d:
        raise ValueError(f"k_cache: head_dim {k_cache.shape[3]} differs from q's {d}")
    if hk < 1 or h % hk:
        raise ValueError(f"k_cache: {hk} heads must divide q's {h} heads (GQA/MQA)")
    if not paged and cache_batch_idx is None and k_cache.shape[0] != b:
        raise ValueError(f"k_cache: batch {k_cache.shape[0]} differs from q's {b}")
    if k is not None:
        if tuple(v.shape[:3]) != tuple(k.shape[:3]) or v.shape[3] != v_cache.shape[3]:
            raise ValueError(f"v: shape {tuple(v.shape)} must equal k's {tuple(k.shape)} but for the head dim, "
                             f"which is v_cache's ({v_cache.shape[3]})")
        if (k.shape[0], k.shape[1], k.shape[3]) != (b, hk, d):
            raise ValueError(f"k: expected [B, Hkv, Nnew, D] = [{b}, {hk}, Nnew, {d}], got {tuple(k.shape)}")
    if alibi_slopes is not None:
        check_alibi_shape(alibi_slopes, b, h)
    if sinks is not None:
        check_sinks_shape(sinks, h)

    # Under tracing the tensors are fake: only metadata is checked here, and the torch op checks
    # the lengths' values when it runs (op_seqlens).
    if fw == "torch":
        seqlens = _seqlens_tensor(torch, cache_seqlens, b, paged, k is not None, k_cache)
    else:
        seqlens = torch.from_numpy(_private_seqlens(cache_seqlens, b, paged, k is not None, k_cache))
    # The table is narrowed to int32 by the op (op_block_table), where its values can be checked.
    table = _integer_rows("block_table", block_table, b) if paged else None
    cos = _float32_table("rotary_cos", rotary_cos)
    sin = _float32_table("rotary_sin", rotary_sin)
    if cos is not None and tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"rotary_sin: shape {tuple(sin.shape)} must equal rotary_cos's {tuple(cos.shape)}")
    scale = parse_scale(softmax_scale, d)
    per_sequence = tuple(None if x is None else _as_torch(_integer_vector(name, x, b))
                         for name, x in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)))
    return (seqlens, _as_torch(table), _as_torch(cos), _as_torch(sin), scale) + per_sequence


def _check_integer_dtype(name, x):
    """TypeError naming `name` unless x (torch or NumPy) holds integers (bool is not one)."""
    if _arrays.is_torch(x):
        torch = _arrays.torch_module()
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name}: expected an integer tensor, got dtype {x.dtype}")
    elif x.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got dtype {x.dtype}")


def _integer_vector(name, x, batch):
    """Checks an integer [B] array on its metadata (traceable); the op narrows it to int32."""
    _check_integer_dtype(name, x)
    if tuple(x.shape) != (batch,):
        raise ValueError(f"{name}: expected shape [B] = ({batch},), got {tuple(x.shape)}")
    return x


def op_int32_vector(name, x):
    """The torch op's [B] integer tensor as int32 contiguous, values checked to fit."""
    if x is None:
        return None
    torch = _arrays.torch_module()
    if x.dtype == torch.int32:
        return x.contiguous()
    values = x.detach().numpy().astype(np.int64)
    info = np.iinfo(np.int32)
    bad = np.flatnonzero((values < info.min) | (values > info.max))
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}] = {values[bad[0]]} does not fit in int32")
    return torch.from_numpy(values.astype(np.int32))


def _as_torch(x):
    if x is None or _arrays.is_torch(x):
        return x
    return _arrays.torch_module().from_numpy(x)


def _to_numpy(x):
    return x.detach().numpy() if _arrays.is_torch(x) else np.asarray(x)


def _private_seqlens(cache_seqlens, batch, paged, appending, k_cache):
    """A fresh int32 [B] copy: the kernel advances it, the caller's stays as it was."""
    if cache_seqlens is None:
        if paged or appending:
            raise ValueError("cache_seqlens: required with block_table or when appending k/v")
        return np.full(batch, k_cache.shape[2], dtype=np.int32)
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, bool):
        values = np.full(batch, int(cache_seqlens), dtype=np.int64)
    else:
        values = _to_numpy(cache_seqlens)
        if values.dtype.kind not in "iu":
            raise TypeError(f"cache_seqlens: expected an int or an integer array, got dtype {values.dtype}")
        if values.shape != (batch,):
            raise ValueError(f"cache_seqlens: expected shape [B] = ({batch},), got {values.shape}")
    if values.size and (values.min() < 0 or values.max() > np.iinfo(np.int32).max):
        raise ValueError("cache_seqlens: entries must be in 0 .. 2^31 - 1")
    return values.astype(np.int32)  # always a copy


def _seqlens_tensor(torch, cache_seqlens, batch, paged, appending, k_cache):
    """cache_seqlens for the torch op as an integer tensor [B], checked on its metadata only
    (traceable: no value is read); op_seqlens checks the values when the op runs."""
    if cache_seqlens is None:
        if paged or appending:
            raise ValueError("cache_seqlens: required with block_table or when appending k/v")
        return torch.full((batch,), int(k_cache.shape[2]), dtype=torch.int64)
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, bool):
        return torch.full((batch,), int(cache_seqlens), dtype=torch.int64)
    if cache_seqlens.is_floating_point() or cache_seqlens.is_complex() or cache_seqlens.dtype == torch.bool:
        raise TypeError(f"cache_seqlens: expected an int or an integer array, got dtype {cache_seqlens.dtype}")
    if tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(f"cache_seqlens: expected shape [B] = ({batch},), got {tuple(cache_seqlens.shape)}")
    return cache_seqlens


def op_seqlens(cache_seqlens):
    """The torch op's lengths (an integer tensor [B]) as the kernel's private int32 copy,
    values checked (the op runs on real tensors)."""
    return _private_seqlens(cache_seqlens, cache_seqlens.shape[0], False, False, None)


def _integer_rows(name, x, batch):
    """Checks an integer table [B, max_pages] on its metadata (traceable: no value is read)."""
    _check_integer_dtype(name, x)
    if x.ndim != 2 or x.shape[0] != batch:
        raise ValueError(f"{name}: expected shape [B, max_pages] with B = {batch}, got {tuple(x.shape)}")
    return x


def op_block_table(block_table):
    """The torch op's block table (an integer tensor [B, max_pages], or None) as the kernel
    reads it: C-contiguous int32, the table itself when it already is one. A wider table's
    entries are checked first (the op runs on real tensors): narrowing would wrap 2^32 + 3 to
    page 3. The same check and message as _tileattn.kvcache_arrays."""
    if block_table is None:
        return None
    torch = _arrays.torch_module()
    if block_table.dtype == torch.int32:
        return block_table.contiguous()
    values = block_table.detach().numpy()
    info = np.iinfo(np.int32)
    bad = np.argwhere((values < info.min) | (values > info.max))
    if bad.size:
        i, j = bad[0]
        raise ValueError(f"block_table[{i}, {j}] = {values[i, j]} does not fit in int32 "
                         "(the kernel's page indices)")
    return torch.from_numpy(values.astype(np.int32))


def _float32_table(name, x):
    """Dense float32 [positions, rotary_dim / 2], the table itself when it already is one."""
    if x is None:
        return None
    if _arrays.is_torch(x):
        if not x.is_floating_point():
            raise TypeError(f"{name}: expected a float tensor, got dtype {x.dtype}")
        x = x.detach().float().contiguous()
    else:
        if x.dtype.kind != "f":
            raise TypeError(f"{name}: expected a float array, got dtype {x.dtype}")
        x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected [positions, rotary_dim / 2], got shape {tuple(x.shape)}")
    return x


def kvcache_into(q, k_cache, v_cache, k, v, seqlens, block_table, cos, sin, interleaved, scale,
                 causal, window_left, window_right, o, lse, softcap=0.0, alibi_slopes=None, sinks=None,
                 cache_batch_idx=None, cache_leftpad=None, rotary_fa2=False):
    """Runs the C++ attention_with_kvcache; seqlens (int32 [B]) is advanced in place."""
    addr, es = _arrays.address, _arrays.element_strides
    b, h, nq, d = q.shape
    hk = k_cache.shape[1]
    paged = block_table is not None
    if paged:
        cache = (0, block_table.shape[1], k_cache.shape[2], k_cache.shape[0])
        table_addr = addr(block_table)  # C-contiguous (see _int32_rows)
    else:
        cache = (k_cache.shape[2], 0, 0, 0)
        table_addr = 0
    if k is not None:
        n_new, k_addr, k_strides, v_addr, v_strides = k.shape[2], addr(k), es("k", k), addr(v), es("v", v)
    else:
        n_new, k_addr, k_strides, v_addr, v_strides = 0, 0, (0, 0, 0, 1), 0, (0, 0, 0, 1)
    if cos is not None:
        rotary, cos_addr, sin_addr = (2 * cos.shape[1], cos.shape[0]), addr(cos), addr(sin)
    else:
        rotary, cos_addr, sin_addr = (0, 0), 0, 0
    _C.attention_with_kvcache(
        _kernel.dtype_code(q), (b, h, hk, d, nq, n_new), addr(q), es("q", q), addr(o), es("o", o),
        addr(lse), es("lse", lse), addr(k_cache), es("k_cache", k_cache), addr(v_cache),
        es("v_cache", v_cache), cache, addr(seqlens), table_addr, k_addr, k_strides, v_addr,
        v_strides, cos_addr, sin_addr, rotary, interleaved, scale, causal, window_left,
        window_right, _kernel._settings["threads"], softcap=float(softcap),
        alibi_slopes=alibi_address(alibi_slopes)[0], alibi_batch_stride=alibi_address(alibi_slopes)[1],
        sinks=sinks_address(sinks),
        cache_batch_idx=0 if cache_batch_idx is None else addr(cache_batch_idx),
        cache_batch=0 if cache_batch_idx is None else k_cache.shape[0],
        cache_leftpad=0 if cache_leftpad is None else addr(cache_leftpad), rotary_fa2_positions=rotary_fa2,
        v_head_dim=v_cache.shape[3])
