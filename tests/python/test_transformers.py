"""attn_implementation="tileattn" in Hugging Face transformers, on tiny random-init models:
logits against "eager" (the float64 rule of reference.py is for kernels; here two float32 models
that round differently are compared, within 1e-3 relative / 1e-4 absolute of logits of size
~0.1-1: a non-causal or mask-blind attention misses that by orders of magnitude), greedy generate() tokens identical to
"eager" with the dynamic and the static cache, a left-padded batch, and gradients. Weights are
initialized 15x larger than transformers' default (initializer_range 0.3): with the default the
attention barely moves the tiny models' logits, and a non-causal attention passed the checks."""
import copy
import sys

import pytest
import torch

import tileattn

transformers = pytest.importorskip("transformers")
# TileattnCache builds on transformers' cache layers; the oldest version tileattn claims for the
# attention function (4.53, scripts/test_oldest_transformers.sh) has none.
HAS_CACHE_LAYERS = hasattr(__import__("transformers.cache_utils").cache_utils, "DynamicLayer")
needs_cache_layers = pytest.mark.skipif(not HAS_CACHE_LAYERS, reason="transformers without cache layers (DynamicLayer)")

MODELS = {
    "llama": lambda: transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                              num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3),
    "qwen2": lambda: transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=96,
                                              num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=1, max_position_embeddings=128, initializer_range=0.3),
    # Gemma 2: soft-capped scores (a cap of 2 that the larger weights exceed), its query scalar,
    # alternating sliding-window and full layers.
    "gemma2": lambda: transformers.Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=96,
                                                num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=2, head_dim=16, sliding_window=6,
                                                attn_logit_softcapping=2.0, query_pre_attn_scalar=12,
                                                max_position_embeddings=128, initializer_range=0.3),
    "mistral": lambda: transformers.MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                                  num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, max_position_embeddings=128,
                                                  sliding_window=6, initializer_range=0.3),
}
if hasattr(transformers, "DeepseekV3Config"):
    # DeepSeek-V3: multi-head latent attention, q/k head_dim 24 (16 + 8 rotary) against v head_dim 16.
    MODELS["deepseek_v3"] = lambda: transformers.DeepseekV3Config(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=128, q_lora_rank=32, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1, initializer_range=0.3)
if hasattr(transformers, "GptOssConfig"):
    # gpt-oss: a sink logit per query head (s_aux), alternating sliding-window and full layers.
    MODELS["gpt_oss"] = lambda: transformers.GptOssConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=6, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=128, initializer_range=0.3)


def make(kind, impl):
    torch.manual_seed(0)
    config = MODELS[kind]()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl)  # float32
    return model.eval()


def test_register_returns_the_name():
    assert tileattn.transformers.register() == "tileattn"


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_prefill_logits_match_eager(kind):
    tileattn.transformers.register()
    ids = torch.randint(0, 97, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = make(kind, "eager")(ids).logits
        got = make(kind, "tileattn")(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_left_padded_batch_matches_eager(kind):
    tileattn.transformers.register()
    ids = torch.randint(1, 97, (2, 17), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding of the first sequence
    with torch.no_grad():
        want = make(kind, "eager")(ids, attention_mask=mask).logits
        got = make(kind, "tileattn")(ids, attention_mask=mask).logits
    # Padded positions' outputs are not defined the same way (eager softmaxes a fully masked
    # row, tileattn gives zeros); every real position must agree.
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"] + [k for k in ("gpt_oss", "deepseek_v3") if k in MODELS])
def test_greedy_generate_gives_eager_tokens(kind, cache):
    tileattn.transformers.register()
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    options = dict(max_new_tokens=12, do_sample=False, attention_mask=mask, pad_token_id=0)
    if cache == "static":
        options["cache_implementation"] = "static"
    with torch.no_grad():
        want = make(kind, "eager").generate(ids, **options)
        got = make(kind, "tileattn").generate(ids, **options)
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["llama"] + [k for k in ("gpt_oss", "deepseek_v3") if k in MODELS])
def test_gradients_match_eager(kind):
    """Every parameter's gradient, gpt-oss's sink logits included."""
    tileattn.transformers.register()
    ids = torch.randint(0, 97, (2, 19), generator=torch.Generator().manual_seed(4))
    grads = {}
    for impl in ("eager", "tileattn"):
        model = make(kind, impl)
        loss = model(ids, labels=ids).loss
        loss.backward()
        grads[impl] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["eager"].keys() == grads["tileattn"].keys()
    for name, want in grads["eager"].items():
        torch.testing.assert_close(grads["tileattn"][name], want, rtol=1e-3, atol=1e-5, msg=name)


# Not gpt-oss: its experts' top-k routing flips between two bf16 runs that differ by roundings,
# which moves gradients far more than the attention does.
@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_autocast_bf16_matches_sdpa_or_eager(kind):
    """Under torch.autocast("cpu", bfloat16) (Trainer(bf16=True) on a CPU) RoPE leaves q and k
    in fp32 next to a bf16 v; SDPA takes all three in bf16 and so does tileattn (it once
    refused the call: "v: dtype torch.bfloat16 differs from q's torch.float32")."""
    tileattn.transformers.register()
    ids = torch.randint(0, 97, (2, 17), generator=torch.Generator().manual_seed(5))
    out = {}
    reference = "sdpa" if kind == "llama" else "eager"  # Gemma 2 and gpt-oss have no sdpa
    for impl in (reference, "tileattn"):
        model = make(kind, impl).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            result = model(ids, labels=ids)
        result.loss.backward()
        out[impl] = (result.logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert out["tileattn"][0].dtype == out[reference][0].dtype
    # Both round q, k, v and the output to bf16; their sums differ by bf16 roundings.
    scale = out[reference][0].float().abs().max()
    torch.testing.assert_close(out["tileattn"][0].float(), out[reference][0].float(), rtol=0, atol=3e-2 * scale)
    for name, want in out[reference][1].items():
        got = out["tileattn"][1][name]
        assert (got - want).abs().max() <= 5e-2 * want.abs().max() + 1e-6, name


def test_unsupported_features_say_so():
    """Attention weights come without gradient: asked for while training, NotImplementedError;
    a learned position bias has no gradient with dropout: NotImplementedError at the forward."""
    tileattn.transformers.register()
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    module = torch.nn.Module()
    module.is_causal = True
    with pytest.raises(NotImplementedError, match="output_attentions while training"):
        tileattn.transformers.tileattn_attention_forward(module, q, q, q, None, output_attentions=True)
    bias = torch.zeros(1, 2, 4, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="position_bias.*dropout"):
        tileattn.transformers.tileattn_attention_forward(module, q, q, q, None, dropout=0.1, position_bias=bias)
    module.eval()
    with torch.no_grad():
        out, weights = tileattn.transformers.tileattn_attention_forward(module, q, q, q, None, output_attentions=True)
    assert weights.shape == (1, 2, 4, 4) and torch.allclose(weights.sum(-1), torch.ones(1, 2, 4))
    with pytest.raises(NotImplementedError, match=r"sink logits of shape \(1, 2, 4, 1\)"):  # per token
        tileattn.transformers.tileattn_attention_forward(module, q, q, q, None, s_aux=torch.zeros(1, 2, 4, 1))


def test_no_mask_means_sdpa_semantics():
    """Without a mask the attention function does what transformers' sdpa does: top-left causal
    for several queries (even with more keys than queries), every key for one query."""
    torch.manual_seed(5)
    module = torch.nn.Module()
    module.is_causal = True
    module.training = False
    q, k, v = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    got, _ = tileattn.transformers.tileattn_attention_forward(module, q, k, v, None, scaling=0.3)
    want = torch.nn.functional.scaled_dot_product_attention(q, kr, vr, is_causal=True, scale=0.3)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    # [B, q, H, D] written in that layout: the model's reshape to [B, q, H * D] needs no copy.
    assert got.is_contiguous()
    got, _ = tileattn.transformers.tileattn_attention_forward(module, q[:, :, :1], k, v, None, scaling=0.3)
    want = torch.nn.functional.scaled_dot_product_attention(q[:, :, :1], kr, vr, scale=0.3)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_bool_and_additive_masks_mean_what_sdpa_makes_of_them():
    """transformers hands the attention function a 4-D bool mask (True = attend), an additive
    float mask (0 / -inf or a large negative), possibly wider than the keys: each gives sdpa's
    result."""
    torch.manual_seed(6)
    module = torch.nn.Module()
    module.is_causal = True
    module.training = False
    q, k, v = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    keep = torch.rand(2, 1, 5, 9) > 0.3
    keep[..., 0] = True  # every row sees a key
    additive = torch.zeros(2, 1, 5, 9).masked_fill(~keep, torch.finfo(torch.float32).min)
    wide = torch.cat([keep, torch.ones(2, 1, 5, 3, dtype=torch.bool)], dim=-1)  # wider than the keys
    want = torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=keep, scale=0.25)
    for mask in (keep, additive, wide):
        got, _ = tileattn.transformers.tileattn_attention_forward(module, q, k, v, mask, scaling=0.25)
        torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-6)


@needs_cache_layers
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2"])
def test_tileattn_cache_generate_gives_eager_tokens(kind):
    """TileattnCache (in-place appends) in generate(): the tokens of eager with its own cache,
    for a left-padded batch; Gemma 2 mixes its full layers (here) with sliding ones (transformers')."""
    tileattn.transformers.register()
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    options = dict(max_new_tokens=12, do_sample=False, attention_mask=mask, pad_token_id=0)
    with torch.no_grad():
        want = make(kind, "eager").generate(ids, **options)
        model = make(kind, "tileattn")
        cache = tileattn.transformers.TileattnCache(config=model.config)
        cache_argument = "cache" if int(transformers.__version__.split(".")[0]) >= 5 else "past_key_values"
        got = model.generate(ids, **{cache_argument: cache}, **options)
    assert torch.equal(got, want)
    grown = [layer for layer in cache.layers if isinstance(layer, tileattn.transformers.GrowingLayer)]
    assert grown and all(layer.get_seq_length() == ids.shape[1] + 11 for layer in grown)


@needs_cache_layers
def test_growing_layer_holds_what_concatenation_holds():
    """Appends across a capacity doubling, a crop, a beam reorder: the views equal torch.cat's."""
    layer = tileattn.transformers.GrowingLayer()
    keys, values = [], []
    for n in (200, 1, 60, 3):  # 200 -> capacity 256; 264 -> 512
        k, v = torch.randn(2, 3, n, 8), torch.randn(2, 3, n, 8)
        keys.append(k)
        values.append(v)
        got_k, got_v = layer.update(k, v)
        assert torch.equal(got_k, torch.cat(keys, dim=2)) and torch.equal(got_v, torch.cat(values, dim=2))
    assert layer.capacity() == 512 and layer.get_seq_length() == 264
    layer.crop(-4)
    assert torch.equal(layer.keys, torch.cat(keys, dim=2)[:, :, :260])
    layer.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(layer.values, torch.cat(values, dim=2)[[1, 0], :, :260])
    with pytest.raises(ValueError, match="TileattnCache"):
        layer.update(torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8))  # 4 heads, not 3


def test_tileattn_cache_says_not_supported_without_cache_layers(monkeypatch):
    """transformers without cache layers (4.53; on later versions DynamicLayer is hidden to
    stand for it): TileattnCache raises NotImplementedError naming the version."""
    if HAS_CACHE_LAYERS:
        monkeypatch.delattr(__import__("transformers.cache_utils").cache_utils, "DynamicLayer")
        monkeypatch.delitem(sys.modules, "tileattn._hf_cache", raising=False)
        monkeypatch.delattr(tileattn, "_hf_cache", raising=False)  # else `from . import` reuses it
    with pytest.raises(NotImplementedError, match="TileattnCache: not supported with transformers"):
        tileattn.transformers.TileattnCache  # noqa: B018




def eager_and_tileattn(config):
    """{"eager": model, "tileattn": model} of `config` with the same weights, in eval mode; a config
    of its own each (from_config records the implementation in the config)."""
    models = {}
    for impl in ("eager", "tileattn"):
        torch.manual_seed(0)
        models[impl] = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config),
                                                                     attn_implementation=impl).eval()
    models["tileattn"].load_state_dict(models["eager"].state_dict())
    return models


@pytest.mark.skipif(not hasattr(transformers, "Gemma4TextConfig"), reason="transformers without Gemma 4")
def test_gemma4_kv_shared_layers_keep_causality_when_queries_are_dropped():
    """Gemma 4 runs its KV-shared layers on the last logits_to_keep queries only, after building
    the masks, and keeps the masks for that only under the name "sdpa": tileattn's mask builder
    never skips them for such models (a skipped mask took a top-left causal cut, or let a static
    cache's one prefill query see the unwritten slots)."""
    tileattn.transformers.register()
    config = transformers.Gemma4TextConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=64, vocab_size_per_layer_input=97,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        hidden_size_per_layer_input=8, num_kv_shared_layers=2, initializer_range=0.3, max_position_embeddings=128)
    models = eager_and_tileattn(config)
    ids = torch.randint(3, 97, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(models["tileattn"](ids, logits_to_keep=4).logits,
                                   models["eager"](ids, logits_to_keep=4).logits, rtol=1e-4, atol=1e-5)
        runs = {impl: m.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0, output_scores=True,
                                 return_dict_in_generate=True, cache_implementation="static")
                for impl, m in models.items()}
    torch.testing.assert_close(torch.stack(runs["tileattn"].scores), torch.stack(runs["eager"].scores),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not hasattr(transformers, "DeepseekV4Config"), reason="transformers without DeepSeek-V4")
def test_deepseek_v4_float_block_bias_in_the_mask():
    """DeepSeek-V4 appends its compressor's float block bias to the mask it is given (eager's
    convention): it gets eager's float mask, never a boolean one or None."""
    tileattn.transformers.register()
    config = transformers.DeepseekV4Config(
        vocab_size=97, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, q_lora_rank=32, num_experts_per_tok=2, n_routed_experts=4,
        sliding_window=6, o_groups=2, o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4, hc_mult=2,
        num_nextn_predict_layers=0, initializer_range=0.3, max_position_embeddings=128,
        compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
        layer_types=["compressed_sparse_attention", "heavily_compressed_attention"])
    models = eager_and_tileattn(config)
    for n in (16, 5):  # a mask with the block bias, and one sdpa's builder would have skipped
        ids = torch.randint(3, 97, (2, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            torch.testing.assert_close(models["tileattn"](ids).logits, models["eager"](ids).logits,
                                       rtol=1e-4, atol=1e-5)
