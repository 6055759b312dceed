"""The scalar options of the attention functions, checked, and layout helpers.

Every error names the argument it is about. The arrays themselves are checked
in C++ (python/src/forward_arrays_bindings.cpp) for flash_attention, and by
tileattn/_arrays.py for the other functions.
"""
import math

import numpy as np

LAYOUTS = {"bhsd": 0, "bshd": 1}
MASK_NONE, MASK_BOOLEAN, MASK_ADDITIVE = 0, 1, 2
_INT64_MAX = 2**63 - 1  # window sides cross into C++ as int64
# The kernel takes the scale as a float32: doubles from here up round to inf there.
_FLOAT32_OVERFLOW = (2.0 - 2.0**-24) * 2.0**127


def parse_layout(layout):
    code = LAYOUTS.get(layout) if isinstance(layout, str) else None
    if code is None:
        raise ValueError(f"layout: expected 'bhsd' or 'bshd', got {layout!r}")
    return code


def to_kernel_order(strides, layout):
    """[batch, head, row, dim] strides of a 4-D array in `layout`."""
    if layout == 1:  # [B, N, H, D]
        return (strides[0], strides[2], strides[1], strides[3])
    return tuple(strides)


def heads_rows(shape, layout):
    """(batch, heads, rows, dim) of a 4-D array in `layout`."""
    if layout == 1:
        return shape[0], shape[2], shape[1], shape[3]
    return shape[0], shape[1], shape[2], shape[3]


def parse_window(name, window):
    """(left, right), inclusive, -1 = unbounded on that side."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"{name}: expected a (left, right) pair, got {window!r}")
    out = []
    for side, w in zip(("left", "right"), window):
        if w is None:
            w = -1
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)):
            raise TypeError(f"{name}: {side} must be an int (-1 or None = unbounded), got {w!r}")
        if not -1 <= w <= _INT64_MAX:
            raise ValueError(f"{name}: {side} must be in -1 .. 2^63 - 1, got {w}")
        out.append(int(w))
    return out[0], out[1]


def parse_bool(name, value):
    """A bool flag: True, False or a NumPy bool (a truthy string such as "no" is refused)."""
    if value is True or value is False:
        return value
    if not isinstance(value, np.bool_):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return bool(value)


def parse_causal_window(is_causal, window):
    """(is_causal as a bool, window_left, window_right): the mask options flash_attention and
    attention_with_kvcache share. True/False and no window take the first, cheapest tests."""
    if is_causal is not True and is_causal is not False:
        is_causal = parse_bool("is_causal", is_causal)
    if window is None:
        return is_causal, -1, -1
    left, right = parse_window("window", window)
    return is_causal, left, right


def parse_scale(softmax_scale, head_dim):
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}")
    try:
        s = float(softmax_scale)
    except OverflowError:  # an int beyond float64
        s = math.inf
    if not abs(s) < _FLOAT32_OVERFLOW:  # also NaN
        raise ValueError(f"softmax_scale: must be finite in float32 (|scale| < 3.4e38), got {s}")
    return s


def parse_softcap(softcap):
    """The soft cap c >= 0 (0: off) as a float; c * tanh(x / c) of each scaled score."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float, np.floating, np.integer)):
        raise TypeError(f"softcap: expected a float >= 0, got {type(softcap).__name__}")
    try:
        c = float(softcap)
    except OverflowError:
        c = math.inf
    if not 0.0 <= c < _FLOAT32_OVERFLOW:  # also NaN
        raise ValueError(f"softcap: must be finite and >= 0 (0: off), got {c}")
    return c


def as_alibi_slopes(alibi_slopes, q):
    """ALiBi slopes ([H] or [B, H]) as the kernel reads them: float32, contiguous, in q's
    framework (a torch tensor for torch inputs, else a NumPy array); None stays None. The
    shape is checked against q in C++, or by check_alibi_shape where the kernel gets a bare pointer."""
    if alibi_slopes is None:
        return None
    if type(q).__module__.startswith("torch"):
        import torch
        if isinstance(alibi_slopes, torch.Tensor):
            if alibi_slopes.dtype != torch.float32 and not alibi_slopes.is_floating_point():
                raise TypeError(f"alibi_slopes: expected a float array, got dtype {alibi_slopes.dtype}")
            return alibi_slopes.detach().to(torch.float32).contiguous()
        return torch.as_tensor(np.asarray(alibi_slopes, dtype=np.float32))
    slopes = np.asarray(alibi_slopes)
    if slopes.dtype.kind != "f":
        raise TypeError(f"alibi_slopes: expected a float array, got dtype {slopes.dtype}")
    return np.ascontiguousarray(slopes, dtype=np.float32)


def check_alibi_shape(slopes, batch, heads):
    """ValueError unless slopes (from as_alibi_slopes) is [heads] or [batch, heads]: the rule and
    message of the C++ checks (read_alibi_slopes), for the paths that pass the kernel a bare
    pointer. Reads the shape only (traceable)."""
    shape = tuple(slopes.shape)
    if shape != (heads,) and shape != (batch, heads):
        raise ValueError(f"alibi_slopes: expected shape [{heads}] or [{batch}, {heads}], got {shape}")


def alibi_address(slopes):
    """(address, batch stride in elements) of slopes from as_alibi_slopes (0, 0 for None)."""
    if slopes is None:
        return 0, 0
    if hasattr(slopes, "data_ptr"):
        return slopes.data_ptr(), (slopes.stride(0) if slopes.dim() == 2 and slopes.shape[0] > 1 else 0)
    stride = slopes.strides[0] // 4 if slopes.ndim == 2 and slopes.shape[0] > 1 else 0
    return slopes.ctypes.data, stride


def as_sinks(sinks, q, heads=None):
    """Attention sinks ([H] logits) as the kernel reads them: float32, contiguous, in q's
    framework; None stays None. A torch tensor keeps its autograd graph (the cast and copy,
    when needed, are differentiable), so ``sinks.grad`` is filled. Non-finite values are the
    library's error (it names ``sinks[h]``). heads None: the shape is left to the C++ checks."""
    if sinks is None:
        return None
    if type(q).__module__.startswith("torch"):
        import torch
        if isinstance(sinks, torch.Tensor):
            if not sinks.is_floating_point():
                raise TypeError(f"sinks: expected a float tensor, got dtype {sinks.dtype}")
            out = sinks.to(torch.float32).contiguous()
        else:
            out = torch.as_tensor(np.asarray(sinks, dtype=np.float32))
    else:
        out = np.asarray(sinks)
        if out.dtype.kind != "f":
            raise TypeError(f"sinks: expected a float array, got dtype {out.dtype}")
        out = np.ascontiguousarray(out, dtype=np.float32)
    if heads is not None:
        check_sinks_shape(out, heads)
    return out


def check_sinks_shape(sinks, heads):
    """ValueError unless sinks (from as_sinks) is [heads]: the rule and message of the C++ checks
    (read_sinks). Reads the shape only (traceable)."""
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks: expected shape [{heads}] (one logit per query head), got {tuple(sinks.shape)}")


def sinks_address(sinks):
    """The address of sinks from as_sinks (0 for None)."""
    if sinks is None:
        return 0
    return sinks.data_ptr() if hasattr(sinks, "data_ptr") else sinks.ctypes.data


def parse_dropout(dropout_p):
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, np.floating)):
        raise TypeError(f"dropout_p: expected a float, got {type(dropout_p).__name__}")
    p = float(dropout_p)
    if not (0.0 <= p < 1.0):
        raise ValueError(f"dropout_p: must be in [0, 1), got {p}")
    return p


def is_causal_bias(attn_mask):
    """Whether attn_mask is one of torch.nn.attention.bias's causal masks (causal_upper_left /
    causal_lower_right): a tensor subclass whose storage holds no mask (it handles PyTorch's
    SDPA itself), so it must be read for what it says, not as an array."""
    cls = type(attn_mask)
    return cls.__name__ == "CausalBias" and cls.__module__ == "torch.nn.attention.bias"


def causal_bias_options(attn_mask, nq, nk, is_causal):
    """(mask, is_causal) for flash_attention in place of a CausalBias of an [nq, nk] score matrix:
    causal_lower_right is flash_attention's own is_causal (bottom-right); causal_upper_left is
    that too when nq == nk, else a bool [nq, nk] mask (key j visible to query i iff j <= i)."""
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (nq, nk):
        raise ValueError(f"attn_mask: a causal bias of {attn_mask.seq_len_q} x {attn_mask.seq_len_kv} "
                         f"for {nq} queries and {nk} keys")
    if int(attn_mask.variant.value) == 2 or nq == nk:  # CausalVariant.LOWER_RIGHT
        return None, True
    return top_left_causal(attn_mask, nq, nk), is_causal


def top_left_causal(like, nq, nk):
    """Bool [nq, nk], torch's or NumPy's as `like` is: key j visible to query i iff j <= i
    (PyTorch's is_causal), on like's device when like is a tensor (the meta device: shape inference)."""
    if type(like).__module__.startswith("torch"):
        import torch
        return torch.ones(nq, nk, dtype=torch.bool, device=getattr(like, "device", None)).tril_()
    return np.tri(nq, nk, dtype=bool)


def parse_options(attn_mask, dropout_p, softmax_scale, is_causal, window, layout):
    """flash_attention's scalar options, checked (the arrays are checked in C++, by
    _tileattn.forward_arrays / check_forward).

    Returns (mask array or None, dropout_p, softmax_scale or None (= 1/sqrt(D)), causal,
    window_left, window_right, layout code). A (left, right) tuple given as attn_mask is
    a window. The common values take the first, cheapest test of each check.
    """
    code = parse_layout(layout)
    is_causal, left, right = parse_causal_window(is_causal, window)
    if isinstance(attn_mask, (tuple, list)):
        if window is not None:
            raise ValueError("attn_mask: a (left, right) window was given both as attn_mask and as window")
        left, right = parse_window("attn_mask", attn_mask)
        attn_mask = None
    scale = None if softmax_scale is None else parse_scale(softmax_scale, 0)
    if type(dropout_p) is not float or dropout_p != 0.0:
        dropout_p = parse_dropout(dropout_p)
    return attn_mask, dropout_p, scale, is_causal, left, right, code
