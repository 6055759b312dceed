"""tileattn.FlashAttention built from Hugging Face configs of both generations (transformers 5's
rope_parameters, 4.x's rope_theta + rope_scaling and torch_dtype) and checkpoints saved by
transformers, against transformers' own attention layer with the same weights."""
import json

import pytest
import torch

import tileattn

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:  # 4.x configs are made here from 5.x ones (as_4x_dict)
    pytest.skip("builds transformers 5 configs (rope_parameters) and layers", allow_module_level=True)

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # wavelengths on both sides of the blend
# original context 16 < the test's 40 positions; betas 0.25 / 0.05 put the ramp (dims 1.4..2.4,
# truncated to 1..3) inside head_dim 16's 8 frequencies, with frequencies kept, blended and
# interpolated (the defaults 32 / 1 would interpolate all but one, truncated or not).
YARN_ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
             "beta_fast": 0.25, "beta_slow": 0.05}
SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             num_hidden_layers=1, vocab_size=50, max_position_embeddings=128, initializer_range=0.3)


def hf_config(kind, rope):
    if kind == "qwen2":
        return transformers.Qwen2Config(**SMALL, rope_parameters={"rope_theta": 1e6, **rope})
    return transformers.LlamaConfig(**SMALL, rope_parameters={"rope_theta": 5e5, **rope})


def hf_layer_output(model, x):
    """Layer 0's self-attention of `model` on x [1, N, hidden], causal, eager."""
    n = x.shape[1]
    positions = torch.arange(n)[None]
    cos_sin = model.model.rotary_emb(x, positions)
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    out, _ = model.model.layers[0].self_attn(x, position_embeddings=cos_sin, attention_mask=mask)
    return out


def as_4x_dict(config):
    """config.json as transformers 4.4x wrote it: rope_theta and rope_scaling, torch_dtype."""
    d = config.to_dict()
    rope = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rope.pop("rope_theta")
    d["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    d.pop("dtype", None)
    d["torch_dtype"] = "float32"
    return d


@pytest.mark.parametrize("generation", ["5.x object", "5.x config.json", "4.x config.json"])
@pytest.mark.parametrize("kind,rope", [("llama", {"rope_type": "default"}), ("llama", LLAMA3_ROPE),
                                       ("llama", {"rope_type": "linear", "factor": 4.0}),
                                       ("llama", YARN_ROPE), ("qwen2", {"rope_type": "default"})])
def test_layer_from_a_saved_checkpoint_matches_transformers(tmp_path, kind, rope, generation):
    config = hf_config(kind, rope)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model.save_pretrained(tmp_path)
    if generation == "5.x object":
        source = config
    elif generation == "5.x config.json":
        source = json.loads((tmp_path / "config.json").read_text())
    else:
        source = as_4x_dict(config)
    layer = tileattn.FlashAttention.from_pretrained(tmp_path, 0, config=source).eval()
    x = torch.randn(1, 40, SMALL["hidden_size"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_layer_output(model, x)
        got = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_config_fields_of_both_generations():
    new = tileattn.AttentionConfig.from_hf(hf_config("llama", LLAMA3_ROPE))
    old = tileattn.AttentionConfig.from_dict(as_4x_dict(hf_config("llama", LLAMA3_ROPE)))
    for c in (new, old):
        assert c.rope_theta == 5e5 and c.rope_scaling["rope_type"] == "llama3" and c.dtype == torch.float32
    assert tileattn.AttentionConfig.from_dict({"dtype": "bfloat16"}).dtype == torch.bfloat16
    qwen = tileattn.AttentionConfig.from_hf(hf_config("qwen2", {"rope_type": "default"}))
    assert qwen.attention_bias and not qwen.o_proj_bias and qwen.rope_theta == 1e6


def test_attention_features_the_layer_lacks_are_refused_not_ignored():
    """partial rotary (Phi, StableLM), Gemma 2's logit soft-capping and Mistral's sliding window
    would change the outputs; the layer does not compute them, so their configs are refused."""
    for extra, name in [({"partial_rotary_factor": 0.4}, "partial_rotary_factor"),
                        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                              "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
                        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
                        ({"sliding_window": 1024}, "sliding_window")]:  # below the default 2048 positions
        with pytest.raises(NotImplementedError, match=name):
            tileattn.AttentionConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4, **extra})
    # Values that change nothing are read as before.
    for extra in [{"partial_rotary_factor": 1.0}, {"sliding_window": None},
                  {"sliding_window": 4096, "use_sliding_window": False}, {"attn_logit_softcapping": None},
                  {"sliding_window": 262144, "max_position_embeddings": 131072}]:
        tileattn.AttentionConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4, **extra})


def test_unsupported_rope_and_unknown_tensors_say_so(tmp_path):
    with pytest.raises(NotImplementedError, match="longrope"):
        tileattn.AttentionConfig(rope_scaling={"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]})
    layer = tileattn.FlashAttention(hf_config("llama", {"rope_type": "default"}))
    weights = {n: p.detach().clone() for n, p in layer.named_parameters()}
    weights = {n[:-len(".weight")] if n.endswith(".weight") else n: t for n, t in weights.items()}
    with pytest.raises(ValueError, match="unexpected q_proj.bias"):
        layer.load_weights({**weights, "q_proj.bias": torch.zeros(64)})
    with pytest.raises(ValueError, match="missing o_proj"):
        layer.load_weights({k: v for k, v in weights.items() if k != "o_proj"})
    qwen = tileattn.FlashAttention(hf_config("qwen2", {"rope_type": "default"}))
    with pytest.raises(ValueError, match="missing k_proj.bias, q_proj.bias, v_proj.bias"):
        qwen.load_weights(weights)
    # A checkpoint whose attention has a tensor this layer does not build (Qwen3's q_norm).
    from safetensors.torch import save_file
    tensors = {f"model.layers.0.self_attn.{n}.weight": t for n, t in weights.items()}
    tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match="q_norm"):
        tileattn.load_huggingface_weights(tmp_path, 0)


def hf_steps(model, xs):
    """Layer 0's self-attention of `model` on the chunks xs ([1, n, hidden] each) in order, with
    transformers' cache and rotary embedding (which keeps dynamic RoPE's state between calls)."""
    cache, start, outs = transformers.DynamicCache(), 0, []
    for x in xs:
        n = x.shape[1]
        cos_sin = model.model.rotary_emb(x, torch.arange(start, start + n)[None])
        mask = torch.full((n, start + n), float("-inf")).triu(start + 1)[None, None]
        out, _ = model.model.layers[0].self_attn(x, position_embeddings=cos_sin, attention_mask=mask, cache=cache)
        outs.append(out)
        start += n
    return outs


@pytest.mark.parametrize("generation", ["5.x object", "4.x config.json"])
def test_dynamic_rope_past_the_original_context_matches_transformers(generation):
    """Dynamic NTK RoPE with max_position_embeddings 16: a 24-token prefill (frequencies for
    length 24), decode steps that grow it, then a new sequence back under 16 (the original
    frequencies again), each against transformers' layer with the same weights."""
    config = transformers.LlamaConfig(**{**SMALL, "max_position_embeddings": 16},
                                      rope_parameters={"rope_theta": 100.0, "rope_type": "dynamic", "factor": 3.0})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    source = config if generation == "5.x object" else as_4x_dict(config)
    read = tileattn.AttentionConfig.from_hf if generation == "5.x object" else tileattn.AttentionConfig.from_dict
    c = read(source)
    c.max_cache_len = 40
    layer = tileattn.FlashAttention(c).eval()
    attn = model.model.layers[0].self_attn
    layer.load_weights({n: getattr(attn, n).weight for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, 24, 64, generator=g)] + [torch.randn(1, 1, 64, generator=g) for _ in range(3)]
    with torch.no_grad():
        want = hf_steps(model, xs)
        got = [layer(xs[0])] + [layer.incremental_forward(x) for x in xs[1:]]
        for w, o in zip(want, got):
            torch.testing.assert_close(o, w, rtol=1e-4, atol=1e-5)
        short = torch.randn(1, 10, 64, generator=g)
        torch.testing.assert_close(layer(short), hf_steps(model, [short])[0], rtol=1e-4, atol=1e-5)


def padded_layer_and_reference():
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config("llama", {"rope_type": "default"}),
                                                          attn_implementation="eager").eval()
    attn = model.model.layers[0].self_attn
    layer = tileattn.FlashAttention(model.config).eval()
    layer.load_weights({n: getattr(attn, n).weight for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
    return model, layer


@pytest.mark.parametrize("backend", ["tileattn", "sdpa"])
@pytest.mark.parametrize("padding", ["left mask", "right lengths"])
def test_padded_batch_gives_each_sequence_its_own_output(padding, backend):
    """A batch of three sequences of 11, 7 and 4 tokens, padded to 11 (left, by attention_mask;
    right, by lengths), prefill then two decode steps: every real token's output equals that
    sequence run alone through transformers' layer."""
    model, layer = padded_layer_and_reference()
    layer.backend = backend
    g = torch.Generator().manual_seed(2)
    sizes, n = [11, 7, 4], 11
    seqs = [torch.randn(1, m, 64, generator=g) for m in sizes]
    steps = [torch.randn(3, 1, 64, generator=g) for _ in range(2)]
    x = torch.zeros(3, n, 64)
    mask = torch.zeros(3, n, dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, sizes)):
        rows = slice(n - m, n) if padding == "left mask" else slice(0, m)
        x[i, rows], mask[i, rows] = s[0], 1
    with torch.no_grad():
        if padding == "left mask":
            out = layer(x, attention_mask=mask)
        else:
            out = layer(x, lengths=torch.tensor(sizes))
        decoded = []
        for i, step in enumerate(steps):
            full = torch.cat([mask, torch.ones(3, i + 1, dtype=torch.long)], dim=1)
            decoded.append(layer.incremental_forward(step, attention_mask=full if i == 0 else None))
        for i, (s, m) in enumerate(zip(seqs, sizes)):
            want = hf_steps(model, [s] + [step[i:i + 1] for step in steps])
            rows = slice(n - m, n) if padding == "left mask" else slice(0, m)
            torch.testing.assert_close(out[i:i + 1, rows], want[0], rtol=1e-4, atol=1e-5)
            for got, w in zip(decoded, want[1:]):
                torch.testing.assert_close(got[i:i + 1], w, rtol=1e-4, atol=1e-5)


def test_padding_arguments_are_checked():
    _, layer = padded_layer_and_reference()
    x = torch.randn(2, 5, 64)
    with pytest.raises(ValueError, match="attention_mask: expected \\[2, 5\\]"):
        layer(x, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="attention_mask: expected 0/1"):
        layer(x, attention_mask=torch.full((2, 5), 2))
    with pytest.raises(ValueError, match="lengths: every length must be in 0..5"):
        layer(x, lengths=[5, 6])
    with pytest.raises(ValueError, match="lengths: expected integers"):
        layer(x, lengths=[2.0, 3.0])
    with pytest.raises(ValueError, match="give one of them"):
        layer(x, attention_mask=torch.ones(2, 5), lengths=[5, 5])
