"""tileattn.FlashAttention built from Hugging Face configs of both generations (transformers 5's
rope_parameters, 4.x's rope_theta + rope_scaling and torch_dtype) and checkpoints saved by
transformers, against transformers' own attention layer with the same weights."""
import json

import pytest
import torch

import tileattn

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # wavelengths on both sides of the blend
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
                                       ("qwen2", {"rope_type": "default"})])
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


def test_unsupported_rope_and_unknown_tensors_say_so(tmp_path):
    with pytest.raises(NotImplementedError, match="yarn"):
        tileattn.AttentionConfig(rope_scaling={"rope_type": "yarn", "factor": 4.0})
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
