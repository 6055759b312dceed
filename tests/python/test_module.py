"""tileattn.FlashAttention (Llama-style layer) and load_huggingface_weights."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import tileattn

CONFIG = dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, rope_theta=500000.0,
              max_position_embeddings=40)


def layer(backend="tileattn", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return tileattn.FlashAttention(tileattn.AttentionConfig(**CONFIG, dtype=dtype), backend=backend)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
def test_prefill_then_decode_equals_one_prefill(dtype, atol):
    m = layer(dtype=dtype)
    x = torch.randn(2, 17, 96, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        whole = m(x)
        parts = [m(x[:, :5])] + [m.incremental_forward(x[:, t:t + 1]) for t in range(5, 17)]
    assert m.cache_length == 17
    torch.testing.assert_close(torch.cat(parts, 1), whole, atol=atol, rtol=0)


def test_matches_sdpa_backend_prefill_and_decode():
    ours, theirs = layer(), layer(backend="sdpa")
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(1, 12, 96, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(x[:, :9]), theirs(x[:, :9]), atol=2e-6, rtol=0)
        for t in range(9, 12):
            torch.testing.assert_close(ours.incremental_forward(x[:, t:t + 1]),
                                       theirs.incremental_forward(x[:, t:t + 1]), atol=2e-6, rtol=0)


def test_training_path_has_gradients_and_same_output():
    m = layer()
    x = torch.randn(1, 8, 96, requires_grad=True)
    y = m(x)
    y.square().sum().backward()
    assert x.grad is not None and m.k_proj.weight.grad.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(m(x), y.detach(), atol=2e-6, rtol=0)


def test_cache_overflow_and_bad_input_raise():
    m = layer()
    with torch.no_grad():
        m(torch.randn(1, 39, 96))
        m.incremental_forward(torch.randn(1, 1, 96))
        with pytest.raises(ValueError, match="overflow"):
            m.incremental_forward(torch.randn(1, 1, 96))
        with pytest.raises(ValueError, match="x: expected"):
            m(torch.randn(1, 3, 95))


@pytest.mark.parametrize("backend", ["tileattn", "sdpa"])
@pytest.mark.parametrize("grad", [False, True])
def test_padded_prefill_of_no_tokens_is_empty_like_the_unpadded_one(backend, grad):
    """N = 0 with a padding mask [B, 0] or lengths [0, 0] gives the empty [B, 0, hidden], as
    without one; the sequence goes on from there."""
    m = layer(backend)
    step = torch.randn(2, 1, 96, generator=torch.Generator().manual_seed(4))
    with torch.set_grad_enabled(grad):
        expected = m(step)
        for padding in (dict(attention_mask=torch.ones(2, 0)), dict(lengths=torch.tensor([0, 0]))):
            out = m(torch.zeros(2, 0, 96), **padding)
            assert out.shape == (2, 0, 96) and m.cache_length == 0
            torch.testing.assert_close(m.incremental_forward(step), expected, atol=2e-6, rtol=0)


@pytest.mark.parametrize("backend", ["tileattn", "sdpa"])
@pytest.mark.parametrize("convert", [lambda m: m.to(torch.bfloat16), lambda m: m.half(),
                                     lambda m: m.to(dtype=torch.bfloat16)])
def test_layer_converted_after_construction_equals_one_built_in_that_dtype(backend, convert):
    """.to(dtype) / .half() after construction: the KV cache follows the projections' dtype
    and the RoPE tables stay float32, so the layer computes exactly what a layer built in
    that dtype with the same weights computes (prefill, then decode)."""
    m = convert(layer(backend))
    dtype = m.q_proj.weight.dtype
    built = layer(backend, dtype=dtype, seed=1)
    built.load_state_dict(m.state_dict())
    assert m.rope_cos.dtype == m.rope_sin.dtype == torch.float32
    x = torch.randn(1, 7, 96, generator=torch.Generator().manual_seed(5)).to(dtype)
    with torch.no_grad():
        assert torch.equal(m(x[:, :5]), built(x[:, :5]))
        assert m.k_cache.dtype == dtype
        for t in range(5, 7):
            assert torch.equal(m.incremental_forward(x[:, t:t + 1]), built.incremental_forward(x[:, t:t + 1]))


def test_layer_converted_between_prefill_and_decode_keeps_its_cache():
    m, ref = layer(), layer()
    x = torch.randn(1, 6, 96, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        m(x[:, :5])
        ref(x[:, :5])
        m.to(torch.bfloat16)
        got = m.incremental_forward(x[:, 5:].bfloat16())
        expected = ref.incremental_forward(x[:, 5:])
    assert m.k_cache.dtype == torch.bfloat16 and m.cache_length == 6
    torch.testing.assert_close(got.float(), expected, atol=6e-2, rtol=0)


def write_checkpoint(tmp_path, layers=2, sharded=False):
    g = torch.Generator().manual_seed(3)
    tensors = {}
    for i in range(layers):
        for p, shape in (("q_proj", (96, 96)), ("k_proj", (32, 96)), ("v_proj", (32, 96)), ("o_proj", (96, 96))):
            tensors[f"model.layers.{i}.self_attn.{p}.weight"] = torch.randn(*shape, generator=g).bfloat16()
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(8, 96, generator=g)
    if not sharded:
        save_file(tensors, str(tmp_path / "model.safetensors"))
        return tensors
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tensors


@pytest.mark.parametrize("sharded", [False, True])
def test_load_huggingface_weights_returns_the_written_tensors(tmp_path, sharded):
    tensors = write_checkpoint(tmp_path, sharded=sharded)
    for path in ([tmp_path] if sharded else [tmp_path, tmp_path / "model.safetensors"]):
        w = tileattn.load_huggingface_weights(path, 1)
        assert sorted(w) == ["k_proj", "o_proj", "q_proj", "v_proj"]
        for p, t in w.items():
            assert t.dtype == torch.bfloat16
            assert torch.equal(t, tensors[f"model.layers.1.self_attn.{p}.weight"])
    m = tileattn.FlashAttention.from_pretrained(tmp_path, 0, tileattn.AttentionConfig(**CONFIG))
    assert torch.equal(m.q_proj.weight, tensors["model.layers.0.self_attn.q_proj.weight"].float())


def test_sharded_checkpoint_reads_every_shard_of_the_layer(tmp_path):
    """A bias or a tensor this layer does not build (Qwen3's q_norm) in a shard of its own is seen:
    the bias is loaded and the q_norm raises KeyError, whichever shard holds them."""
    tensors = {f"model.layers.0.self_attn.{p}.weight": torch.randn(8, 8) for p in ("q_proj", "k_proj", "v_proj",
                                                                                 "o_proj")}
    bias = {"model.layers.0.self_attn.q_proj.bias": torch.randn(8)}
    norm = {"model.layers.0.self_attn.q_norm.weight": torch.randn(8)}
    for name, extra in (("bias", bias), ("norm", norm)):
        folder = tmp_path / name
        folder.mkdir()
        save_file(tensors, str(folder / "a.safetensors"))
        save_file(extra, str(folder / "b.safetensors"))
        weight_map = {k: "a.safetensors" for k in tensors} | {k: "b.safetensors" for k in extra}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    w = tileattn.load_huggingface_weights(tmp_path / "bias", 0)
    assert torch.equal(w["q_proj.bias"], bias["model.layers.0.self_attn.q_proj.bias"])
    with pytest.raises(KeyError, match="q_norm.weight"):
        tileattn.load_huggingface_weights(tmp_path / "norm", 0)


def test_a_layer_first_run_under_inference_mode_runs_outside_it():
    """Cache buffers made under torch.inference_mode() are inference tensors; a new sequence
    outside it gets new buffers instead of writing the inference tensors."""
    m = tileattn.FlashAttention(tileattn.AttentionConfig(hidden_size=64, num_attention_heads=4,
                                                         max_position_embeddings=32))
    x = torch.randn(1, 6, 64)
    with torch.inference_mode():
        inside = m(x)
    with torch.no_grad():
        outside = m(x)
        assert not m.k_cache.is_inference()
        m.incremental_forward(torch.randn(1, 1, 64))
    torch.testing.assert_close(outside, inside.clone())


def test_set_num_threads_takes_integer_types():
    before = tileattn.get_num_threads()
    try:
        tileattn.set_num_threads(np.int64(1))
        assert tileattn.get_num_threads() == 1
        with pytest.raises(TypeError, match="threads"):
            tileattn.set_num_threads(1.0)
    finally:
        tileattn.set_num_threads(0)
    assert tileattn.get_num_threads() == before


def test_load_errors(tmp_path):
    write_checkpoint(tmp_path)
    with pytest.raises(KeyError, match="model.layers.7.self_attn.q_proj.weight"):
        tileattn.load_huggingface_weights(tmp_path, 7)
    with pytest.raises(FileNotFoundError, match="path"):
        tileattn.load_huggingface_weights(tmp_path / "missing", 0)
    with pytest.raises(ValueError, match="layer_idx"):
        tileattn.load_huggingface_weights(tmp_path, -1)
    m = tileattn.FlashAttention(tileattn.AttentionConfig(hidden_size=64, num_attention_heads=4))
    with pytest.raises(ValueError, match="q_proj has shape"):
        m.load_weights(tileattn.load_huggingface_weights(tmp_path, 0))
