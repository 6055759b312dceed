"""The arguments of flash_attention, checked and reduced to what the kernel takes.

`Problem` holds the sizes, the layout, the mask (kind, object) and window,
and computes element strides in the kernel's [batch, head, row, dim] order.
Every error names the argument it is about.
"""
import math

import numpy as np

from . import _arrays

LAYOUTS = {"bhsd": 0, "bshd": 1}
MASK_NONE, MASK_BOOLEAN, MASK_ADDITIVE = 0, 1, 2


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
        if w < -1:
            raise ValueError(f"{name}: {side} must be >= -1, got {w}")
        out.append(int(w))
    return out[0], out[1]


def parse_scale(softmax_scale, head_dim):
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}")
    s = float(softmax_scale)
    if not math.isfinite(s):
        raise ValueError(f"softmax_scale: must be finite, got {s}")
    return s


def parse_dropout(dropout_p):
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, np.floating)):
        raise TypeError(f"dropout_p: expected a float, got {type(dropout_p).__name__}")
    p = float(dropout_p)
    if not (0.0 <= p < 1.0):
        raise ValueError(f"dropout_p: must be in [0, 1), got {p}")
    return p


class Problem:
    """Sizes and options of one attention call, checked."""

    __slots__ = ("framework", "dtype", "layout", "batch", "heads", "kv_heads", "seqlen_q",
                 "seqlen_k", "head_dim", "causal", "window_left", "window_right",
                 "mask_kind", "mask", "mask_stride", "scale", "dropout_p")

    def __init__(self, q, k, v, attn_mask, dropout_p, softmax_scale, is_causal, window, layout):
        fw = _arrays.framework("q", q)
        for name, x in (("k", k), ("v", v)):
            if _arrays.framework(name, x) != fw:
                raise TypeError(f"{name}: is a {_arrays.framework(name, x)} array but q is {fw}; "
                                "pass all of q, k, v from one framework")
        self.framework = fw
        self.layout = parse_layout(layout)
        what = "[B, H, N, D]" if self.layout == 0 else "[B, N, H, D]"
        for name, x in (("q", q), ("k", k), ("v", v)):
            _arrays.check_rank(name, x, 4, f"{what} (layout={layout!r})")
        if fw == "torch":
            for name, x in (("q", q), ("k", k), ("v", v)):
                _arrays.check_torch_device(name, x)
            code = _arrays.torch_dtype_code
        else:
            code = _arrays.numpy_dtype_code
        self.dtype = code("q", q)
        for name, x in (("k", k), ("v", v)):
            if code(name, x) != self.dtype:
                raise TypeError(f"{name}: dtype {x.dtype} differs from q's {q.dtype}")
        b, h, nq, d = heads_rows(tuple(q.shape), self.layout)
        bk, hk, nk, dk = heads_rows(tuple(k.shape), self.layout)
        if tuple(v.shape) != tuple(k.shape):
            raise ValueError(f"v: shape {tuple(v.shape)} must equal k's {tuple(k.shape)}")
        if bk != b:
            raise ValueError(f"k: batch {bk} differs from q's {b}")
        if dk != d:
            raise ValueError(f"k: head_dim {dk} differs from q's {d}")
        if hk < 1 or h % hk:
            raise ValueError(f"k: {hk} heads must divide q's {h} heads (GQA/MQA)")
        if not 1 <= d <= 256:
            raise ValueError(f"q: head_dim must be in 1..256, got {d}")
        self.batch, self.heads, self.kv_heads = b, h, hk
        self.seqlen_q, self.seqlen_k, self.head_dim = nq, nk, d

        if isinstance(is_causal, (bool, np.bool_)):
            self.causal = bool(is_causal)
        else:
            raise TypeError(f"is_causal: expected a bool, got {type(is_causal).__name__}")
        self.window_left, self.window_right = parse_window("window", window)
        self.mask_kind, self.mask, self.mask_stride = MASK_NONE, None, (0, 0, 0, 1)
        if isinstance(attn_mask, (tuple, list)):
            if window is not None:
                raise ValueError("attn_mask: a (left, right) window was given both as attn_mask and as window")
            self.window_left, self.window_right = parse_window("attn_mask", attn_mask)
        elif attn_mask is not None:
            self._set_mask(attn_mask)
        self.scale = parse_scale(softmax_scale, d)
        self.dropout_p = parse_dropout(dropout_p)

    def _set_mask(self, m):
        if _arrays.framework("attn_mask", m) != self.framework:
            raise TypeError(f"attn_mask: must be a {self.framework} array like q")
        if self.framework == "torch":
            torch = _arrays.torch_module()
            _arrays.check_torch_device("attn_mask", m)
            if m.dtype == torch.bool:
                kind = MASK_BOOLEAN
            elif m.dtype == torch.float32:
                kind = MASK_ADDITIVE
            elif m.is_floating_point():
                # The kernel adds fp32; another float dtype is converted (one copy of the mask).
                kind, m = MASK_ADDITIVE, m.float()
            else:
                raise TypeError(f"attn_mask: dtype {m.dtype} is not supported (bool = keep, or float = added)")
        else:
            if m.dtype == np.bool_:
                kind = MASK_BOOLEAN
            elif m.dtype == np.float32:
                kind = MASK_ADDITIVE
            elif m.dtype.kind == "f":
                kind, m = MASK_ADDITIVE, m.astype(np.float32)
            else:
                raise TypeError(f"attn_mask: dtype {m.dtype} is not supported (bool = keep, or float = added)")
        # Shape check now, so a bad mask fails before anything runs.
        self.mask_stride = self.mask_strides(m)
        self.mask_kind, self.mask = kind, m

    def mask_strides(self, m):
        return _arrays.broadcast_strides(
            "attn_mask", m, (self.batch, self.heads, self.seqlen_q, self.seqlen_k), ("B", "H", "Nq", "Nk"))

    @property
    def shape6(self):
        return (self.batch, self.heads, self.kv_heads, self.seqlen_q, self.seqlen_k, self.head_dim)

    def output_shape(self):
        return (self.batch, self.heads, self.seqlen_q, self.head_dim) if self.layout == 0 else \
               (self.batch, self.seqlen_q, self.heads, self.head_dim)
