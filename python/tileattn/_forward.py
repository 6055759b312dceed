"""tileattn.flash_attention: the public forward entry point for NumPy and torch."""
import numpy as np

from . import _arrays, _kernel
from . import _tileattn as _C
from ._problem import (as_alibi_slopes, as_sinks, causal_bias_options, is_causal_bias, parse_bool, parse_options,
                       parse_softcap)

# torch.Tensor, _torch_ops.dynamo_is_tracing and the custom op path _torch_ops.flash_attention,
# bound at the first call with torch tensors (tileattn never imports torch itself):
_torch_tensor = _is_compiling = _torch_flash_attention = None


def _bind_torch():
    global _torch_tensor, _is_compiling, _torch_flash_attention
    _torch_tensor, _is_compiling, _torch_flash_attention = _arrays.torch_entry_point("flash_attention")


def flash_attention(q, k, v, attn_mask=None, dropout_p=0.0, softmax_scale=None, is_causal=False,
                    window=None, layout="bhsd", return_lse=False, out=None, softcap=0.0,
                    alibi_slopes=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    max_seqlen_q=None, max_seqlen_k=None, return_attn_probs=False):
    """Exact attention ``softmax(softmax_scale * q @ k^T + mask) @ v``, FlashAttention-2 style on the CPU.

    Args:
        q: queries, ``[B, H, Nq, D]`` (layout "bhsd") or ``[B, Nq, H, D]`` ("bshd").
        k, v: keys and values, ``[B, Hkv, Nk, D]`` / ``[B, Nk, Hkv, D]``; v may have its own
            head dim ``Dv`` (D is 1..576, Dv 1..512: DeepSeek MLA's 192 / 128 and 576 / 512), and
            the output then has q's shape with ``Dv`` last. ``Hkv`` must divide
            ``H`` (GQA; ``Hkv == 1`` is MQA): query head ``h`` uses kv head ``h // (H // Hkv)``,
            as ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` does.
            q, k, v are all NumPy arrays (float32 or float16) or all torch CPU tensors
            (float32, float16 or bfloat16), of one dtype, with any strides (negative and
            zero NumPy strides included). They are read in place: never copied.
        attn_mask: None; a boolean array (True = keep); an additive float array (added to the
            scaled scores, -inf = drop); or a ``(left, right)`` tuple meaning a sliding window
            (same as ``window``). Arrays broadcast to ``[B, H, Nq, Nk]`` (e.g. ``[Nq, Nk]`` or
            ``[B, 1, Nq, Nk]``): size-1 dims are read with stride 0, never expanded. PyTorch's
            ``torch.nn.attention.bias.causal_lower_right(Nq, Nk)`` is ``is_causal=True``;
            ``causal_upper_left`` is the top-left causal mask. A bool or
            float32 mask is read in place; an additive mask of another float dtype is
            converted to float32 first (one copy of the mask, the only copy this function makes).
        dropout_p: dropout probability on the attention weights, in [0, 1): weights are zeroed
            with this probability and the kept ones scaled by ``1 / (1 - dropout_p)``. The
            pattern comes from a counter-based generator seeded from ``torch.randint`` (torch
            inputs) or ``numpy.random`` (NumPy inputs), so ``torch.manual_seed`` /
            ``numpy.random.seed`` make it reproducible; the backward replays the same pattern.
        softmax_scale: multiplies ``q @ k^T``; None means ``1 / sqrt(D)``.
        is_causal: key ``j`` is visible to query ``i`` iff ``j <= i + (Nk - Nq)``: the causal
            mask is aligned to the BOTTOM-RIGHT of the score matrix, as in FlashAttention-2 and
            ``torch.nn.attention.bias.causal_lower_right``. PyTorch's
            ``scaled_dot_product_attention(is_causal=True)`` aligns it to the TOP-LEFT; the two
            agree only when ``Nq == Nk``.
        window: ``(left, right)`` sliding window, inclusive, bottom-right aligned like the
            causal mask: query ``i`` sees keys ``i + off - left .. i + off + right`` with
            ``off = Nk - Nq``; -1 (or None) is unbounded on that side. Combines with
            ``is_causal`` and ``attn_mask`` (all must allow a key).
        layout: "bhsd" or "bshd", for q, k, v and the output alike. attn_mask is always
            ``[B, H, Nq, Nk]``.
        return_lse: also return the log-sum-exp (natural log) of each row's scaled, masked
            scores, float32 ``[B, H, Nq]``; -inf for a row that sees no key.
        out: optional output array to write instead of allocating one: q's shape (``Dv`` last), dtype and
            framework, writable, positive strides (negative or zero ones are refused), sharing
            no element with any input (views of one buffer that interleave, such as q, k, v
            and out of one ``[B, N, 4, H, D]`` array, share none). A decode loop that reuses one saves the allocation
            (about half of the call's time outside the kernel right after a decode-sized kernel,
            docs/python.md). With torch tensors only for
            calls that autograd, tracers and torch.compile do not see (no input requires
            grad, or under ``torch.no_grad()``; no dropout); otherwise ValueError. For fp16 /
            bf16 inputs ``out`` may be float32: it then gets O before its rounding to 16 bits
            (C++ ``fp32_output``; rounded, it equals the 16-bit result bit for bit), for
            results merged further (``merge_states`` in float32) before one rounding.
        softcap: soft cap c >= 0 (FlashAttention-2's ``softcap``): each scaled score x becomes
            ``c * tanh(x / c)`` before the mask is applied; 0 (the default) is off. Gradients
            go through it (``1 - tanh^2``).
        alibi_slopes: None, or float32 ``[H]`` or ``[B, H]`` ALiBi slopes (FlashAttention-2's):
            ``-slope * |i + Nk - Nq - j|`` is added to each score after the soft cap. The
            slopes get no gradient.
        sinks: None, or ``[H]`` attention-sink logits (gpt-oss, StreamingLLM; FlashAttention's and
            vLLM's ``sinks``), one per query head: ``exp(sinks[h])`` joins each row's softmax
            denominator and carries no value, ``o = sum_j exp(s_j) v_j / (exp(sinks[h]) +
            sum_j exp(s_j))``, and the lse includes it. The sink is used as given: not
            multiplied by ``softmax_scale``, not soft-capped, no ALiBi bias (as Hugging Face's
            gpt-oss eager attention). A row that sees no key gets zeros and lse ``sinks[h]``.
            Read as float32; with torch, ``sinks.requires_grad`` gives ``sinks.grad``.

        cu_seqlens_q, cu_seqlens_k: packed variable-length batch (FlashAttention-2's varlen):
            integer ``[B + 1]`` prefix sums of the sequences' query / key lengths (int32 is read
            in place, another integer type converted). q is then ``[total_q, H, D]``, k and v
            ``[total_k, Hkv, D]``, o ``[total_q, H, D]`` and lse ``[H, total_q]``; sequence
            ``b`` is rows ``cu[b] .. cu[b + 1] - 1``, and causal / window / ALiBi align
            bottom-right per sequence. Both or neither; ``layout`` is ignored; no ``attn_mask``
            (NotImplementedError). Autograd through the C++ backward kernel, which takes the
            same packed rows.
        max_seqlen_q, max_seqlen_k: optional ints (FlashAttention-2 requires them; the kernel
            does not need them): when given they must be at least the longest sequence.
        return_attn_probs: also return the attention probabilities, float32
            ``[B, H, Nq, Nk]`` (varlen: ``[B, H, max Nq, max Nk]``, zero-padded): the weights the
            forward multiplies V with, after dropout (dropped 0, kept scaled by ``1 / (1 - p)``),
            0 outside the mask; recomputed in float64 by ``attention_probabilities`` (for small
            shapes: at most 2^28 entries). No gradient flows through them.

    Returns:
        ``o`` in q's layout, dtype and framework (a freshly allocated contiguous array, or
        ``out``, which may be float32 for 16-bit inputs), ``(o, lse)`` with
        ``return_lse=True``, ``(o, probs)`` with
        ``return_attn_probs=True`` and ``(o, lse, probs)`` with both. Rows that see no key are
        zeros.

    With torch tensors the call goes through the custom op ``torch.ops.tileattn.flash_attention``
    (visible to torch.compile and tracing) and supports autograd for q, k and v, and for a float
    mask that requires grad (computed in PyTorch math, tileattn/_torch_backward.py; not with
    dropout). The backward is the C++ kernel (``torch.ops.tileattn.flash_attention_backward``),
    which recomputes the attention weights tile by tile from the saved log-sum-exp and replays
    the forward's dropout pattern. When the loss also uses the returned lse, the backward
    runs in PyTorch math instead (tileattn/_torch_backward.py; no dropout there).

    Errors: wrong shapes, dtypes, devices or layouts raise ValueError or TypeError naming the
    argument; features not built raise NotImplementedError.
    """
    if attn_mask is not None and is_causal_bias(attn_mask):
        shapes = tuple(tuple(getattr(x, "shape", ())) for x in (q, k))
        if any(len(shape) != 4 for shape in shapes):
            raise ValueError(f"attn_mask: a causal bias (torch.nn.attention.bias) needs 4-D q and k, got "
                             f"{shapes[0]} and {shapes[1]}")
        row = 1 if layout == "bshd" else 2
        attn_mask, is_causal = causal_bias_options(attn_mask, shapes[0][row], shapes[1][row], is_causal)
    if (cu_seqlens_q is not None or cu_seqlens_k is not None or return_attn_probs is not False
            or max_seqlen_q is not None or max_seqlen_k is not None):
        return _varlen_or_probs(q, k, v, attn_mask, dropout_p, softmax_scale, is_causal, window,
                                layout, return_lse, out, softcap, alibi_slopes, cu_seqlens_q,
                                cu_seqlens_k, max_seqlen_q, max_seqlen_k, return_attn_probs, sinks)
    # Python checks the scalar options; one C++ call checks the arrays (frameworks, ranks,
    # dtypes, devices, shapes, strides), allocates the outputs and runs the kernel.
    if (attn_mask is None and window is None and softmax_scale is None
            and type(dropout_p) is float and dropout_p == 0.0
            and (is_causal is True or is_causal is False)
            and type(layout) is str and layout == "bhsd"):
        # The decode call's options, tested in one expression: parse_options' five function
        # calls cost ~5 us right after a decode-sized kernel has evicted their code.
        mask, scale, causal, left, right, code = None, None, is_causal, -1, -1, 0
    else:
        mask, dropout_p, scale, causal, left, right, code = parse_options(
            attn_mask, dropout_p, softmax_scale, is_causal, window, layout)
    if return_lse is not False and return_lse is not True:
        return_lse = parse_bool("return_lse", return_lse)
    if type(softcap) is not float or softcap != 0.0:
        softcap = parse_softcap(softcap)
    if alibi_slopes is not None:
        alibi_slopes = as_alibi_slopes(alibi_slopes, q)
    if sinks is not None:
        shape = getattr(q, "shape", ())
        sinks = as_sinks(sinks, q, shape[2 if code == 1 else 1] if len(shape) == 4 else None)
    threads = _kernel._settings["threads"]
    if type(q) is not np.ndarray and (type(q) is _torch_tensor or _arrays.is_torch(q)):
        if _torch_tensor is None:
            _bind_torch()
        if dropout_p == 0.0 and not _is_compiling():
            # The common inference call: one C++ call, which declines (None) when torch could
            # observe the custom op (autograd, a tensor subclass, a tracer or mode); Dynamo
            # must see the is_compiling() test here, in Python.
            try:
                result = _C.forward_arrays(q, k, v, mask, code, causal, left, right, scale, 0.0, 0,
                                           threads, return_lse, o=out, eager_only=True, softcap=softcap,
                                           alibi_slopes=alibi_slopes, sinks=sinks)
            except ValueError:
                # Tensors on the meta device (shape inference) take the op, whose fake kernel
                # gives the outputs' shapes; any other device error stands.
                if not _arrays.on_meta((("q", q), ("k", k), ("v", v), ("attn_mask", mask),
                                        ("alibi_slopes", alibi_slopes), ("sinks", sinks))):
                    raise
                result = None
            if result is not None:
                return result if return_lse else result[0]
        if out is not None:
            raise ValueError(_OUT_ON_OP_PATH)
        o, lse = _torch_flash_attention(q, k, v, mask, dropout_p, scale, causal, left, right, code,
                                        return_lse, softcap, alibi_slopes, sinks)
        return (o, lse) if return_lse else o
    seed = int(np.random.randint(0, 2**62)) if dropout_p > 0 else 0
    o, lse = _C.forward_arrays(q, k, v, mask, code, causal, left, right, scale, dropout_p, seed,
                               threads, return_lse, o=out, softcap=softcap, alibi_slopes=alibi_slopes,
                               sinks=sinks)
    return (o, lse) if return_lse else o


_OUT_ON_OP_PATH = ("out: not supported when torch can observe the call (an input that requires grad "
                   "with grad mode on, dropout, a tensor subclass, tracing or torch.compile); call "
                   "without out, or under torch.no_grad()")


def _varlen_or_probs(q, k, v, attn_mask, dropout_p, softmax_scale, is_causal, window, layout,
                     return_lse, out, softcap, alibi_slopes, cu_q, cu_k, max_q, max_k, with_probs, sinks=None):
    """flash_attention with cu_seqlens and/or return_attn_probs (kept off the common path)."""
    mask, dropout_p, scale, causal, left, right, code = parse_options(
        attn_mask, dropout_p, softmax_scale, is_causal, window, layout)
    return_lse = parse_bool("return_lse", return_lse)
    with_probs = parse_bool("return_attn_probs", with_probs)
    softcap = parse_softcap(softcap)
    if (cu_q is None) != (cu_k is None):
        raise ValueError("cu_seqlens_q, cu_seqlens_k: give both or neither")
    if cu_q is None and (max_q is not None or max_k is not None):
        raise ValueError("max_seqlen_q, max_seqlen_k: only with cu_seqlens_q and cu_seqlens_k")
    max_q, max_k = check_max_seqlen("max_seqlen_q", max_q), check_max_seqlen("max_seqlen_k", max_k)
    if cu_q is not None:
        code = 1  # the packed arrays are token-major; the binding reads them as [1, total, H, D]
    alibi_slopes = as_alibi_slopes(alibi_slopes, q)
    if sinks is not None:  # [H]: packed arrays are [total, H, D]
        shape = getattr(q, "shape", ())
        sinks = as_sinks(sinks, q, shape[1] if cu_q is not None and len(shape) == 3 else
                         (shape[2 if code == 1 else 1] if len(shape) == 4 else None))
    threads = _kernel._settings["threads"]
    if _arrays.is_torch(q):
        if _torch_tensor is None:
            _bind_torch()
        from . import _torch_ops
        if out is not None:
            result = _C.forward_arrays(q, k, v, mask, code, causal, left, right, scale, dropout_p, 0,
                                       threads, return_lse, o=out, eager_only=True, softcap=softcap,
                                       alibi_slopes=alibi_slopes, sinks=sinks, cu_seqlens_q=cu_q,
                                       cu_seqlens_k=cu_k, with_probs=with_probs, max_seqlen_q=max_q,
                                       max_seqlen_k=max_k) if dropout_p == 0.0 and not _is_compiling() else None
            if result is None:
                raise ValueError(_OUT_ON_OP_PATH)
        else:
            result = _torch_ops.flash_attention(q, k, v, mask, dropout_p, scale, causal, left, right,
                                                code, return_lse, softcap, alibi_slopes, sinks, cu_q, cu_k,
                                                with_probs, max_q, max_k)
    else:
        seed = int(np.random.randint(0, 2**62)) if dropout_p > 0 else 0
        result = _C.forward_arrays(q, k, v, mask, code, causal, left, right, scale, dropout_p, seed,
                                   threads, return_lse, o=out, softcap=softcap, alibi_slopes=alibi_slopes,
                                   sinks=sinks, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, with_probs=with_probs,
                                   max_seqlen_q=max_q, max_seqlen_k=max_k)
    o, lse = result[0], result[1]
    outputs = (o,) + ((lse,) if return_lse else ()) + ((result[2],) if with_probs else ())
    return outputs if len(outputs) > 1 else o


def check_max_seqlen(name, value):
    """A given max_seqlen as an int >= 0 (-1: not given). FlashAttention-2 sizes its work from
    it; tileattn reads the lengths from cu_seqlens and checks (in C++, on the values) that it is
    at least the longest sequence."""
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if not 0 <= value < 2**63:
        raise ValueError(f"{name}: must be >= 0, got {value}")
    return int(value)
