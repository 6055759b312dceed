"""Calls into the C++ kernels (tileattn._tileattn) on arrays the caller owns.

The arrays stay referenced by the caller's frame for the whole call (the
binding releases the GIL while computing, so nothing else frees them).
"""
import operator

from . import _arrays
from . import _tileattn as _C
from ._problem import (MASK_ADDITIVE, MASK_BOOLEAN, MASK_NONE, alibi_address, heads_rows, sinks_address,
                       to_kernel_order)

_settings = {"threads": 0}
_MAX_THREADS = 2**31 - 1  # the bindings take a C int: a larger count would fail every later call


def set_num_threads(threads):
    """Threads tileattn's kernels use; 0 (the default) means every hardware thread. On
    PyTorch's OpenMP threads (set_thread_runtime) at most torch.get_num_threads() run."""
    if isinstance(threads, bool):
        raise TypeError("threads: expected an int >= 0, got bool")
    try:
        threads = operator.index(threads)  # int, numpy.int64, a 0-d integer tensor
    except TypeError:
        raise TypeError(f"threads: expected an int >= 0, got {type(threads).__name__}") from None
    if not 0 <= threads <= _MAX_THREADS:
        raise ValueError(f"threads: expected an int in 0 .. 2^31 - 1, got {threads!r}")
    _settings["threads"] = threads


def set_bf16_probabilities(enabled):
    """bf16 inputs on the AMX / AVX512-BF16 rungs: round the softmax probabilities P to bf16
    for the P @ V product, as FlashAttention-2 and PyTorch's and OpenVINO's CPU SDPA do.
    Faster (one bf16 product instead of two, 1.3-1.4x measured), with an error of up to
    2^-8 of (P @ |V|) per output element, outside tileattn's accuracy promise
    (docs/accuracy.md); the autograd backward then rounds P and dS to bf16 too, and
    attention_with_kvcache rounds P in its packed products (prefill; decode steps stacking more
    than 8 query rows per KV head, as MLA's do) and, on the AVX512-BF16 rung of a CPU with
    AVX512-VBMI (e.g. AMD Zen 4 and later), in the few-rows products of smaller decode steps of a
    bf16, fp8 e4m3 or int8 cache; on the AVX-512 rung of a CPU with AVX512-VNNI (e.g. Intel
    Xeons without AMX), an int8 cache's few-rows products run on vpdpwssd with Q and P rounded
    to 16-bit integers, and on the AMX rung its scores with Q so rounded (docs/accuracy.md). Process-wide, for every later call
    (flash_attention, the drop-ins, the transformers integration, attention_with_kvcache);
    False (the default) keeps P at fp32 precision. Changes nothing for fp32 and fp16 inputs,
    on the fp32 rungs (but for that int8 decode), or in the AMX rung's few-rows P V."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected a bool, got {type(enabled).__name__}")
    _C.set_bf16_probabilities(enabled)


def get_bf16_probabilities():
    """The value set_bf16_probabilities() set (False by default)."""
    return bool(_C.get_bf16_probabilities())


_THREAD_RUNTIMES = ("auto", "openmp", "pool")
_runtime = {"chosen": None}  # set_thread_runtime's choice; None: TILEATTN_THREAD_RUNTIME's, else "auto"


def set_thread_runtime(runtime):
    """Whose threads run tileattn's kernels: "openmp", the OpenMP runtime PyTorch loaded
    (its intra-op threads, which poll for the next operation for milliseconds after each
    one, so a call right after a projection starts on all of them at once; at most
    torch.get_num_threads() of them); "pool", tileattn's own threads (a worker that sleeps
    50 us after each call); or "auto" (the default), "openmp" once PyTorch is in use with
    its OpenMP parallel backend, else "pool". The environment variable
    TILEATTN_THREAD_RUNTIME gives the default choice. Process-wide; results are the same
    either way (docs/python.md, "Threads"). RuntimeError for "openmp" when no OpenMP runtime
    is loaded (nothing changes then)."""
    if runtime not in _THREAD_RUNTIMES:
        raise ValueError(f"runtime: expected one of {', '.join(map(repr, _THREAD_RUNTIMES))}, got {runtime!r}")
    if runtime == "openmp" and _C.use_openmp_runtime() is None:
        raise RuntimeError("runtime: 'openmp' needs an OpenMP runtime loaded in this process "
                           "(PyTorch loads one: import torch first); none is")
    if runtime == "pool":
        _C.use_thread_pool()
    _runtime["chosen"] = runtime
    if runtime == "auto":
        apply_auto_thread_runtime()


def get_thread_runtime():
    """The threads tileattn's kernels run on now: "pool", or "openmp (<library>)"."""
    return _C.thread_runtime()


def apply_auto_thread_runtime(torch_loading=False):
    """Applies the choice (set_thread_runtime's, else TILEATTN_THREAD_RUNTIME's, else "auto"):
    "auto" takes PyTorch's OpenMP runtime once torch is imported and parallelizes with OpenMP
    (torch.__config__.parallel_info()), else the pool. Called at import and when tileattn's
    torch ops load (torch_loading: at the first call with tensors, or at import when torch
    came first). A TILEATTN_THREAD_RUNTIME=openmp that finds no OpenMP runtime keeps the pool,
    with a warning once torch is loading (a NumPy-only process may have none)."""
    import sys
    chosen = _runtime["chosen"] or _env_thread_runtime()
    if chosen == "pool":
        _C.use_thread_pool()
        return
    if chosen == "openmp":
        if _C.use_openmp_runtime() is None and torch_loading:
            import warnings
            warnings.warn("TILEATTN_THREAD_RUNTIME=openmp: no OpenMP runtime is loaded in this process; "
                          "tileattn's kernels run on its own thread pool", RuntimeWarning, stacklevel=2)
        return
    torch = sys.modules.get("torch")
    if torch is not None and "parallel backend: OpenMP" in torch.__config__.parallel_info():
        if _C.use_openmp_runtime() is not None:
            return
    _C.use_thread_pool()


def _env_thread_runtime():
    import os
    value = os.environ.get("TILEATTN_THREAD_RUNTIME", "auto") or "auto"
    if value not in _THREAD_RUNTIMES:
        raise ValueError(f"TILEATTN_THREAD_RUNTIME: expected one of {', '.join(_THREAD_RUNTIMES)}, got {value!r}")
    return value


def get_num_threads():
    """Threads tileattn's kernels will use: the count set (at most the hardware's), or every
    hardware thread when none was set; on PyTorch's OpenMP threads (get_thread_runtime()) at
    most torch.get_num_threads() (OpenMP's omp_get_max_threads on the calling thread)."""
    hardware = _C.hardware_threads()
    threads = _settings["threads"]
    threads = hardware if threads == 0 or threads > hardware else threads
    team = _C.thread_runtime_max_threads()
    return min(threads, team) if team else threads


def dtype_code(x):
    if _arrays.is_torch(x):
        return _arrays.torch_dtype_code("q", x)
    return _arrays.numpy_dtype_code("q", x)


def mask_kind(mask):
    if mask is None:
        return MASK_NONE
    dt = str(mask.dtype)
    return MASK_BOOLEAN if dt in ("bool", "torch.bool") else MASK_ADDITIVE


def merge_into(o_a, lse_a, o_b, lse_b, o_out, lse_out):
    """merge_states on [B, H, N, D] outputs and [B, H, N] fp32 log-sum-exps."""
    addr, es = _arrays.address, _arrays.element_strides
    _C.merge_states(dtype_code(o_a), tuple(o_a.shape),
                    addr(o_a), es("o_a", o_a), addr(lse_a), es("lse_a", lse_a),
                    addr(o_b), es("o_b", o_b), addr(lse_b), es("lse_b", lse_b),
                    addr(o_out), es("o", o_out), addr(lse_out), es("lse", lse_out))


def _packed(name, x):
    """A packed varlen array [total, H, D] as the kernel's 4-D [1, H, total, D] view:
    (shape in [batch, head, row, dim] order, element strides, batch stride 0)."""
    s = _arrays.element_strides(name, x)
    return (1, x.shape[1], x.shape[0], x.shape[2]), (0, s[1], s[0], s[2])


def backward_into(q, k, v, o, grad_o, lse, dq, dk, dv, mask, causal, window_left, window_right,
                  scale, dropout_p, seed, layout, softcap=0.0, alibi_slopes=None, sinks=None, d_sinks=None,
                  cu_q=None, cu_k=None):
    """Runs attention_backward: writes dq, dk, dv (layouts like q, k, v) and d_sinks (float32
    [H], when given with sinks) for the forward call with these options (same mask, scale,
    dropout_p, seed and sinks). With cu_q / cu_k (int32 contiguous [B + 1]): packed varlen
    arrays [total, H, D], lse [H, total_q]."""
    addr, es = _arrays.address, _arrays.element_strides
    if cu_q is not None:
        views = {name: _packed(name, x) for name, x in
                 (("q", q), ("k", k), ("v", v), ("o", o), ("grad_o", grad_o), ("dq", dq), ("dk", dk), ("dv", dv))}
        (_, h, nq, d), (_, hk, nk, _) = views["q"][0], views["k"][0]
        ls = es("lse", lse)
        alibi_addr, alibi_stride = alibi_address(alibi_slopes)
        _C.backward(dtype_code(q), (cu_q.shape[0] - 1, h, hk, nq, nk, d),
                    *(x for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("grad_o", grad_o))
                      for x in (addr(t), views[name][1])),
                    addr(lse), (0, ls[0], ls[1]),
                    *(x for name, t in (("dq", dq), ("dk", dk), ("dv", dv)) for x in (addr(t), views[name][1])),
                    MASK_NONE, 0, (0, 0, 0, 1), bool(causal), int(window_left), int(window_right),
                    float(scale), float(dropout_p), int(seed), _settings["threads"], softcap=float(softcap),
                    alibi_slopes=alibi_addr, alibi_batch_stride=alibi_stride, sinks=sinks_address(sinks),
                    d_sinks=sinks_address(d_sinks), cu_seqlens_q=addr(cu_q),
                    cu_seqlens_k=addr(cu_k), v_head_dim=v.shape[-1])
        return
    b, h, nq, d = heads_rows(tuple(q.shape), layout)
    _, hk, nk, _ = heads_rows(tuple(k.shape), layout)
    kind = mask_kind(mask)
    if kind != MASK_NONE:
        m_addr = addr(mask)
        m_strides = _arrays.broadcast_strides("attn_mask", mask, (b, h, nq, nk), ("B", "H", "Nq", "Nk"))
    else:
        m_addr, m_strides = 0, (0, 0, 0, 1)
    order = to_kernel_order
    alibi_addr, alibi_stride = alibi_address(alibi_slopes)
    _C.backward(dtype_code(q), (b, h, hk, nq, nk, d),
                addr(q), order(es("q", q), layout), addr(k), order(es("k", k), layout),
                addr(v), order(es("v", v), layout), addr(o), order(es("o", o), layout),
                addr(grad_o), order(es("grad_o", grad_o), layout), addr(lse), es("lse", lse),
                addr(dq), order(es("dq", dq), layout), addr(dk), order(es("dk", dk), layout),
                addr(dv), order(es("dv", dv), layout), kind, m_addr, m_strides, bool(causal),
                int(window_left), int(window_right), float(scale), float(dropout_p), int(seed),
                _settings["threads"], softcap=float(softcap), alibi_slopes=alibi_addr,
                alibi_batch_stride=alibi_stride, sinks=sinks_address(sinks), d_sinks=sinks_address(d_sinks),
                v_head_dim=v.shape[-1])
