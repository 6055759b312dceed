"""Hugging Face transformers integration: ``attn_implementation="tileattn"``.

    import tileattn
    tileattn.transformers.register()          # returns "tileattn"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="tileattn")

``register()`` adds two entries under the name "tileattn": the attention function
(transformers' ``AttentionInterface``) and the mask builder (``AttentionMaskInterface``).
Both are needed: a model whose mask builder is unknown gets ``attention_mask=None``, and
left padding would be silently ignored. The masks are transformers' own SDPA masks
(boolean, True = keep, ``[B, 1, q, kv]``), which tileattn reads in place (stride 0 over
heads). transformers is imported here only, when this module is.

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
    model's reshape to ``[B, q, H * D]`` is a view, not a copy (sdpa copies it there).
``TileattnCache`` (tileattn/_hf_cache.py) is a DynamicCache whose full-attention layers append
in place instead of concatenating the whole cache every token; pass it to generate().
gpt-oss's sink logits (``s_aux``) go to ``flash_attention(sinks=...)``, with their gradient.
DeepSeek's multi-head latent attention (a value head_dim other than the query's: 192 / 128 in
DeepSeek-V3) runs as it is (flash_attention takes V's own head dim).
Features tileattn does not have yet (output of the attention weights, a position bias tensor)
raise ``NotImplementedError`` naming the feature, never a silent fallback.
"""
import inspect

from transformers import AttentionInterface, AttentionMaskInterface
from transformers import __version__ as transformers_version
from transformers.masking_utils import sdpa_mask

from ._forward import flash_attention
from ._sdpa import autocast_inputs

NAME = "tileattn"
_FLASH_ATTENTION_ARGS = set(inspect.signature(flash_attention).parameters)


def _not_supported(feature):
    return NotImplementedError(f"tileattn: {feature} is not supported by attn_implementation='tileattn' yet")


def tileattn_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                               is_causal=None, softcap=None, s_aux=None, sinks=None, **kwargs):
    """transformers' attention-function signature: query ``[B, H, q, D]``, key/value
    ``[B, Hkv, kv, D]``; returns ``(output [B, q, H, D], None)``."""
    if kwargs.get("output_attentions", False):
        raise _not_supported("output_attentions")
    extra = {}
    if s_aux is not None or sinks is not None:  # gpt-oss: one sink logit per query head
        extra["sinks"] = s_aux if s_aux is not None else sinks
    if softcap is not None and softcap != 0:
        if "softcap" not in _FLASH_ATTENTION_ARGS:
            raise _not_supported("softcap")
        extra["softcap"] = float(softcap)
    if kwargs.get("position_bias") is not None:
        raise _not_supported("position_bias")
    # Under torch.autocast("cpu") transformers' RoPE leaves q and k in fp32 next to a bf16 v;
    # PyTorch's SDPA takes all three in the autocast dtype there, and so does this.
    query, key, value = autocast_inputs(query, key, value)
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = False
    if attention_mask is None:
        causal = q_len > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
        if causal and kv_len > q_len:  # top-left causal: the keys after the last query's position are never seen
            key, value = key[:, :, :q_len], value[:, :, :q_len]
    elif attention_mask.dim() == 4 and attention_mask.shape[-1] > kv_len:
        attention_mask = attention_mask[..., :kv_len]  # as transformers' sdpa: a mask may be wider
    # [B, N, H, D] views of the [B, H, N, D] inputs: the output comes back contiguous [B, q, H, D].
    output = flash_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                             attn_mask=attention_mask, dropout_p=dropout if module.training else 0.0,
                             softmax_scale=scaling, is_causal=causal, layout="bshd", **extra)
    return output, None


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


def register():
    """Registers "tileattn" with transformers' attention and mask interfaces; returns "tileattn"."""
    AttentionInterface.register(NAME, tileattn_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


__all__ = ["register", "tileattn_attention_forward", "NAME", "TileattnCache", "GrowingLayer"]
