"""The soft cap (``softcap=c``: each scaled score x becomes c * tanh(x / c) before the masks), in
flash_attention and attention_with_kvcache, NumPy and torch, against the float64 reference with
the project's tolerance rule (reference.check_close). Gradients: test_grad.py's softcap cases."""
import math

import numpy as np
import pytest
import torch

import tileattn
from reference import check_close


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# Inputs of standard deviation 2 at D = 32: scaled scores of deviation ~4, mostly beyond c = 3.
CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window=(5, 2)),
    "additive": dict(add_mask=True),
    "bool": dict(bool_mask=True),
}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", list(CASES))
def test_numpy_forward_matches_float64_reference(rng, dtype, case):
    b, h, hk, nq, nk, d = 2, 4, 2, 37, 70, 32
    q, k, v = rand(rng, b, h, nq, d, scale=2), rand(rng, b, hk, nk, d, scale=2), rand(rng, b, hk, nk, d)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    opts = dict(CASES[case])
    mask = None
    if opts.pop("add_mask", False):
        mask = rand(rng, b, h, nq, nk)
        opts["add_mask"] = mask
    if opts.pop("bool_mask", False):
        mask = rng.random((nq, nk)) > 0.3
        opts["bool_mask"] = mask
    o, lse = tileattn.flash_attention(q, k, v, attn_mask=mask, is_causal=opts.get("causal", False),
                                      window=opts.get("window"), softcap=3.0, return_lse=True)
    check_close(o, q, k, v, dtype, got_lse=lse, softcap=3.0, **opts)
    # The cap matters here: the uncapped reference is far off.
    with pytest.raises(AssertionError):
        check_close(o, q, k, v, dtype, **opts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_forward_eager_and_op_paths(dtype):
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(1, 8, 33, 64, generator=g) * 2).to(dtype)
    k = (torch.randn(1, 2, 50, 64, generator=g) * 2).to(dtype)
    v = torch.randn(1, 2, 50, 64, generator=g).to(dtype)
    o = tileattn.flash_attention(q, k, v, is_causal=True, softcap=3.0)
    name = "float32" if dtype == torch.float32 else "bfloat16"
    check_close(o.float().numpy(), q.float().numpy(), k.float().numpy(), v.float().numpy(), name,
                causal=True, softcap=3.0)
    # The custom op's path (autograd can observe the call) computes the same bits.
    o_op = tileattn.flash_attention(q.requires_grad_(), k, v, is_causal=True, softcap=3.0)
    assert torch.equal(o_op.detach(), o)


def test_kvcache_contiguous_and_paged(rng):
    b, h, hk, d, cap = 2, 4, 2, 32, 24
    q_all, k_all, v_all = rand(rng, b, h, 13, d, scale=2), rand(rng, b, hk, 13, d, scale=2), rand(rng, b, hk, 13, d)
    kc, vc = np.zeros((b, hk, cap, d), np.float32), np.zeros((b, hk, cap, d), np.float32)
    o = tileattn.attention_with_kvcache(q_all[:, :, :10], kc, vc, k_all[:, :, :10], v_all[:, :, :10],
                                        cache_seqlens=np.zeros(b, np.int32), softcap=3.0)
    check_close(o, q_all[:, :, :10], k_all[:, :, :10], v_all[:, :, :10], "float32", causal=True, softcap=3.0)
    for t in range(10, 13):
        o, lse = tileattn.attention_with_kvcache(q_all[:, :, t:t + 1], kc, vc, k_all[:, :, t:t + 1],
                                                 v_all[:, :, t:t + 1], cache_seqlens=t, return_lse=True,
                                                 softcap=3.0)
        check_close(o, q_all[:, :, t:t + 1], k_all[:, :, :t + 1], v_all[:, :, :t + 1], "float32",
                    got_lse=lse, causal=True, softcap=3.0)
    # Paged, through torch (the eager call and the custom op agree).
    page = 4
    pk, pv = torch.zeros(8, hk, page, d), torch.zeros(8, hk, page, d)
    table = torch.tensor([[5, 0, 7], [2, 6, 1]], dtype=torch.int32)
    q, k, v = (torch.from_numpy(x[:, :, :11].copy()) for x in (q_all, k_all, v_all))
    o = tileattn.attention_with_kvcache(q[:, :, 8:], pk, pv, k, v, cache_seqlens=torch.zeros(b, dtype=torch.int32),
                                        block_table=table, softcap=3.0)
    check_close(o.numpy(), q[:, :, 8:].numpy(), k.numpy(), v.numpy(), "float32", causal=True, softcap=3.0)
    from tileattn import _torch_ops
    pk2, pv2 = torch.zeros_like(pk), torch.zeros_like(pv)
    o_op, _ = _torch_ops.attention_with_kvcache(q[:, :, 8:], pk2, pv2, k, v, torch.zeros(b, dtype=torch.int32),
                                                table, None, None, False, None, True, -1, -1, 3.0)
    assert torch.equal(o_op, o)


@pytest.mark.parametrize("bad", [-1.0, -1e-9, math.nan, math.inf, float("-inf")])
def test_bad_softcap_is_a_value_error_naming_it(rng, bad):
    q = rand(rng, 1, 2, 4, 8)
    with pytest.raises(ValueError, match="softcap"):
        tileattn.flash_attention(q, q, q, softcap=bad)
    with pytest.raises(ValueError, match="softcap"):
        tileattn.flash_attention(torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(q), softcap=bad)
    kc = np.zeros((1, 2, 8, 8), np.float32)
    with pytest.raises(ValueError, match="softcap"):
        tileattn.attention_with_kvcache(q, kc, kc.copy(), q, q, cache_seqlens=0, softcap=bad)
    assert not kc.any()


@pytest.mark.parametrize("bad", [True, "3", None, [3.0]])
def test_softcap_of_another_type_is_a_type_error(rng, bad):
    q = rand(rng, 1, 2, 4, 8)
    with pytest.raises(TypeError, match="softcap"):
        tileattn.flash_attention(q, q, q, softcap=bad)


def test_zero_softcap_is_off(rng):
    q, k, v = rand(rng, 1, 2, 9, 16, scale=3), rand(rng, 1, 2, 9, 16, scale=3), rand(rng, 1, 2, 9, 16)
    np.testing.assert_array_equal(tileattn.flash_attention(q, k, v, softcap=0), tileattn.flash_attention(q, k, v))
    assert not np.array_equal(tileattn.flash_attention(q, k, v, softcap=2.0), tileattn.flash_attention(q, k, v))


# ALiBi: slopes [H] or [B, H]; the bias -slope * |i + Nk - Nq - j| after the soft cap.
@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_alibi_forward_matches_float64_reference(rng, per_batch, framework):
    b, h, hk, nq, nk, d = 2, 4, 2, 37, 70, 32
    q, k, v = rand(rng, b, h, nq, d), rand(rng, b, hk, nk, d), rand(rng, b, hk, nk, d)
    slopes = (rng.random((b, h) if per_batch else (h,)) * 0.5).astype(np.float32)
    conv = (lambda x: x) if framework == "numpy" else torch.from_numpy
    for causal, softcap in ((False, 0.0), (True, 0.0), (True, 0.5)):
        o, lse = tileattn.flash_attention(conv(q), conv(k), conv(v), is_causal=causal, softcap=softcap,
                                          alibi_slopes=conv(slopes), return_lse=True)
        check_close(np.asarray(o), q, k, v, "float32", got_lse=np.asarray(lse), causal=causal, softcap=softcap,
                    alibi_slopes=slopes)
    with pytest.raises(AssertionError):  # the bias matters
        check_close(np.asarray(o), q, k, v, "float32", causal=True, softcap=0.5)


def test_alibi_kvcache_and_op_paths(rng):
    b, h, hk, d, cap = 2, 4, 2, 32, 24
    q_all, k_all, v_all = rand(rng, b, h, 13, d), rand(rng, b, hk, 13, d), rand(rng, b, hk, 13, d)
    slopes = np.array([[0.5, 0.25, 0.125, 0.0625], [0.3, 0.2, 0.1, 0.05]], np.float32)
    kc, vc = np.zeros((b, hk, cap, d), np.float32), np.zeros((b, hk, cap, d), np.float32)
    tileattn.attention_with_kvcache(q_all[:, :, :10], kc, vc, k_all[:, :, :10], v_all[:, :, :10],
                                    cache_seqlens=np.zeros(b, np.int32))
    o = tileattn.attention_with_kvcache(q_all[:, :, 10:], kc, vc, k_all[:, :, 10:], v_all[:, :, 10:],
                                        cache_seqlens=10, alibi_slopes=slopes, softcap=2.0)
    check_close(o, q_all[:, :, 10:], k_all, v_all, "float32", causal=True, alibi_slopes=slopes, softcap=2.0)
    # torch: the eager call, the custom ops (autograd observes the call) and gradients.
    q, k, v = (torch.from_numpy(x.copy()) for x in (q_all, k_all, v_all))
    ts = torch.from_numpy(slopes)
    eager = tileattn.flash_attention(q, k, v, is_causal=True, alibi_slopes=ts)
    op = tileattn.flash_attention(q.clone().requires_grad_(), k, v, is_causal=True, alibi_slopes=ts)
    assert torch.equal(op.detach(), eager)
    from tileattn import _torch_ops
    kc2, vc2 = torch.zeros(b, hk, cap, d), torch.zeros(b, hk, cap, d)
    o_op, _ = _torch_ops.attention_with_kvcache(q, kc2, vc2, k, v, torch.zeros(b, dtype=torch.int32), None, None,
                                                None, False, None, True, -1, -1, 0.0, ts)
    torch.testing.assert_close(o_op, eager, atol=2e-6, rtol=0)


def test_alibi_bad_shapes_and_values(rng):
    q = rand(rng, 2, 4, 5, 8)
    for bad in (np.ones(3, np.float32), np.ones((3, 4), np.float32), np.ones((2, 4, 1), np.float32)):
        with pytest.raises(ValueError, match="alibi_slopes"):
            tileattn.flash_attention(q, q, q, alibi_slopes=bad)
    with pytest.raises(ValueError, match="alibi_slopes"):
        tileattn.flash_attention(q, q, q, alibi_slopes=np.array([1, np.nan, 1, 1], np.float32))
    with pytest.raises(TypeError, match="alibi_slopes"):
        tileattn.flash_attention(q, q, q, alibi_slopes=np.ones(4, np.int32))
