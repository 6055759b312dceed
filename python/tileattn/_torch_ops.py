"""The torch custom ops behind tileattn's functions, with fake (meta) kernels and autograd.

``torch.ops.tileattn.flash_attention`` is a ``torch.library.custom_op``, so
torch.compile, torch.export and make_fx see one opaque op with known output
shapes instead of tracing into the C++ call.
"""
import math
from typing import Optional, Tuple

import torch
from torch.autograd import forward_ad as _forward_ad

from . import _arrays, _kernel, _torch_backward
from . import _tileattn as _C
from ._problem import heads_rows

# torch is in use: under "auto", tileattn's kernels run on torch's OpenMP threads from now on.
_kernel.apply_auto_thread_runtime(torch_loading=True)

# Dynamo recognises this function (by identity) and treats it as True while compiling.
is_compiling = torch.compiler.is_compiling
# The public functions' per-call test, in Python where Dynamo sees it: a plain function that
# Dynamo treats as True while it traces. It costs 1.3 us less than is_compiling right after a
# decode-sized kernel (4.8 against 6.1 us, the code cold). torch.export and the other tracers
# that is_compiling also reports run on fake tensors or under dispatch modes, which the C++
# check (torch_eager.cpp) declines.
dynamo_is_tracing = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)


def _o_shape(q, v):
    """O's shape: q's with V's head dim (the last dimension of every layout)."""
    return tuple(q.shape[:-1]) + (v.shape[-1],)


def _output_shapes(q, layout, packed=False):
    if packed:  # q [total_q, H, D] -> lse [H, total_q]
        return (q.shape[1], q.shape[0])
    b, h, nq, _ = heads_rows(tuple(q.shape), layout)
    return (b, h, nq)


@torch.library.custom_op("tileattn::flash_attention", mutates_args=(), device_types="cpu")
def flash_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       attn_mask: Optional[torch.Tensor], dropout_p: float, softmax_scale: float,
                       is_causal: bool, window_left: int, window_right: int, layout: int,
                       seed: int, softcap: float = 0.0,
                       alibi_slopes: Optional[torch.Tensor] = None,
                       sinks: Optional[torch.Tensor] = None,
                       cu_seqlens_q: Optional[torch.Tensor] = None,
                       cu_seqlens_k: Optional[torch.Tensor] = None, max_seqlen_q: int = -1,
                       max_seqlen_k: int = -1,
                       seed_tensor: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): o in q's layout and dtype, lse fp32 [B, H, Nq]. layout: 0 bhsd, 1 bshd.
    softcap > 0: each scaled score x becomes softcap * tanh(x / softcap) (0: off). sinks:
    float32 [H] attention-sink logits (None: off). With cu_seqlens (packed varlen): q, k, v,
    o [total, H, D], lse [H, total_q]; a given max_seqlen (>= 0) is checked against the lengths.
    seed_tensor: the dropout seed as an integer 0-d tensor, used instead of seed (what a
    compiled or exported graph passes: a seed drawn inside the graph, new each run)."""
    if seed_tensor is not None:
        seed = int(seed_tensor)
    return _C.forward_arrays(q, k, v, attn_mask, layout, is_causal, window_left, window_right,
                             softmax_scale, dropout_p, seed, _kernel._settings["threads"], True,
                             softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)


@flash_attention_op.register_fake
def _(q, k, v, attn_mask, dropout_p, softmax_scale, is_causal, window_left, window_right, layout, seed,
      softcap=0.0, alibi_slopes=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=-1,
      max_seqlen_k=-1, seed_tensor=None):
    lse_shape = _output_shapes(q, layout, cu_seqlens_q is not None)
    return q.new_empty(_o_shape(q, v)), q.new_empty(lse_shape, dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    (q, k, v, attn_mask, dropout_p, softmax_scale, is_causal, window_left, window_right, layout, seed,
     softcap, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, _, _, seed_tensor) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, attn_mask, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k,
                          seed_tensor)
    ctx.options = (dropout_p, softmax_scale, is_causal, window_left, window_right, layout, seed, softcap)


@torch.library.custom_op("tileattn::flash_attention_backward", mutates_args=(), device_types="cpu")
def flash_attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                                lse: torch.Tensor, grad_o: torch.Tensor, grad_lse: torch.Tensor,
                                attn_mask: Optional[torch.Tensor], dropout_p: float,
                                softmax_scale: float, is_causal: bool, window_left: int,
                                window_right: int, layout: int, seed: int,
                                softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                                sinks: Optional[torch.Tensor] = None,
                                cu_seqlens_q: Optional[torch.Tensor] = None,
                                cu_seqlens_k: Optional[torch.Tensor] = None,
                                seed_tensor: Optional[torch.Tensor] = None
                                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, d_sinks) of flash_attention, given the forward's inputs, options and
    (o, lse); d_sinks is float32 [H] with sinks, else an empty [0] tensor. seed_tensor: as in
    the forward op (replaces seed)."""
    if seed_tensor is not None:
        seed = int(seed_tensor)
    if not bool(grad_lse.any()):
        # The C++ kernel (backward.hpp): P recomputed tile by tile from lse, dropout included,
        # packed varlen rows too.
        # Packed rows outside every sequence get no gradient from the kernel (it leaves rows it
        # does not compute alone): zeros there rather than fresh memory.
        new = torch.empty if cu_seqlens_q is None else torch.zeros
        dq, dk, dv = (new(t.shape, dtype=t.dtype) for t in (q, k, v))
        d_sinks = torch.empty(sinks.shape if sinks is not None else (0,), dtype=torch.float32)
        _kernel.backward_into(q, k, v, o, grad_o, lse, dq, dk, dv, attn_mask, is_causal,
                              window_left, window_right, softmax_scale, dropout_p, seed, layout,
                              softcap, alibi_slopes, sinks, d_sinks if sinks is not None else None,
                              cu_seqlens_q, cu_seqlens_k)
        return dq, dk, dv, d_sinks
    # A loss that uses lse adds P * dlse to dS, which the kernel does not take: PyTorch math.
    if dropout_p > 0:
        raise NotImplementedError("flash_attention: gradients through lse together with dropout "
                                  "are not supported")
    if cu_seqlens_q is not None:
        dq, dk, dv, d_sinks = _torch_backward.varlen_backward_math(
            q, k, v, o, lse, grad_o, grad_lse, softmax_scale, is_causal, window_left,
            window_right, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, sinks)
    else:
        dq, dk, dv, d_sinks = _torch_backward.attention_backward_math(
            q, k, v, o, lse, grad_o, grad_lse, attn_mask, softmax_scale, is_causal, window_left,
            window_right, layout, softcap, alibi_slopes, sinks)
    # Contiguous, as the fake kernel says (the math gives "bshd" gradients as transposed views
    # and packed ones in the inputs' strides): compiled backwards rely on the fake strides.
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), d_sinks


@flash_attention_backward_op.register_fake
def _(q, k, v, o, lse, grad_o, grad_lse, attn_mask, dropout_p, softmax_scale, is_causal,
      window_left, window_right, layout, seed, softcap=0.0, alibi_slopes=None, sinks=None,
      cu_seqlens_q=None, cu_seqlens_k=None, seed_tensor=None):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(sinks.shape if sinks is not None else (0,), dtype=torch.float32))


def _backward(ctx, grad_o, grad_lse, backward_op=None):
    """flash_attention_op's gradients; backward_op: what computes them (None: the backward op)."""
    q, k, v, o, lse, attn_mask, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, seed_tensor = ctx.saved_tensors
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    if grad_lse is None:
        grad_lse = torch.zeros_like(lse)
    if ctx.needs_input_grad[3]:
        # A float mask that requires grad (ALiBi-like or relative-position biases that are
        # learned): its gradient is dS, which the kernel does not store; PyTorch math.
        dropout_p, softmax_scale, is_causal, window_left, window_right, layout, _, softcap = ctx.options
        if dropout_p > 0:
            raise NotImplementedError("attn_mask: a gradient for the mask together with dropout is not supported")
        dq, dk, dv, d_sinks, d_mask = _torch_backward.attention_backward_math(
            q, k, v, o, lse, grad_o, grad_lse, attn_mask, softmax_scale, is_causal, window_left,
            window_right, layout, softcap, alibi_slopes, sinks, mask_grad=True)
        return (dq, dk, dv, d_mask) + (None,) * 9 + (d_sinks if sinks is not None else None,) + (None,) * 5
    dq, dk, dv, d_sinks = (backward_op or flash_attention_backward_op)(
        q, k, v, o, lse, grad_o, grad_lse, attn_mask, *ctx.options, alibi_slopes, sinks, cu_seqlens_q,
        cu_seqlens_k, seed_tensor)
    # One gradient per input: q, k, v, then attn_mask .. alibi_slopes (none), sinks, then the
    # varlen inputs and seed_tensor (none).
    return (dq, dk, dv) + (None,) * 10 + (d_sinks if sinks is not None else None,) + (None,) * 5


flash_attention_op.register_autograd(_backward, setup_context=_setup_context)


_DOUBLE_BACKWARD_MESSAGE = ("flash_attention: double backward (the gradient of a gradient, after "
                            "create_graph=True) is not supported")


def _forward_ad_message(name):
    return (f"{name}: forward-mode AD (torch.func.jvp, torch.func.jacfwd, torch.func.hessian, "
            "torch.autograd.forward_ad) is not supported; use reverse mode (torch.func.grad, "
            "torch.func.vjp, torch.func.jacrev, Tensor.backward)")


def transforms_active():
    """Whether a torch.func transform (vmap, grad, jvp, ...) or a forward-mode AD level is
    active: the op path then needs _FlashAttentionFunction, and the ops without autograd the
    tangent check."""
    return torch._C._are_functorch_transforms_active() or _forward_ad._current_level >= 0


def refuse_tangents(name, tensors):
    """NotImplementedError when one of the tensors carries a forward-mode AD tangent (the ops
    without autograd would drop it, and the result's tangent would be missing, or zero)."""
    if _forward_ad._current_level < 0:
        return
    for t in tensors:
        if isinstance(t, torch.Tensor) and _forward_ad.unpack_dual(t).tangent is not None:
            raise NotImplementedError(_forward_ad_message(name))


def refuse_transforms_without_autograd(name, tensors):
    """For the ops without autograd (attention_with_kvcache, merge_states) under a torch.func
    transform or forward AD: a tangent would be dropped (the output's came back zero or None)
    and torch.func.grad failed with torch's setup_context message; say what is unsupported."""
    if not transforms_active():
        return
    refuse_tangents(name, tensors)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise NotImplementedError(f"{name}: has no gradient (no autograd formula), also under "
                                  "torch.func.grad, vjp and jacrev")


class _FlashAttentionFunction(torch.autograd.Function):
    """flash_attention_op with its autograd, as an autograd.Function with setup_context: what
    torch.func transforms need. The op's own autograd (register_autograd) gives torch.func.grad
    "autograd.Function ... must override the setup_context staticmethod" (pytorch#168393), and
    it silently drops forward-mode tangents (o's tangent came back zero or None). Used only
    while a transform or a forward AD level is active; torch.compile, export and plain autograd
    see the op. vmap: the op runs once per batch entry (torch's fallback)."""
    generate_vmap_rule = True

    @staticmethod
    def forward(*args):
        # Below autograd (as the op's own autograd kernel calls it): this Function is the autograd.
        with torch._C._AutoDispatchBelowAutograd():
            return flash_attention_op(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        return _backward(ctx, grad_o, grad_lse, _FlashAttentionBackwardFunction.apply)

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(_forward_ad_message("flash_attention"))


class _FlashAttentionBackwardFunction(torch.autograd.Function):
    """flash_attention_backward_op for _FlashAttentionFunction, for the same reason: its own
    autograd (the double backward refusal) has no setup_context for torch.func."""
    generate_vmap_rule = True

    @staticmethod
    def forward(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return flash_attention_backward_op(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(_DOUBLE_BACKWARD_MESSAGE)

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(_forward_ad_message("flash_attention"))


def _refuse_backward(message):
    """A backward that raises NotImplementedError(message): for the ops without a gradient,
    so a backward through them says what is not supported instead of torch's generic "no
    autograd formula was registered" naming an internal op."""
    def backward(ctx, *grads):
        raise NotImplementedError(message)
    return backward


# A gradient of flash_attention's gradients (torch.autograd.grad(..., create_graph=True), then
# a backward through the result): the backward kernel has no derivative of its own.
flash_attention_backward_op.register_autograd(_refuse_backward(_DOUBLE_BACKWARD_MESSAGE))


# torch.func.vmap rules. Without them torch's fallback ran the op once per vmapped entry and
# warned "There is a performance drop ... Please file us an issue on GitHub". The common case
# folds the vmapped dim into the batch dim, which comes first in both layouts: one call over
# [n * B, ...]. Packed batches, batched sinks (the backward: any sinks, whose gradient sums over
# the batch) and dropout run one call per entry here: with dropout the pattern depends on the
# batch index, so vmap's randomness="same" needs each entry at its own index, and
# randomness="different" gives each entry its own seed (seed_tensor, batched).

def _vmap_arguments(names, defaults, in_dims, args, kwargs):
    """The op's arguments by name (defaults filled in) and their vmapped dims (None: not batched)."""
    values = dict(defaults)
    values.update(zip(names, args))
    values.update(kwargs)
    dims = dict.fromkeys(names)
    dims.update(zip(names, in_dims))
    return values, dims


def _vmap_loop(op, n, names, values, dims):
    """op once per vmapped entry, outputs stacked on dim 0."""
    results = []
    for i in range(n):
        call = [values[name] if dims[name] is None else values[name].select(dims[name], i) for name in names]
        results.append(op(*call))
    outputs = tuple(torch.stack(parts) for parts in zip(*results))
    return outputs, (0,) * len(outputs)


def _vmap_leading(t, dim, n):
    """t with its vmapped dim first ([n, ...]; an unbatched t expanded, without a copy)."""
    return t.movedim(dim, 0) if dim is not None else t.expand(n, *t.shape)


def _vmap_fold(t, dim, n):
    """[n * B, ...] from t's vmapped dim and its batch dim (a copy only when they do not merge)."""
    t = _vmap_leading(t, dim, n)
    return t.reshape(n * t.shape[1], *t.shape[2:])


def _vmap_fold_broadcast(t, dim, n, batch, rank):
    """A tensor that broadcasts over [batch, ...] of `rank` dims (a mask [.., Nq, Nk]) as one that
    broadcasts over [n * batch, ...]; None stays None."""
    if t is None:
        return None
    if dim is None:
        full = t.reshape((1,) * (rank - t.dim()) + tuple(t.shape))
        return full if full.shape[0] == 1 else full.repeat(n, *(1,) * (rank - 1))
    t = t.movedim(dim, 0)
    t = t.reshape((n,) + (1,) * (rank - (t.dim() - 1)) + tuple(t.shape[1:]))
    t = t.expand(n, batch, *t.shape[2:])
    return t.reshape(n * batch, *t.shape[2:])


def _vmap_fold_alibi(t, dim, n, batch):
    """ALiBi slopes ([H] or [B, H] per entry) for the folded batch: [H] unbatched stays, the rest
    become [n * B, H]."""
    if t is None or (dim is None and t.dim() == 1):
        return t
    t = _vmap_leading(t, dim, n)  # [n, H] or [n, B, H]
    heads = t.shape[-1]
    return t.reshape(n, -1, heads).expand(n, batch, heads).reshape(n * batch, heads)


_FORWARD_NAMES = ("q", "k", "v", "attn_mask", "dropout_p", "softmax_scale", "is_causal", "window_left",
                  "window_right", "layout", "seed", "softcap", "alibi_slopes", "sinks", "cu_seqlens_q",
                  "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "seed_tensor")
_FORWARD_DEFAULTS = {"softcap": 0.0, "alibi_slopes": None, "sinks": None, "cu_seqlens_q": None,
                     "cu_seqlens_k": None, "max_seqlen_q": -1, "max_seqlen_k": -1, "seed_tensor": None}


@flash_attention_op.register_vmap
def _(info, in_dims, *args, **kwargs):
    a, d = _vmap_arguments(_FORWARD_NAMES, _FORWARD_DEFAULTS, in_dims, args, kwargs)
    n = info.batch_size
    if a["cu_seqlens_q"] is not None or a["dropout_p"] > 0 or d["sinks"] is not None:
        return _vmap_loop(flash_attention_op, n, _FORWARD_NAMES, a, d)
    batch = a["q"].shape[1 if d["q"] == 0 else 0] if d["q"] is not None else a["q"].shape[0]
    folded = dict(a)
    for name in ("q", "k", "v"):
        folded[name] = _vmap_fold(a[name], d[name], n)
    folded["attn_mask"] = _vmap_fold_broadcast(a["attn_mask"], d["attn_mask"], n, batch, 4)
    folded["alibi_slopes"] = _vmap_fold_alibi(a["alibi_slopes"], d["alibi_slopes"], n, batch)
    o, lse = flash_attention_op(*(folded[name] for name in _FORWARD_NAMES))
    return (o.reshape(n, batch, *o.shape[1:]), lse.reshape(n, batch, *lse.shape[1:])), (0, 0)


_BACKWARD_NAMES = ("q", "k", "v", "o", "lse", "grad_o", "grad_lse", "attn_mask", "dropout_p", "softmax_scale",
                   "is_causal", "window_left", "window_right", "layout", "seed", "softcap", "alibi_slopes",
                   "sinks", "cu_seqlens_q", "cu_seqlens_k", "seed_tensor")
_BACKWARD_DEFAULTS = {"softcap": 0.0, "alibi_slopes": None, "sinks": None, "cu_seqlens_q": None,
                      "cu_seqlens_k": None, "seed_tensor": None}


@flash_attention_backward_op.register_vmap
def _(info, in_dims, *args, **kwargs):
    a, d = _vmap_arguments(_BACKWARD_NAMES, _BACKWARD_DEFAULTS, in_dims, args, kwargs)
    n = info.batch_size
    # d_sinks sums over the batch: folding would sum over the vmapped entries too.
    if a["sinks"] is not None or a["cu_seqlens_q"] is not None or a["dropout_p"] > 0:
        return _vmap_loop(flash_attention_backward_op, n, _BACKWARD_NAMES, a, d)
    batch = a["q"].shape[1 if d["q"] == 0 else 0] if d["q"] is not None else a["q"].shape[0]
    folded = dict(a)
    for name in ("q", "k", "v", "o", "lse", "grad_o", "grad_lse"):
        folded[name] = _vmap_fold(a[name], d[name], n)
    # The C++ backward checks O as the forward checks its output (no stride 0 over more than
    # one entry); an unbatched o folded with batch 1 (torch.func.jacrev) is such a view.
    o = folded["o"]
    if any(step == 0 and size > 1 for step, size in zip(o.stride(), o.shape)):
        folded["o"] = o.contiguous()
    folded["attn_mask"] = _vmap_fold_broadcast(a["attn_mask"], d["attn_mask"], n, batch, 4)
    folded["alibi_slopes"] = _vmap_fold_alibi(a["alibi_slopes"], d["alibi_slopes"], n, batch)
    dq, dk, dv, d_sinks = flash_attention_backward_op(*(folded[name] for name in _BACKWARD_NAMES))
    unfold = lambda t: t.reshape(n, batch, *t.shape[1:])  # noqa: E731
    return (unfold(dq), unfold(dk), unfold(dv), d_sinks), (0, 0, 0, None)


def _op_arguments(q, k, v, mask, layout, causal, window_left, window_right, scale, dropout_p,
                  softcap, alibi_slopes=None, sinks=None, cu_q=None, cu_k=None):
    """(mask, scale) as the op takes them: the scale as a float, the mask as the kernel reads
    it (float32 if it was another float type), which is also what autograd saves.

    Checked in C++ on the tensors' metadata, which works on fake tensors (make_fx). Dynamo
    cannot trace into that call, so under torch.compile the checks wait for the op's
    implementation, which makes them on the real tensors when the compiled code runs.
    """
    if mask is not None and mask.requires_grad and mask.dtype not in (torch.bool, torch.float32):
        mask = mask.float()  # in autograd's view (C++'s conversion would cut the mask's gradient off)
    if not torch.compiler.is_compiling():
        return _C.check_forward(q, k, v, mask, layout, causal, window_left, window_right, scale,
                                dropout_p, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                                cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    if mask is not None and mask.dtype not in (torch.bool, torch.float32) and mask.is_floating_point():
        mask = mask.float()
    return mask, (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)


def flash_attention(q, k, v, mask, dropout_p, scale, causal, window_left, window_right, layout,
                    return_lse, softcap=0.0, alibi_slopes=None, sinks=None, cu_q=None, cu_k=None,
                    with_probs=False, max_q=-1, max_k=-1):
    """flash_attention for torch tensors, given its checked scalar options (scale None:
    1/sqrt(D)); the arrays are checked in C++. Returns (o, lse), or (o, lse, probs) with
    with_probs."""
    compiling = is_compiling()
    seed, seed_tensor = 0, None
    if dropout_p > 0:
        if compiling or transforms_active():
            # Drawn inside the graph (a new seed each run of a compiled or exported graph); .item()
            # here broke the graph, failed fullgraph=True and failed torch.export. Under
            # vmap(randomness="different") the seed is batched: one per entry.
            seed_tensor = torch.randint(0, 2**62, (), dtype=torch.int64)
        else:
            seed = int(torch.randint(0, 2**62, ()).item())
    meta = False
    if not compiling:
        # The op's fake kernel answers tensors on the meta device (shape inference); a mix of
        # meta and CPU tensors is a ValueError naming the first meta one.
        meta = _arrays.on_meta((("q", q), ("k", k), ("v", v), ("attn_mask", mask), ("alibi_slopes", alibi_slopes),
                                ("sinks", sinks), ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)))
        if meta and with_probs:
            raise NotImplementedError("return_attn_probs: not supported on the meta device")
    if not compiling and not meta:
        # One C++ call when nothing could observe the op (see torch_eager.hpp); None otherwise.
        out = _C.forward_arrays(q, k, v, mask, layout, causal, window_left, window_right, scale,
                                dropout_p, seed, _kernel._settings["threads"], return_lse,
                                eager_only=True, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                                cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, with_probs=with_probs,
                                max_seqlen_q=max_q, max_seqlen_k=max_k)
        if out is not None:
            return out
    elif with_probs:
        raise NotImplementedError("return_attn_probs: not supported under torch.compile")
    if cu_q is not None:  # the op takes int32 tensors (what autograd saves)
        cu_q, cu_k = (c if c.dtype == torch.int32 else c.to(torch.int32) for c in (cu_q, cu_k))
    mask, scale = _op_arguments(q, k, v, mask, layout, causal, window_left, window_right, scale,
                                dropout_p, softcap, alibi_slopes, sinks, cu_q, cu_k)
    op = flash_attention_op if compiling or not transforms_active() else _FlashAttentionFunction.apply
    o, lse = op(q, k, v, mask, dropout_p, scale, causal, window_left, window_right, layout, seed,
                softcap, alibi_slopes, sinks, cu_q, cu_k, max_q, max_k, seed_tensor)
    if not with_probs:
        return o, lse
    # The probabilities carry no gradient: computed from detached inputs, same seed (so the
    # same dropout pattern), by a second call that also recomputes O (a debugging aid).
    detached = [None if t is None else t.detach() for t in (q, k, v, mask, alibi_slopes)]
    probs = _C.forward_arrays(*detached[:4], layout, causal, window_left, window_right, scale,
                              dropout_p, seed, _kernel._settings["threads"], False, softcap=softcap,
                              alibi_slopes=detached[4], sinks=None if sinks is None else sinks.detach(),
                              cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, with_probs=True)[2]
    return o, lse, probs


@torch.library.custom_op("tileattn::merge_states", mutates_args=(), device_types="cpu")
def merge_states_op(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
                    lse_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    o = torch.empty(o_a.shape, dtype=o_a.dtype)
    lse = torch.empty(lse_a.shape, dtype=torch.float32)
    _kernel.merge_into(o_a, lse_a, o_b, lse_b, o, lse)
    return o, lse


@merge_states_op.register_fake
def _(o_a, lse_a, o_b, lse_b):
    return o_a.new_empty(o_a.shape), lse_a.new_empty(lse_a.shape, dtype=torch.float32)


@merge_states_op.register_vmap
def _(info, in_dims, o_a, lse_a, o_b, lse_b):
    """The vmapped dim folded into the batch: one call over [n * B, ...]."""
    n = info.batch_size
    batch = o_a.shape[1 if in_dims[0] == 0 else 0]  # one entry's B
    o, lse = merge_states_op(*(_vmap_fold(t, d, n) for t, d in zip((o_a, lse_a, o_b, lse_b), in_dims)))
    return (o.reshape(n, batch, *o.shape[1:]), lse.reshape(n, batch, *lse.shape[1:])), (0, 0)


merge_states_op.register_autograd(_refuse_backward(
    "merge_states: has no gradient (no autograd formula); call it on detached tensors or under "
    "torch.no_grad()"))


@torch.library.custom_op("tileattn::attention_with_kvcache", mutates_args=("k_cache", "v_cache"),
                         device_types="cpu")
def attention_with_kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                              cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
                              rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
                              rotary_interleaved: bool, softmax_scale: float, is_causal: bool,
                              window_left: int, window_right: int,
                              softcap: float = 0.0,
                              alibi_slopes: Optional[torch.Tensor] = None,
                              sinks: Optional[torch.Tensor] = None,
                              cache_batch_idx: Optional[torch.Tensor] = None,
                              cache_leftpad: Optional[torch.Tensor] = None,
                              rotary_fa2_positions: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """(o, lse); appends k/v into k_cache/v_cache. cache_seqlens (integer [B]) is not modified;
    block_table is an integer [B, max_pages] tensor (narrowed to int32 here, values checked)."""
    from . import _kvcache
    o = torch.empty(_o_shape(q, v_cache), dtype=q.dtype)
    lse = torch.empty(q.shape[:3], dtype=torch.float32)
    if k is not None and not torch.is_inference_mode_enabled():
        # The op's dispatch lets an inference tensor through (the direct call checks in C++).
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if cache.is_inference():
                raise ValueError(_kvcache.inference_cache_message(name))
    seqlens = _kvcache.op_seqlens(cache_seqlens)  # the kernel advances its own int32 copy
    table = _kvcache.op_block_table(block_table)  # int32, its values checked
    _kvcache.kvcache_into(q, k_cache, v_cache, k, v, seqlens, table, rotary_cos, rotary_sin,
                          rotary_interleaved, softmax_scale, is_causal, window_left, window_right, o, lse,
                          softcap, alibi_slopes, sinks, _kvcache.op_int32_vector("cache_batch_idx", cache_batch_idx),
                          _kvcache.op_int32_vector("cache_leftpad", cache_leftpad), rotary_fa2_positions)
    return o, lse


@attention_with_kvcache_op.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, block_table, rotary_cos, rotary_sin,
      rotary_interleaved, softmax_scale, is_causal, window_left, window_right, softcap=0.0,
      alibi_slopes=None, sinks=None, cache_batch_idx=None, cache_leftpad=None, rotary_fa2_positions=False):
    return q.new_empty(_o_shape(q, v_cache)), q.new_empty(q.shape[:3], dtype=torch.float32)


def attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, rotary_cos,
                           rotary_sin, interleaved, scale, causal, window_left, window_right,
                           softcap=0.0, alibi_slopes=None, sinks=None, cache_batch_idx=None, cache_leftpad=None,
                           rotary_fa2=False):
    """attention_with_kvcache through the custom op (the path torch can observe: compile,
    tracing, dispatch modes), given its checked scalar options (scale None: 1/sqrt(D));
    the arrays are checked in Python on their metadata. Returns (o, lse)."""
    from . import _kvcache
    if not is_compiling():
        refuse_transforms_without_autograd("attention_with_kvcache", (q, k_cache, v_cache, k, v, rotary_cos,
                                                                      rotary_sin, alibi_slopes, sinks))
    seqlens, table, cos, sin, scale, batch_idx, leftpad = _kvcache.op_arguments(
        q, k_cache, v_cache, k, v, cache_seqlens, block_table, rotary_cos, rotary_sin, scale,
        cache_batch_idx, cache_leftpad, alibi_slopes, sinks)
    return attention_with_kvcache_op(q, k_cache, v_cache, k, v, seqlens, table, cos, sin,
                                     interleaved, scale, causal, window_left, window_right, softcap,
                                     alibi_slopes, sinks, batch_idx, leftpad, rotary_fa2)
