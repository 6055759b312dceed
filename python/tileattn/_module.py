"""tileattn.FlashAttention: a Llama-family attention layer (projections, GQA, RoPE, KV cache)."""
import dataclasses
from typing import Optional

import torch
from torch import nn

from ._forward import flash_attention
from ._kvcache import attention_with_kvcache
from ._rope import ROPE_TYPES, apply_rope, rope_tables, rope_type_of


_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}


@dataclasses.dataclass
class AttentionConfig:
    """Attention settings of a Llama-style model, with Hugging Face's config.json names.

    ``from_dict`` / ``from_hf`` read the config.json (or config object) of transformers 4.4x
    and 5.x alike: the RoPE base and scaling from ``rope_parameters`` (5.x) or ``rope_theta`` +
    ``rope_scaling`` (4.x), the dtype from ``dtype`` or ``torch_dtype`` (a string or a torch
    dtype), biases from ``attention_bias`` (Qwen2: q/k/v biases, none on o_proj).
    """
    hidden_size: int = 4096
    num_attention_heads: int = 32
    num_key_value_heads: Optional[int] = None  # None: = num_attention_heads (MHA)
    head_dim: Optional[int] = None             # None: hidden_size // num_attention_heads
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048        # KV cache capacity and RoPE table length
    attention_bias: bool = False               # biases on q/k/v/o_proj
    dtype: torch.dtype = torch.float32
    # RoPE scaling, Hugging Face's names: {"rope_type": "linear", "factor": f} or {"rope_type":
    # "llama3", "factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"}; None or "default": none. Others raise.
    rope_scaling: Optional[dict] = None
    o_proj_bias: Optional[bool] = None         # None: = attention_bias (Qwen2: False)
    # KV cache capacity and RoPE table length; None: max_position_embeddings. Not a
    # transformers field: a layer with dynamic RoPE scaling needs it above max_position_embeddings
    # to reach the positions where the scaling starts.
    max_cache_len: Optional[int] = None

    def __post_init__(self):
        if isinstance(self.dtype, str):
            if self.dtype not in _DTYPES:
                raise ValueError(f"config: dtype {self.dtype!r} is not one of {sorted(_DTYPES)}")
            self.dtype = _DTYPES[self.dtype]
        if self.o_proj_bias is None:
            self.o_proj_bias = self.attention_bias
        rope_type = rope_type_of(self.rope_scaling)
        if rope_type not in ROPE_TYPES:
            raise NotImplementedError(f"config: RoPE scaling {rope_type!r} is not supported "
                                      f"(supported: {', '.join(ROPE_TYPES)})")
        if rope_type in ("llama3", "yarn"):  # transformers' standardize_rope_params default
            self.rope_scaling = {"original_max_position_embeddings": self.max_position_embeddings,
                                 **self.rope_scaling}
        if self.max_cache_len is None:
            self.max_cache_len = self.max_position_embeddings
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"config: num_key_value_heads ({self.num_key_value_heads}) must divide "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.head_dim % 2:
            raise ValueError(f"config: head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def from_dict(cls, d):
        """From a Hugging Face config.json dict, transformers 4.4x or 5.x (unknown keys are ignored)."""
        d = dict(d)
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in names and k not in ("dtype", "rope_theta", "rope_scaling")}
        rope = d.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" in rope:  # transformers 5: base and scaling together
            values["rope_theta"] = rope["rope_theta"]
            values["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
        else:  # transformers 4.x
            if d.get("rope_theta") is not None:
                values["rope_theta"] = d["rope_theta"]
            values["rope_scaling"] = d.get("rope_scaling")
        if d.get("original_max_position_embeddings") is not None and values["rope_scaling"]:
            # Phi-3 style: the top-level field wins, as in transformers' standardize_rope_params
            values["rope_scaling"] = {**values["rope_scaling"],
                                      "original_max_position_embeddings": d["original_max_position_embeddings"]}
        # Attention features of other model families that this layer does not compute: refused
        # rather than ignored, which would give wrong outputs without a word.
        partial = d.get("partial_rotary_factor", (rope if isinstance(rope, dict) else {}).get("partial_rotary_factor"))
        if partial is not None and float(partial) != 1.0:
            raise NotImplementedError(f"config: partial_rotary_factor {partial} (RoPE on part of the head dims) "
                                      "is not supported")
        if d.get("attn_logit_softcapping") is not None:
            raise NotImplementedError(f"config: attn_logit_softcapping {d['attn_logit_softcapping']} is not "
                                      "supported (tileattn.flash_attention takes softcap=)")
        # A window at least as long as the cache (Phi-3.5's 262144) never drops a key.
        longest = d.get("max_cache_len") or d.get("max_position_embeddings") or cls.max_position_embeddings
        if d.get("sliding_window") is not None and d.get("use_sliding_window", True) and d["sliding_window"] < longest:
            raise NotImplementedError(f"config: sliding_window {d['sliding_window']} (below the {longest} positions "
                                      "of the cache) is not supported (tileattn.flash_attention takes window=)")
        dtype = d.get("dtype") or d.get("torch_dtype")
        if dtype is not None:
            values["dtype"] = dtype
        if d.get("model_type", "").startswith("qwen2"):  # q/k/v biases, none on o_proj
            values["attention_bias"], values["o_proj_bias"] = True, False
        return cls(**values)

    @classmethod
    def from_hf(cls, config):
        """From a transformers PretrainedConfig (or any object with config.json's attributes)."""
        if hasattr(config, "to_dict"):
            d = config.to_dict()
            if getattr(config, "dtype", None) is not None:
                d["dtype"] = config.dtype
            if getattr(config, "rope_parameters", None) is not None:
                d["rope_parameters"] = dict(config.rope_parameters)
            return cls.from_dict(d)
        return cls.from_dict({k: getattr(config, k) for k in dir(config) if not k.startswith("_")})


class FlashAttention(nn.Module):
    """Llama-style self-attention: q/k/v/o projections, GQA, RoPE, and an internal KV cache.

    ``forward(x)`` runs a prefill: it starts a new sequence (the cache is reset), attends causally
    over ``x`` and stores its keys/values. ``incremental_forward(x)`` appends one (or a few) new
    tokens and attends them to everything cached. ``x`` is ``[B, N, hidden_size]``.

    Padded batches: ``forward(x, attention_mask=M)`` with transformers' padding mask ``[B, N]``
    (1/True = a real token, 0 = padding; left, right or anywhere), or ``forward(x, lengths=L)``
    with per-sequence lengths ``[B]`` (sequence b is ``x[b, :L[b]]``, right padding).
    ``incremental_forward(x, attention_mask=M)`` takes the mask of the new tokens ``[B, T]``, or
    of the whole sequence ``[B, cached + T]`` as transformers' generate() extends it (None: the
    new tokens are real). Padding tokens are never attended to; each real token's RoPE position
    is the number of real tokens before it in its sequence (as generate() numbers them), so a
    sequence gives the same outputs alone and padded in a batch (with dynamic RoPE, only while
    the batch stays under ``max_position_embeddings``: past it the frequencies follow the
    batch's longest sequence, as in transformers' batched generate()). A padding token's own
    output row carries no meaning: ``o_proj`` of zeros before its sequence's first real token,
    after one it attends to the real tokens before it (as transformers' layers do); use the real
    rows only. Padded batches run RoPE in PyTorch and ``flash_attention`` with a boolean mask over
    the cache (the kernel's RoPE needs one position per slot).

    Dynamic (NTK) RoPE follows transformers' rotary embedding: a call that reaches position
    ``p >= max_position_embeddings`` recomputes the frequencies for length ``p + 1`` (cached keys
    keep their rotation), and a call back under ``max_position_embeddings`` restores the
    original ones; ``config.max_cache_len`` above ``max_position_embeddings`` makes room for it.

    backend "tileattn" (default) runs attention with tileattn: ``attention_with_kvcache``
    (RoPE applied by the kernel as keys enter the cache) when no gradient is needed, and the
    differentiable ``flash_attention`` with RoPE in PyTorch when one is. backend "sdpa" runs the
    same layer with ``torch.nn.functional.scaled_dot_product_attention``, for comparisons.

    config: an AttentionConfig, a dict (Hugging Face config.json names) or an object with
    those attributes.
    """

    def __init__(self, config, backend="tileattn"):
        super().__init__()
        if isinstance(config, dict):
            config = AttentionConfig.from_dict(config)
        elif not isinstance(config, AttentionConfig):
            config = AttentionConfig.from_hf(config)
        if backend not in ("tileattn", "sdpa"):
            raise ValueError(f"backend: expected 'tileattn' or 'sdpa', got {backend!r}")
        self.config, self.backend = config, backend
        c = config
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        linear = lambda i, o, bias=c.attention_bias: nn.Linear(i, o, bias=bias, dtype=c.dtype)  # noqa: E731
        self.q_proj = linear(c.hidden_size, self.heads * self.head_dim)
        self.k_proj = linear(c.hidden_size, self.kv_heads * self.head_dim)
        self.v_proj = linear(c.hidden_size, self.kv_heads * self.head_dim)
        self.o_proj = linear(self.heads * self.head_dim, c.hidden_size, c.o_proj_bias)
        # Plain float32 attributes, not buffers: Module.to(torch.bfloat16) / .half() convert
        # floating buffers, which would round every cos/sin to 8 bits (errors up to 2^-9,
        # against float32's 2^-24 for the same rotation in the kernel) and make the kernel
        # convert them back to float32 on every call. As non-persistent buffers they were never
        # in state_dict, and .to(device) has nothing to move: tileattn runs on the CPU.
        self._set_rope(None)
        self.k_cache = self.v_cache = None  # [B, kv_heads, capacity, head_dim], the weights' dtype
        self._cache_inference = False  # whether k_cache / v_cache were made under torch.inference_mode()
        self.cache_length = 0
        self.key_real = None   # padded batches: bool [B, capacity], True where a slot holds a real token
        self.real_count = None  # padded batches: int64 [B], real tokens so far (the next RoPE position)

    def _set_rope(self, seq_len):
        """cos/sin tables [max_cache_len, head_dim / 2] for dynamic RoPE's length seq_len (None:
        the original frequencies)."""
        c = self.config
        self.rope_cos, self.rope_sin = rope_tables(c.rope_theta, c.max_cache_len, self.head_dim, c.rope_scaling,
                                                   c.max_position_embeddings, seq_len)
        self.rope_seq_len = c.max_position_embeddings if seq_len is None else seq_len

    def _update_dynamic_rope(self, seq_len):
        """transformers' dynamic_frequency_update: grow past the longest length seen, reset under
        the original context."""
        if rope_type_of(self.config.rope_scaling) != "dynamic":
            return
        original = self.config.max_position_embeddings
        if seq_len > self.rope_seq_len:
            self._set_rope(seq_len)
        if seq_len < original < self.rope_seq_len:
            self._set_rope(None)

    def load_weights(self, weights):
        """Copies the projections' weights ``q_proj`` .. ``o_proj`` and, where the layer has
        them, their biases ``q_proj.bias`` .. (e.g. from load_huggingface_weights). A missing
        or unexpected tensor, or a wrong shape, raises ValueError naming it; nothing is copied then."""
        expected = {}
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            layer = getattr(self, name)
            expected[name] = layer.weight
            if layer.bias is not None:
                expected[f"{name}.bias"] = layer.bias
        missing = sorted(set(expected) - set(weights))
        unexpected = sorted(set(weights) - set(expected))
        if missing or unexpected:
            raise ValueError("weights: " + "; ".join(
                part for part in (f"missing {', '.join(missing)}" if missing else "",
                                  f"unexpected {', '.join(unexpected)} (the layer has no such tensor)"
                                  if unexpected else "") if part))
        for name, target in expected.items():
            if tuple(weights[name].shape) != tuple(target.shape):
                raise ValueError(f"weights: {name} has shape {tuple(weights[name].shape)}, "
                                 f"the layer needs {tuple(target.shape)}")
        with torch.no_grad():
            for name, target in expected.items():
                target.copy_(weights[name])
        return self

    @classmethod
    def from_pretrained(cls, path, layer_idx, config, backend="tileattn"):
        from ._weights import load_huggingface_weights
        return cls(config, backend).load_weights(load_huggingface_weights(path, layer_idx))

    def reset_cache(self, batch):
        shape = (batch, self.kv_heads, self.config.max_cache_len, self.head_dim)
        # The projections' dtype now, not config.dtype: .to(torch.bfloat16) or .half() may have
        # converted the layer since it was built, and the cache holds their outputs.
        dtype = self.k_proj.weight.dtype
        # Buffers made under torch.inference_mode() are inference tensors, which cannot be written
        # outside it: a new sequence started outside gets new ones. Dynamo cannot trace
        # Tensor.is_inference() or torch.is_inference_mode_enabled() (a graph break on every
        # prefill after the first, an error with fullgraph=True), so compiled code reads the flag
        # kept when the buffers were made, and remakes buffers made under inference mode (harmless
        # inside it too: a prefill starts a new sequence). Buffers made by compiled code count as
        # plain (torch's hint for compiled code is no_grad rather than inference_mode).
        compiling = torch.compiler.is_compiling()
        if self.k_cache is None:
            stale = False
        elif compiling:
            stale = self._cache_inference
        else:
            stale = self.k_cache.is_inference() and not torch.is_inference_mode_enabled()
        if self.k_cache is None or stale or tuple(self.k_cache.shape) != shape or self.k_cache.dtype != dtype:
            self.k_cache = torch.zeros(shape, dtype=dtype)
            self.v_cache = torch.zeros(shape, dtype=dtype)
            self._cache_inference = not compiling and torch.is_inference_mode_enabled()
        self.cache_length = 0
        self.key_real = self.real_count = None

    def forward(self, x, attention_mask=None, lengths=None):
        """Prefill: x [B, N, hidden] -> [B, N, hidden]; the cache then holds these N tokens.
        attention_mask [B, N] or lengths [B]: a padded batch (see the class docstring)."""
        self._check_input(x)
        real = self._padding(x, attention_mask, lengths, cached=0)
        self.reset_cache(x.shape[0])
        return self._attend(x, real)

    def incremental_forward(self, x, attention_mask=None):
        """Decode: x [B, T, hidden] (T new tokens, usually 1) after the cached ones;
        attention_mask [B, T] or [B, cached + T] marks padding among them."""
        self._check_input(x)
        if self.k_cache is None or x.shape[0] != self.k_cache.shape[0]:
            raise ValueError("x: incremental_forward needs a prefill (forward) of the same batch first")
        real = self._padding(x, attention_mask, None, cached=self.cache_length)
        if self.k_cache.dtype != self.k_proj.weight.dtype:  # the layer was converted since the prefill
            self.k_cache, self.v_cache = (c.to(self.k_proj.weight.dtype) for c in (self.k_cache, self.v_cache))
            self._cache_inference = self._cache_inference or (not torch.compiler.is_compiling()
                                                              and torch.is_inference_mode_enabled())
        return self._attend(x, real)

    @staticmethod
    def _padding(x, attention_mask, lengths, cached):
        """bool [B, N]: which of x's N tokens are real; None when all are (and none given)."""
        b, n, _ = x.shape
        if attention_mask is not None and lengths is not None:
            raise ValueError("attention_mask, lengths: give one of them, not both")
        if lengths is not None:
            lengths = torch.as_tensor(lengths)
            if lengths.shape != (b,) or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
                raise ValueError(f"lengths: expected integers [{b}], got {lengths.dtype} {tuple(lengths.shape)}")
            if bool((lengths < 0).any()) or bool((lengths > n).any()):
                raise ValueError(f"lengths: every length must be in 0..{n}, got {lengths.tolist()}")
            return torch.arange(n)[None, :] < lengths[:, None]
        if attention_mask is None:
            return None
        mask = torch.as_tensor(attention_mask)
        if mask.dim() != 2 or mask.shape[0] != b or mask.shape[1] not in (n, cached + n):
            raise ValueError(f"attention_mask: expected [{b}, {n}]" + (f" or [{b}, {cached + n}]" if cached else "")
                             + f" (1 = real token, 0 = padding), got {tuple(mask.shape)}")
        if mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError("attention_mask: expected 0/1 or booleans (1 = real token, 0 = padding)")
        return mask[:, -n:] != 0

    def _check_input(self, x):
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != self.config.hidden_size:
            raise ValueError(f"x: expected [B, N, {self.config.hidden_size}], got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")

    def _project(self, x, proj, heads):
        b, n, _ = x.shape
        return proj(x).view(b, n, heads, self.head_dim).transpose(1, 2)  # [B, heads, N, D] view

    def _attend(self, x, real=None):
        """real: bool [B, N] (padded batch) or None (every token real)."""
        b, n, _ = x.shape
        start = self.cache_length
        if n > self.config.max_cache_len - start:
            raise ValueError(f"x: {n} new tokens overflow the KV cache "
                             f"({start} of {self.config.max_cache_len} used)")
        if real is not None and self.key_real is None:  # the first padded call: earlier slots were real
            self.key_real = torch.zeros(b, self.config.max_cache_len, dtype=torch.bool)
            self.key_real[:, :start] = True
            self.real_count = torch.full((b,), start, dtype=torch.int64)
        padded = self.key_real is not None
        if padded and real is None:
            real = torch.ones(b, n, dtype=torch.bool)
        if padded:
            positions = self.real_count[:, None] + real.cumsum(1) - 1  # [B, N]; padding: its neighbour's
            positions = positions.clamp(min=0)
            if positions.numel():  # no token (N = 0 or B = 0): no position to rotate
                self._update_dynamic_rope(int(positions.max()) + 1)
        else:
            self._update_dynamic_rope(start + n)
        q = self._project(x, self.q_proj, self.heads)
        k = self._project(x, self.k_proj, self.kv_heads)
        v = self._project(x, self.v_proj, self.kv_heads)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        mask = None
        if self.backend == "tileattn" and not needs_grad and not padded:
            # RoPE and the append happen in the kernel; q/k/v are read through their strides.
            o = attention_with_kvcache(q, self.k_cache, self.v_cache, k, v, cache_seqlens=start,
                                       rotary_cos=self.rope_cos, rotary_sin=self.rope_sin,
                                       is_causal=True)
        else:
            if padded:  # per-token positions: cos/sin [B, 1, N, D/2]
                cos, sin = self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]
                self.key_real[:, start:start + n] = real
                self.real_count += real.sum(1)
                # [B, 1, N, start + N]: a real key at or before the query's slot
                slots = torch.arange(start + n)
                mask = self.key_real[:, None, None, :start + n] & (slots[None, :] <= start + torch.arange(n)[:, None])
            else:
                cos, sin = self.rope_cos[start:start + n], self.rope_sin[start:start + n]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            with torch.no_grad():
                self.k_cache[:, :, start:start + n] = k
                self.v_cache[:, :, start:start + n] = v
            if not needs_grad:  # the cache holds everything: attend to views of it, no copies
                k, v = self.k_cache[:, :, :start + n], self.v_cache[:, :, :start + n]
            elif start > 0:  # keep the new keys/values in the autograd graph
                k = torch.cat([self.k_cache[:, :, :start], k], dim=2)
                v = torch.cat([self.v_cache[:, :, :start], v], dim=2)
            if self.backend == "tileattn":
                o = flash_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
            else:
                if mask is not None:  # a row that sees nothing (a padding query): SDPA would give NaN
                    mask = mask | ~mask.any(-1, keepdim=True)
                else:
                    from torch.nn.attention.bias import causal_lower_right
                    mask = causal_lower_right(n, start + n) if n > 1 else None
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        self.cache_length = start + n
        return self.o_proj(o.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))
