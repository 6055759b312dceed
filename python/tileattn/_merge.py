"""tileattn.merge_states: combine two partial attention results over disjoint key sets."""
import numpy as np

from . import _arrays, _kernel


def merge_states(o_a, lse_a, o_b, lse_b):
    """Attention over keys A u B from attention over A and over B.

    Args:
        o_a, o_b: partial outputs ``[B, H, N, D]`` (float32 or float16 NumPy arrays; float32,
            float16 or bfloat16 torch CPU tensors), one dtype, any strides.
        lse_a, lse_b: their log-sum-exps (natural log), float32 ``[B, H, N]``, -inf where a
            side saw no key (as ``flash_attention(..., return_lse=True)`` returns them).

    Returns:
        ``(o, lse)``: ``lse = log(exp(lse_a) + exp(lse_b))`` and
        ``o = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b``, new arrays in the inputs'
        framework and dtype. An empty side (lse = -inf, or +inf as
        FlashAttention-2 and its drop-ins write it) gives the other side exactly.
        Inputs are read in place (no copies). Torch tensors go through the custom op
        ``torch.ops.tileattn.merge_states``, which has no autograd.
    """
    names = ("o_a", "lse_a", "o_b", "lse_b")
    args = (o_a, lse_a, o_b, lse_b)
    fw = _arrays.framework("o_a", o_a)
    for name, x in zip(names[1:], args[1:]):
        if _arrays.framework(name, x) != fw:
            raise TypeError(f"{name}: must be a {fw} array like o_a")
    _arrays.check_rank("o_a", o_a, 4, "[B, H, N, D]")
    if tuple(o_b.shape) != tuple(o_a.shape):
        raise ValueError(f"o_b: shape {tuple(o_b.shape)} must equal o_a's {tuple(o_a.shape)}")
    for name, x in (("lse_a", lse_a), ("lse_b", lse_b)):
        if tuple(x.shape) != tuple(o_a.shape[:3]):
            raise ValueError(f"{name}: expected shape [B, H, N] = {tuple(o_a.shape[:3])}, got {tuple(x.shape)}")
    if fw == "torch":
        torch = _arrays.torch_module()
        meta = _arrays.on_meta(zip(names, args))  # all on meta: shapes from the op's fake kernel
        for name, x in zip(names, args):
            _arrays.check_torch_device(name, x, meta)
        code = _arrays.torch_dtype_code("o_a", o_a)
        if _arrays.torch_dtype_code("o_b", o_b) != code:
            raise TypeError(f"o_b: dtype {o_b.dtype} differs from o_a's {o_a.dtype}")
        for name, x in (("lse_a", lse_a), ("lse_b", lse_b)):
            if x.dtype != torch.float32:
                raise TypeError(f"{name}: expected dtype torch.float32, got {x.dtype}")
        from . import _torch_ops
        if not _torch_ops.is_compiling():
            _torch_ops.refuse_transforms_without_autograd("merge_states", args)
        return _torch_ops.merge_states_op(o_a, lse_a, o_b, lse_b)
    code = _arrays.numpy_dtype_code("o_a", o_a)
    if _arrays.numpy_dtype_code("o_b", o_b) != code:
        raise TypeError(f"o_b: dtype {o_b.dtype} differs from o_a's {o_a.dtype}")
    for name, x in (("lse_a", lse_a), ("lse_b", lse_b)):
        if x.dtype != np.float32:
            raise TypeError(f"{name}: expected dtype float32, got {x.dtype}")
    o = np.empty(o_a.shape, dtype=o_a.dtype)
    lse = np.empty(lse_a.shape, dtype=np.float32)
    _kernel.merge_into(o_a, lse_a, o_b, lse_b, o, lse)
    return o, lse
