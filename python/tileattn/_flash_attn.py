"""FlashAttention-2's Python entry points (flash_attn.flash_attn_interface) on tileattn's kernels:
flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache, with FlashAttention-2's
argument names, order, defaults, layouts ([B, N, H, D]; packed [total, H, D]; caches
[B_cache, S, Hkv, D] and pages [num_blocks, block_size, Hkv, D]) and return conventions. Thin
layers: every array is read in place by flash_attention / attention_with_kvcache (as a strided
view), never copied. docs/python.md lists where they differ from FlashAttention-2 and from the native API."""
import re

import numpy as np

from ._forward import check_max_seqlen, flash_attention
from ._kvcache import attention_with_kvcache
from ._problem import as_alibi_slopes, check_alibi_shape


def _window(window_size):
    """FlashAttention-2's window_size: (-1, -1) (the default) is no window; negative sides unbounded."""
    if window_size is None or tuple(window_size) == (-1, -1):
        return None
    left, right = window_size
    return (-1 if left is not None and left < 0 else left, -1 if right is not None and right < 0 else right)


def _fa2_lse(lse):
    """softmax_lse as FlashAttention-2 returns it: +inf for a row that sees no key (its kernels
    write INFINITY there, so that exp(s - lse) is 0 in the backward), where tileattn's is -inf."""
    if isinstance(lse, np.ndarray):
        return np.where(lse == -np.inf, np.float32(np.inf), lse)
    return lse.masked_fill(lse == float("-inf"), float("inf"))


def _fa2_probs(q, k, v, dropout_p, probs_kept, **options):
    """FlashAttention-2's S_dmask from tileattn's probabilities: the softmax, with the entries
    dropout removed negated (FlashAttention-2: "negative means that location was dropped").
    probs_kept: the probabilities after dropout (0 where dropped), from the forward's own seed."""
    if dropout_p == 0.0:
        return probs_kept
    probs = flash_attention(q, k, v, return_attn_probs=True, **options)[1]
    dropped = (probs_kept == 0) & (probs > 0)
    return -probs * dropped + probs * ~dropped


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """FlashAttention-2's ``flash_attn_func``: q ``[B, Nq, H, D]``, k, v ``[B, Nk, Hkv, D]``.

    causal aligns bottom-right; window_size ``(left, right)`` is inclusive, -1 unbounded; softcap
    and alibi_slopes (``[H]`` or ``[B, H]`` fp32) as in FlashAttention-2. deterministic is accepted
    and has no effect: tileattn's backward is always deterministic. Returns ``out [B, Nq, H, D]``,
    or ``(out, softmax_lse [B, H, Nq], S_dmask [B, H, Nq, Nk])`` with return_attn_probs
    (S_dmask: float32 probabilities, dropped entries negated; softmax_lse +inf for a row that sees
    no key, as FlashAttention-2's). Autograd for q, k, v.
    """
    window = None if window_size == (-1, -1) else _window(window_size)
    if not return_attn_probs:
        return flash_attention(q, k, v, None, dropout_p, softmax_scale, causal, window, "bshd", False, None,
                               softcap=softcap, alibi_slopes=alibi_slopes)
    options = dict(softmax_scale=softmax_scale, is_causal=causal, window=window, layout="bshd",
                   softcap=softcap, alibi_slopes=alibi_slopes)
    out, lse, probs = flash_attention(q, k, v, dropout_p=dropout_p, return_lse=True, return_attn_probs=True,
                                      **options)
    return out, _fa2_lse(lse), _fa2_probs(q, k, v, dropout_p, probs, **options)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
    """FlashAttention-2's ``flash_attn_varlen_func``: packed q ``[total_q, H, D]``, k, v
    ``[total_k, Hkv, D]``, cu_seqlens ``[B + 1]`` int32. max_seqlen_q / max_seqlen_k are checked to
    be at least the longest sequence. Returns ``out [total_q, H, D]``, or ``(out, softmax_lse
    [H, total_q], S_dmask [B, H, longest q, longest k])`` (FlashAttention-2 pads S_dmask to
    multiples of 128). Autograd for q, k, v.
    With block_table (torch tensors, as in FlashAttention-2): k, v are pages ``[num_blocks,
    block_size, Hkv, D]``, block_table ``[B, max_blocks]`` int32 names sequence b's pages, and
    sequence b's keys are the first ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` tokens of its
    pages; each sequence is one attention_with_kvcache call (nothing appended), inference only
    (no autograd, dropout or return_attn_probs: FlashAttention-2's backward has no block_table).
    """
    if block_table is not None:
        return _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                             softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                             block_table)
    window = None if window_size == (-1, -1) else _window(window_size)
    if not return_attn_probs:
        # Keywords from softcap on: the native signature grows there (sinks go after alibi_slopes).
        return flash_attention(q, k, v, None, dropout_p, softmax_scale, causal, window, "bhsd", False, None,
                               softcap=softcap, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                               cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    options = dict(softmax_scale=softmax_scale, is_causal=causal, window=window, softcap=softcap,
                   alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                   max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    out, lse, probs = flash_attention(q, k, v, dropout_p=dropout_p, return_lse=True, return_attn_probs=True,
                                      **options)
    return out, _fa2_lse(lse), _fa2_probs(q, k, v, dropout_p, probs, **options)


def _varlen_paged(q, k_pages, v_pages, cu_q, cu_k, max_q, max_k, dropout_p, softmax_scale, causal,
                  window_size, softcap, alibi_slopes, return_attn_probs, block_table):
    """flash_attn_varlen_func with block_table: one attention_with_kvcache call per sequence."""
    import torch
    if not all(isinstance(t, torch.Tensor) for t in (q, k_pages, v_pages, cu_q, cu_k, block_table)):
        raise TypeError("block_table: q, k, v, cu_seqlens_q, cu_seqlens_k and block_table must be torch tensors")
    if dropout_p != 0.0 or return_attn_probs:
        raise NotImplementedError("block_table: inference only here (no dropout_p, no return_attn_probs), "
                                  "as FlashAttention-2's backward has no block_table")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_pages, v_pages)):
        raise NotImplementedError("block_table: no autograd (FlashAttention-2's backward has no block_table); "
                                  "call under torch.no_grad()")
    if q.dim() != 3 or k_pages.dim() != 4 or v_pages.dim() != 4:
        raise ValueError(f"block_table: expected q [total_q, H, D] and pages k, v [num_blocks, block_size, Hkv, D], "
                         f"got q {tuple(q.shape)}, k {tuple(k_pages.shape)}, v {tuple(v_pages.shape)}")
    batch = cu_q.shape[0] - 1 if cu_q.dim() == 1 else -1
    if batch < 0 or cu_k.shape != cu_q.shape:
        raise ValueError(f"cu_seqlens_q, cu_seqlens_k: expected two [B + 1] arrays, got {tuple(cu_q.shape)} "
                         f"and {tuple(cu_k.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table: expected [B, max_blocks] with B = {batch}, got {tuple(block_table.shape)}")
    lengths_q = (cu_q[1:] - cu_q[:-1]).tolist()
    lengths_k = (cu_k[1:] - cu_k[:-1]).tolist()
    if int(cu_q[0]) != 0 or int(cu_k[0]) != 0 or min(lengths_q + lengths_k, default=0) < 0:
        raise ValueError("cu_seqlens_q, cu_seqlens_k: must start at 0 and not decrease")
    if int(cu_q[-1]) != q.shape[0]:
        raise ValueError(f"cu_seqlens_q: ends at {int(cu_q[-1])}, q has {q.shape[0]} rows")
    # A given max_seqlen is at least the longest sequence; None (as without block_table) is not checked.
    for name, given, lengths in (("max_seqlen_q", max_q, lengths_q), ("max_seqlen_k", max_k, lengths_k)):
        longest = max(lengths, default=0)
        if check_max_seqlen(name, given) >= 0 and given < longest:
            raise ValueError(f"{name}: {given} is less than the longest sequence ({longest})")
    window = None if window_size == (-1, -1) else _window(window_size)
    slopes = None
    if alibi_slopes is not None:  # [H] or [B, H] of the whole batch; each call gets its sequence's [H]
        slopes = as_alibi_slopes(alibi_slopes, q)
        check_alibi_shape(slopes, batch, q.shape[1])
    out = q.new_zeros(q.shape[:2] + (v_pages.shape[3],))
    for b in range(batch):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        if lengths_q[b] == 0:
            continue
        seq_slopes = slopes[b] if slopes is not None and slopes.dim() == 2 else slopes
        try:
            out[rows] = attention_with_kvcache(
                q[rows].unsqueeze(0), k_pages, v_pages, None, None, torch.tensor([lengths_k[b]], dtype=torch.int32),
                block_table[b:b + 1],
                None, None, False, softmax_scale, causal, window, False, None, softcap=softcap,
                alibi_slopes=seq_slopes, _token_major=True)[0]
        except ValueError as error:
            renamed = _name_sequence(str(error), b)
            if renamed == str(error):
                raise
            raise ValueError(renamed) from None
    return out


def _name_sequence(message, b):
    """A message of sequence b's one-sequence call, which knows it as sequence 0 with table row
    block_table[b:b + 1], reworded to name sequence b and row b of the caller's block_table."""
    message = re.sub(r"\bsequence 0\b", f"sequence {b}", message)
    return message.replace("block_table[0, ", f"block_table[{b}, ")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """FlashAttention-2's ``flash_attn_with_kvcache``: q ``[B, Nq, H, D]``; the cache
    ``[B_cache, S, Hkv, D]`` or, with block_table, pages ``[num_blocks, block_size, Hkv, D]``
    (read and appended in place, any block_size); k, v ``[B, Nnew, Hkv, D]``
    appended at cache_seqlens (which is not modified). Rotary tables rotate the new keys at
    positions cache_seqlens + t and the queries at cache_seqlens + t when causal or windowed,
    else all at cache_seqlens (FlashAttention-2's convention); they need k and v, as there.
    cache_batch_idx / cache_leftpad as in FlashAttention-2 (two appending sequences naming one
    cache row raise ValueError). num_splits is accepted and has no effect (tileattn splits the
    keys of a long cache by itself). Returns ``out [B, Nq, H, D]``, or ``(out, softmax_lse
    [B, H, Nq])`` (+inf for a row that sees no key, as FlashAttention-2's). No autograd
    (FlashAttention-2 has none either).
    """
    if rotary_cos is not None and k is None:
        raise ValueError("rotary_cos: rotary embedding needs new keys and values k, v to append "
                         "(as in FlashAttention-2)")
    if isinstance(cache_seqlens, bool):
        raise TypeError("cache_seqlens: expected an int or an integer array, got bool")
    # FlashAttention-2's token-major arrays are read in place (the binding swaps the head and
    # row strides), and the output is allocated [B, Nq, H, D], contiguous.
    result = attention_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens, block_table, rotary_cos, rotary_sin, rotary_interleaved,
        softmax_scale, causal, None if window_size == (-1, -1) else _window(window_size),
        return_softmax_lse, None, softcap=softcap, alibi_slopes=alibi_slopes, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, _rotary_fa2=True, _token_major=True)
    return (result[0], _fa2_lse(result[1])) if isinstance(result, tuple) else result
