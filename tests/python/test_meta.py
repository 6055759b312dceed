"""Tensors on the meta device: shape inference through the custom ops' fake kernels (as torch's
own SDPA does), the same argument checks as on the CPU, and a ValueError naming the tensor when
meta and CPU tensors mix (tileattn runs on the CPU only)."""
import pytest
import torch

import tileattn


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_flash_attention_and_drop_ins_infer_shapes():
    o, lse = tileattn.flash_attention(meta(2, 4, 6, 16), meta(2, 2, 9, 16), meta(2, 2, 9, 8), return_lse=True)
    assert (o.device.type, tuple(o.shape), o.dtype) == ("meta", (2, 4, 6, 8), torch.float32)
    assert (lse.device.type, tuple(lse.shape), lse.dtype) == ("meta", (2, 4, 6), torch.float32)
    bf16 = [meta(*s, dtype=torch.bfloat16) for s in ((2, 6, 4, 16), (2, 9, 2, 16), (2, 9, 2, 16))]
    o = tileattn.flash_attention(*bf16, layout="bshd", is_causal=True, attn_mask=meta(6, 9, dtype=torch.bool))
    assert (o.device.type, tuple(o.shape), o.dtype) == ("meta", (2, 6, 4, 16), torch.bfloat16)
    o = tileattn.scaled_dot_product_attention(meta(2, 4, 6, 16), meta(2, 4, 9, 16), meta(2, 4, 9, 16), is_causal=True)
    assert o.is_meta and tuple(o.shape) == (2, 4, 6, 16)
    assert tuple(tileattn.flash_attn_func(*bf16, causal=True).shape) == (2, 6, 4, 16)
    cu = meta(3, dtype=torch.int32)
    o, lse = tileattn.flash_attention(meta(7, 4, 16), meta(11, 2, 16), meta(11, 2, 16), cu_seqlens_q=cu,
                                      cu_seqlens_k=cu, return_lse=True)
    assert (tuple(o.shape), tuple(lse.shape)) == ((7, 4, 16), (4, 7)) and o.is_meta
    # The checks still hold on metadata.
    with pytest.raises(ValueError, match="k: 3 heads must divide q's 4 heads"):
        tileattn.flash_attention(meta(2, 4, 6, 16), meta(2, 3, 9, 16), meta(2, 3, 9, 16))


def test_gradients_on_meta():
    q, k, v, mask = meta(2, 4, 6, 16), meta(2, 2, 9, 16), meta(2, 2, 9, 8), meta(6, 9)
    for t in (q, k, v, mask):
        t.requires_grad_()
    o, lse = tileattn.flash_attention(q, k, v, attn_mask=mask, return_lse=True)
    (o.sum() + lse.sum()).backward()
    for t in (q, k, v, mask):
        assert t.grad.is_meta and t.grad.shape == t.shape


def test_kvcache_merge_and_module_on_meta():
    o, lse = tileattn.attention_with_kvcache(meta(2, 4, 1, 16), meta(2, 2, 9, 16), meta(2, 2, 9, 16),
                                             meta(2, 2, 1, 16), meta(2, 2, 1, 16), cache_seqlens=3,
                                             rotary_cos=meta(9, 8), rotary_sin=meta(9, 8), return_lse=True)
    assert (tuple(o.shape), tuple(lse.shape), o.device.type) == ((2, 4, 1, 16), (2, 4, 1), "meta")
    o = tileattn.flash_attn_with_kvcache(meta(2, 1, 4, 16), meta(2, 9, 2, 16), meta(2, 9, 2, 16), cache_seqlens=3)
    assert o.is_meta and tuple(o.shape) == (2, 1, 4, 16)
    o, lse = tileattn.merge_states(meta(2, 4, 6, 16), meta(2, 4, 6), meta(2, 4, 6, 16), meta(2, 4, 6))
    assert o.is_meta and lse.is_meta
    from tileattn._module import AttentionConfig, FlashAttention
    with torch.device("meta"):  # a layer built on meta (deferred init) runs for shapes
        layer = FlashAttention(AttentionConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                               max_position_embeddings=64))
        assert tuple(layer(torch.empty(2, 7, 64)).shape) == (2, 7, 64)
        assert tuple(layer.incremental_forward(torch.empty(2, 1, 64)).shape) == (2, 1, 64)


def test_meta_mixed_with_cpu_is_refused_by_name():
    cpu = torch.zeros(2, 2, 9, 16)
    with pytest.raises(ValueError, match="k: tensor is on device 'meta' but q is not"):
        tileattn.flash_attention(torch.zeros(2, 4, 6, 16), meta(2, 2, 9, 16), cpu)
    with pytest.raises(ValueError, match="attn_mask: tensor is on device 'meta'"):
        tileattn.flash_attention(torch.zeros(2, 4, 6, 16), cpu, cpu, attn_mask=meta(6, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="q: tensor is on device 'meta' but k_cache is not"):
        tileattn.attention_with_kvcache(meta(2, 4, 1, 16), cpu, cpu, cache_seqlens=3)
    with pytest.raises(ValueError, match="o_a: tensor is on device 'meta' but lse_a is not"):
        tileattn.merge_states(meta(2, 4, 6, 16), torch.zeros(2, 4, 6), meta(2, 4, 6, 16), meta(2, 4, 6))
    with pytest.raises(NotImplementedError, match="return_attn_probs: not supported on the meta device"):
        tileattn.flash_attention(meta(2, 4, 6, 16), meta(2, 2, 9, 16), meta(2, 2, 9, 16), return_attn_probs=True)


def test_other_devices_are_refused_by_name():
    """A CUDA tensor (faked: FakeTensorMode makes one without a GPU) is a ValueError naming the
    argument and its device, on every entry point, also now that meta tensors are accepted."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k = torch.empty(1, 2, 4, 8, device="cuda"), torch.empty(1, 2, 4, 8, device="cuda")
        calls = {"q": lambda: tileattn.flash_attention(q, k, k),
                 "q ": lambda: tileattn.scaled_dot_product_attention(q, k, k, is_causal=True),
                 "k_cache": lambda: tileattn.attention_with_kvcache(q[:, :, :1], k, k, cache_seqlens=2),
                 "o_a": lambda: tileattn.merge_states(q, q[..., 0], q, q[..., 0])}
        for name, call in calls.items():
            with pytest.raises(ValueError, match=f"{name.strip()}: tensor is on device 'cuda:0'"):
                call()
