"""Hugging Face transformers integration: ``attn_implementation="tileattn"``.

    import tileattn
    tileattn.transformers.register()          # returns "tileattn"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="tileattn")

``register()`` adds two entries under the name "tileattn": the attention function
(transformers' ``AttentionInterface``) and the mask builder (``AttentionMaskInterface``).
Both are needed: a model whose mask builder is unknown gets ``attention_mask=None``, and
left padding would be silently ignored. The masks are transformers' own SDPA masks
(boolean, True = keep, ``[B, 1, q, kv]``), which tileattn reads in place (stride 0 over
heads), except where a model's code assumes more of its masks (``tileattn_mask``).
transformers is imported here only, when this module is.

Semantics, as transformers' "sdpa" implementation has them:
  - no mask and more than one query: causal, aligned TOP-LEFT (transformers passes no mask
    only when the queries and keys line up, or for one query); tileattn aligns causal masks
    bottom-right, so keys past the last query's position are dropped first (same result);
  - no mask and one query: every key;
  - a boolean or additive mask: used as given (a row with no visible key gives zeros);
  - ``scaling`` is the softmax scale, ``dropout`` applies in training;
  - GQA/MQA: tileattn reads the shared K/V heads directly (no repeat);
  - ``softcap`` (Gemma 2's logit soft-capping) goes to ``flash_attention(softcap=...)``;
  - the output is ``[B, q, H, D]``, the layout the models' output projections read: q, k and v
    go in as ``[B, N, H, D]`` views of transformers' ``[B, H, N, D]`` tensors (layout "bshd",
    read in place with their strides), so tileattn allocates the output in that layout and the
    model's reshape to ``[B, q, H * D]`` is a view, not a copy (sdpa copies it there);
  - ``position_bias`` (T5, mT5, UMT5: a learned relative bias ``[B or 1, H, q, kv]``) is added
    to the scores as an additive mask, combined with the model's mask as sdpa combines them; its
    gradient is computed (in PyTorch math), except together with attention dropout, which raises
    NotImplementedError at the forward;
  - queries with a batch of 1 against a batch of keys broadcast (stride-0 views).
Beyond sdpa:
  - ``output_attentions=True`` returns the attention weights ``[B, H, q, kv]`` in the query's
    dtype (``flash_attention(return_attn_probs=True)``: float64-recomputed, after dropout, 0
    outside the mask); they carry no gradient, so asking for them in training mode while
    autograd records raises NotImplementedError (sdpa returns no weights);
  - ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (FlashAttention kwargs, DataCollatorWithFlattening's
    ``return_flash_attn_kwargs=True``) delimit sequences packed in a row of batch 1: without a
    mask tileattn runs its varlen kernel, causal per sequence; with one (or with
    output_attentions / position_bias) the mask is restricted to each sequence's block. sdpa
    ignores them, and attends across sequences where transformers builds no packed mask (an
    all-ones attention_mask turns its detection from position_ids off);
  - ``indices`` (DeepSeek-V3.2-style sparse attention, DSA: the indexer's top-k key positions
    ``[B, q, topk]``, which transformers folds into the mask for eager and sdpa only) restrict
    each query to its selected keys.
``TileattnCache`` (tileattn/_hf_cache.py) is a DynamicCache whose full-attention layers append
in place instead of concatenating the whole cache every token; pass it to generate().
gpt-oss's sink logits (``s_aux``) go to ``flash_attention(sinks=...)``, with their gradient.
DeepSeek's multi-head latent attention (a value head_dim other than the query's: 192 / 128 in
DeepSeek-V3) runs as it is (flash_attention takes V's own head dim).
Features tileattn does not have yet (MiniMax-M3's ``block_indices``, attention weights with a
gradient, a learned position bias with dropout) raise ``NotImplementedError`` naming the
feature, never a silent fallback.
"""
import inspect

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers import __version__ as transformers_version
from transformers.masking_utils import eager_mask, sdpa_mask

from ._forward import flash_attention
from ._sdpa import autocast_inputs

NAME = "tileattn"
_FLASH_ATTENTION_ARGS = set(inspect.signature(flash_attention).parameters)


def _not_supported(feature):
    return NotImplementedError(f"tileattn: {feature} is not supported by attn_implementation='tileattn' yet")


def _records_gradients(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _packed_boundaries(kwargs, batch, q_len, kv_len):
    """The packed-sequence boundaries (cu_seq_lens_q, cu_seq_lens_k) that transformers' flash
    attention kwargs carry, checked against the row they delimit; None without them."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and cu_k is None:
        return None
    if cu_q is None or cu_k is None:
        raise ValueError("tileattn: cu_seq_lens_q and cu_seq_lens_k: give both or neither")
    if batch != 1:
        raise ValueError(f"tileattn: cu_seq_lens_q / cu_seq_lens_k delimit sequences packed in one row "
                         f"(batch 1), got a batch of {batch}")
    if int(cu_q[-1]) != q_len or int(cu_k[-1]) != kv_len:
        raise ValueError(f"tileattn: cu_seq_lens_q / cu_seq_lens_k end at {int(cu_q[-1])} / {int(cu_k[-1])} "
                         f"tokens, the row has {q_len} queries / {kv_len} keys")
    return cu_q, cu_k


def _within_sequences(cu_q, cu_k, q_len, kv_len, device):
    """Bool ``[1, 1, q, kv]``: True where query and key belong to the same packed sequence."""
    seq_q = torch.bucketize(torch.arange(q_len, device=device), cu_q[1:].to(device), right=True)
    seq_k = torch.bucketize(torch.arange(kv_len, device=device), cu_k[1:].to(device), right=True)
    return (seq_q[:, None] == seq_k[None, :])[None, None]


def _restrict(attention_mask, keep):
    """The mask (None, bool = keep, or additive float) that also drops where `keep` is False."""
    if attention_mask is None:
        return keep
    if attention_mask.dtype == torch.bool:
        return attention_mask & keep
    return torch.where(keep, attention_mask, torch.finfo(attention_mask.dtype).min)


def _selected_keys(indices, kv_len):
    """Bool ``[B, 1 or H, q, kv]``, True at the keys a sparse-attention indexer selected:
    ``indices`` ``[B, q, topk]`` (or ``[B, H, q, topk]``) key positions, negative ones unused."""
    if indices.dim() == 3:
        indices = indices[:, None]
    indices = indices.long()
    indices = torch.where(indices < 0, kv_len, indices)  # an extra column, dropped below
    keep = torch.zeros(*indices.shape[:-1], kv_len + 1, dtype=torch.bool, device=indices.device)
    return keep.scatter_(-1, indices, True)[..., :kv_len]


def tileattn_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                               is_causal=None, softcap=None, s_aux=None, sinks=None, position_bias=None,
                               **kwargs):
    """transformers' attention-function signature: query ``[B, H, q, D]``, key/value
    ``[B, Hkv, kv, D]``; returns ``(output [B, q, H, D], None)``, or ``(output, weights
    [B, H, q, kv])`` with ``output_attentions=True``."""
    output_attentions = bool(kwargs.get("output_attentions", False))
    extra = {}
    if s_aux is not None or sinks is not None:  # gpt-oss: one sink logit per query head
        extra["sinks"] = s_aux if s_aux is not None else sinks
        if extra["sinks"].dim() != 1:
            raise NotImplementedError(f"tileattn: sink logits of shape {tuple(extra['sinks'].shape)} (per token) are "
                                      "not supported, one per query head [H] is; use attn_implementation='eager'")
    if softcap is not None and softcap != 0:
        if "softcap" not in _FLASH_ATTENTION_ARGS:
            raise _not_supported("softcap")
        extra["softcap"] = float(softcap)
    if kwargs.get("block_indices") is not None:
        raise NotImplementedError("tileattn: block_indices (block-sparse attention, MiniMax-M3's indexer) is not "
                                  "supported by attn_implementation='tileattn' yet; use 'sdpa' or 'eager'")
    dropout = dropout if module.training else 0.0
    if output_attentions and module.training and _records_gradients(query, key, value, position_bias):
        raise NotImplementedError(
            "tileattn: output_attentions while training (autograd recording, module.training) is not supported: "
            "the attention weights tileattn returns carry no gradient; use attn_implementation='eager' to "
            "train through them, or torch.no_grad() / model.eval() to read them")
    if position_bias is not None and dropout > 0 and _records_gradients(position_bias):
        raise NotImplementedError(
            "tileattn: a position_bias that requires grad together with attention dropout is not supported "
            "(the bias gradient has no dropout path); set the attention dropout to 0 or use attn_implementation='sdpa'")
    # Under torch.autocast("cpu") transformers' RoPE leaves q and k in fp32 next to a bf16 v;
    # PyTorch's SDPA takes all three in the autocast dtype there, and so does this.
    query, key, value = autocast_inputs(query, key, value)
    if query.shape[0] != key.shape[0] and 1 in (query.shape[0], key.shape[0]):
        # sdpa broadcasts the batch (learned queries of batch 1); stride-0 views, never copies.
        batch = max(query.shape[0], key.shape[0])
        query, key, value = (x.expand(batch, *x.shape[1:]) for x in (query, key, value))
    q_len, kv_len = query.shape[2], key.shape[2]
    causal_module = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-1] > kv_len:
        attention_mask = attention_mask[..., :kv_len]  # as transformers' sdpa: a mask may be wider
    packed = _packed_boundaries(kwargs, query.shape[0], q_len, kv_len)
    # DeepSeek-V3.2-style sparse attention (DSA): the indexer's top-k keys per query come as
    # `indices` to implementations other than eager and sdpa (which get them folded in the mask).
    selected = None if kwargs.get("indices") is None else _selected_keys(kwargs["indices"], kv_len)
    if (packed is not None and attention_mask is None and position_bias is None and not output_attentions
            and selected is None):
        # FlashAttention-2's varlen: sequence b is rows cu[b] .. cu[b + 1] - 1, causal per sequence.
        cu_q, cu_k = packed
        output = flash_attention(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                                 dropout_p=dropout, softmax_scale=scaling, is_causal=bool(causal_module),
                                 cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **extra)
        return output[None], None
    causal = False
    if attention_mask is None:
        causal = q_len > 1 and causal_module
        if causal and kv_len > q_len:  # top-left causal: the keys after the last query's position are never seen
            key, value = key[:, :, :q_len], value[:, :, :q_len]
            if position_bias is not None:
                position_bias = position_bias[..., :q_len]
            if selected is not None:
                selected = selected[..., :q_len]
    if selected is not None:
        attention_mask = _restrict(attention_mask, selected)
    if packed is not None:
        if causal and packed[0].tolist() != packed[1].tolist():
            # One causal mask over the row is each sequence's only where queries and keys line up.
            raise NotImplementedError("tileattn: cu_seq_lens_q other than cu_seq_lens_k without an attention mask, "
                                      "together with output_attentions, position_bias or indices, is not supported")
        attention_mask = _restrict(attention_mask, _within_sequences(*packed, q_len, key.shape[2], query.device))
    if position_bias is not None:
        # T5-style relative position bias [B or 1, H, q, kv], added to the scores like an
        # additive mask (with its gradient); a bool mask drops its False entries.
        if attention_mask is None:
            attention_mask = position_bias
        elif attention_mask.dtype == torch.bool:
            attention_mask = torch.where(attention_mask, position_bias, torch.finfo(position_bias.dtype).min)
        else:
            attention_mask = position_bias + attention_mask
    # [B, N, H, D] views of the [B, H, N, D] inputs: the output comes back contiguous [B, q, H, D].
    result = flash_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                             attn_mask=attention_mask, dropout_p=dropout, softmax_scale=scaling, is_causal=causal,
                             layout="bshd", return_attn_probs=output_attentions, **extra)
    if not output_attentions:
        return result, None
    output, weights = result
    if weights.shape[-1] < kv_len:  # keys cut by the top-left causal mask: weight 0
        weights = torch.nn.functional.pad(weights, (0, kv_len - weights.shape[-1]))
    return output, weights.to(query.dtype)


def __getattr__(name):
    """TileattnCache and GrowingLayer, imported on first use: they build on transformers' cache
    layers (DynamicLayer), which older transformers versions that have the attention interfaces
    lack."""
    if name in ("TileattnCache", "GrowingLayer"):
        try:
            from . import _hf_cache
        except ImportError as error:
            raise NotImplementedError(
                f"tileattn.transformers.{name}: not supported with transformers {transformers_version} "
                f"(it needs transformers' cache layers, DynamicLayer: {error})") from None
        return getattr(_hf_cache, name)
    raise AttributeError(f"module 'tileattn.transformers' has no attribute {name!r}")


# Models whose attention code adds a float bias to the mask it is given, by eager's convention
# (DeepSeek-V4 appends its compressor's block bias with `.to(mask.dtype)`): a boolean mask would
# turn the bias into keep/drop flags the wrong way round, and no mask would lose the bias.
_FLOAT_MASK_MODEL_TYPES = frozenset({"deepseek_v4"})


def tileattn_mask(*args, config=None, **kwargs):
    """transformers' mask builder for "tileattn": sdpa's (boolean, or None where sdpa's no-mask
    semantics hold, which tileattn_attention_forward reproduces), except for models whose code
    assumes more of the mask than sdpa's builder gives any name but "sdpa":
      - eager's float mask (a causal mask is never skipped) for _FLOAT_MASK_MODEL_TYPES;
      - no skipped causal mask for Gemma 4 with KV-shared layers (`num_kv_shared_layers`), which
        drops query rows after building its masks and guards that only for "sdpa": its last
        `logits_to_keep` queries would take a top-left causal mask, or see a static cache's
        unwritten slots. This builds an [B, 1, q, kv] boolean mask for every call of such a
        model (the builder cannot tell which calls drop rows); the kernel skips the tiles it
        hides. Gemma 3n has the same field and keeps its queries: it keeps the skip."""
    text = config
    if hasattr(config, "get_text_config"):
        try:
            text = config.get_text_config(decoder=True)
        except (TypeError, ValueError):  # older signatures; composite configs with several text parts
            text = config
    model_type = getattr(text, "model_type", None) or ""
    if model_type in _FLOAT_MASK_MODEL_TYPES:
        return eager_mask(*args, config=config, **kwargs)
    if model_type.startswith("gemma4") and getattr(text, "num_kv_shared_layers", 0):
        kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, config=config, **kwargs)


def register():
    """Registers "tileattn" with transformers' attention and mask interfaces; returns "tileattn"."""
    AttentionInterface.register(NAME, tileattn_attention_forward)
    AttentionMaskInterface.register(NAME, tileattn_mask)
    return NAME


__all__ = ["register", "tileattn_attention_forward", "tileattn_mask", "NAME", "TileattnCache", "GrowingLayer"]
