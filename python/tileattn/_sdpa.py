"""tileattn.scaled_dot_product_attention: PyTorch's torch.nn.functional.scaled_dot_product_attention,
name for name, default for default, on tileattn's kernel (a thin layer over flash_attention)."""
import numpy as np

from . import _arrays
from ._forward import flash_attention
from ._problem import is_causal_bias, top_left_causal


class SdpaArgumentError(ValueError, RuntimeError):
    """Bad arguments to scaled_dot_product_attention: a ValueError, as every tileattn argument
    error, and a RuntimeError, which is what torch's scaled_dot_product_attention raises."""


class SdpaArgumentTypeError(SdpaArgumentError, TypeError):
    """An SdpaArgumentError about a dtype or type, which tileattn raises as a TypeError: it stays one."""


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """PyTorch's ``scaled_dot_product_attention`` on tileattn's kernel, for CPU tensors (and NumPy arrays).

    Same arguments, defaults and semantics as ``torch.nn.functional.scaled_dot_product_attention``:

    * query ``(..., Hq, L, E)``, key ``(..., Hk, S, E)``, value ``(..., Hk, S, Ev)``; 3-D and 4-D
      inputs are read in place, more leading dims are flattened into the batch (key's and value's
      equal query's: they are not broadcast).
    * ``attn_mask``: bool (True = takes part) or float (added to the scores), broadcastable to
      ``(..., Hq, L, S)``; read in place with stride-0 broadcasting; a float mask that requires
      grad gets its gradient. ``torch.nn.attention.bias.causal_lower_right`` /
      ``causal_upper_left`` are the causal masks they name.
    * ``is_causal=True`` aligns the causal mask to the TOP-LEFT (key ``j`` visible to query ``i``
      iff ``j <= i``), as PyTorch does; giving it with ``attn_mask`` is an error, as in PyTorch.
    * ``scale``: None means ``1 / sqrt(E)``. ``enable_gqa``: key/value may have fewer heads, which
      must divide query's; without it the head counts must be equal. Argument errors are
      SdpaArgumentError, both a ValueError (tileattn's convention) and a RuntimeError (what
      PyTorch raises); one about a dtype or type is also a TypeError.
    * Autograd for query, key and value through the C++ backward kernel.
    * Under ``torch.autocast("cpu")``, query, key and value run in the autocast dtype, as
      PyTorch's SDPA does there (a float mask keeps its own dtype: the kernel reads fp32).

    Differences (docs/python.md has the table): dropout draws its pattern from tileattn's counter-based
    generator (seeded from ``torch.randint``), not PyTorch's; the top-left causal mask with
    ``S > L`` is passed to the kernel as a ``[L, S]`` boolean mask (one ``L x S`` bool tensor).
    """
    try:
        return _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    except (ValueError, TypeError) as error:
        # flash_attention's checks raise ValueError / TypeError naming the argument; here they are
        # SdpaArgumentError, so that code catching torch's RuntimeError catches them too.
        if isinstance(error, SdpaArgumentError):
            raise
        kind = SdpaArgumentTypeError if isinstance(error, TypeError) else SdpaArgumentError
        raise kind(str(error)).with_traceback(error.__traceback__) from None


def _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """scaled_dot_product_attention; its argument errors may be flash_attention's ValueError / TypeError."""
    if _arrays.is_torch(query):
        query, key, value = autocast_inputs(query, key, value)
    qs, ks = query.shape, key.shape
    rank = len(qs)
    if rank < 3 or len(ks) != rank or len(value.shape) != rank:
        raise SdpaArgumentError(f"query, key, value: expected tensors of one rank >= 3 (..., H, L, E), got shapes "
                         f"{tuple(qs)}, {tuple(ks)}, {tuple(value.shape)}")
    if qs[-3] != ks[-3] and not enable_gqa:
        raise SdpaArgumentError(f"key: {ks[-3]} heads differ from query's {qs[-3]}; pass enable_gqa=True for "
                         "grouped-query attention (as torch's scaled_dot_product_attention requires)")
    if rank != 4:
        return _any_rank(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    causal = False
    if is_causal is True or (is_causal is not False and bool(is_causal)):
        if attn_mask is not None:
            raise SdpaArgumentError("attn_mask: must be None when is_causal=True (as in torch's "
                             "scaled_dot_product_attention)")
        nq, nk = qs[-2], ks[-2]
        if nq == nk or nk == 0:  # no keys: every row is zeros, with or without a mask
            causal = True  # top-left and bottom-right agree
        else:
            attn_mask = top_left_causal(query, nq, nk)
    return flash_attention(query, key, value, attn_mask, dropout_p, scale, causal)


def autocast_inputs(*tensors):
    """The tensors as torch.autocast on the CPU hands them to PyTorch's SDPA, which is on its
    lower-precision list: floating ones in the autocast dtype (bf16 by default) while a
    ``torch.autocast("cpu")`` region is active; unchanged otherwise (and for NumPy arrays).
    Under autocast a model's RoPE can leave q and k in fp32 next to a bf16 v."""
    import torch
    try:
        enabled = torch.is_autocast_enabled("cpu")
        dtype = torch.get_autocast_dtype("cpu")
    except TypeError:  # torch < 2.4
        enabled, dtype = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    if not enabled:
        return tensors
    # Autocast's eligible tensors: floating, not float64 (which it leaves alone).
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                 and t.device.type == "cpu" else t for t in tensors)


def _any_rank(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """3-D or 5-D+ inputs as 4-D views [B, H, N, E] (3-D: B = 1), the output reshaped back."""
    lead = tuple(query.shape[:-3])
    for name, x in (("key", key), ("value", value)):
        if tuple(x.shape[:-3]) != lead:  # flattened into one batch dim, they would pair the wrong entries
            raise SdpaArgumentError(f"{name}: leading dims {tuple(x.shape[:-3])} differ from query's {lead}")
    def as4(x):
        return x.reshape((-1,) + tuple(x.shape[-3:])) if len(lead) else x[None]
    mask = attn_mask
    if mask is not None and len(lead) > 1 and not is_causal_bias(mask):
        # The mask's leading dims broadcast to the inputs' before they are flattened into one
        # batch dim (a copy only when a broadcast leading dim cannot be flattened as a view).
        shape = (1,) * (len(query.shape) - len(mask.shape)) + tuple(mask.shape)
        if len(shape) > len(query.shape) or any(m not in (1, n) for m, n in zip(shape[:-3], lead)):
            raise SdpaArgumentError(f"attn_mask: shape {tuple(mask.shape)} does not broadcast to the leading "
                                    f"dims {lead} of query")
        target = lead + shape[-3:]
        mask = mask.reshape(shape)
        mask = np.broadcast_to(mask, target) if isinstance(mask, np.ndarray) else mask.expand(target)
        mask = mask.reshape((-1,) + shape[-3:])
    o = _attention(as4(query), as4(key), as4(value), mask, dropout_p, is_causal, scale, enable_gqa)
    return o.reshape(tuple(query.shape[:-1]) + (value.shape[-1],))
