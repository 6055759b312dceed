"""V's head dim apart from Q/K's (DeepSeek MLA: 192 / 128 prefill, 576 / 512 absorbed decode
with one KV head): flash_attention (forward and gradients), attention_with_kvcache (contiguous
and paged) and the drop-ins, against the float64 reference with the tolerance rule; bad shapes name the argument."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tileattn
from reference import (DELTA_FLOOR_FRACTION, attention, check_close, check_lse, check_rows, gradient_floor_fraction,
                       round_to)

PAIRS = [(192, 128), (576, 512), (256, 128), (64, 32), (40, 72)]


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check_lse_rule(got_lse, q, k, v, dtype_name, **mask):
    """The LSE by docs/accuracy.md's rule (reference.check_lse) against float64 and naive
    attention over these inputs."""
    ref = attention(q, k, v, **mask)[1]
    naive = attention(q, k, v, dtype=np.float32, round_output=round_to(dtype_name), **mask)[1]
    check_lse(got_lse, ref, naive)


@pytest.mark.parametrize("d, dv", PAIRS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_flash_attention_numpy(rng, d, dv, dtype, heads):
    h, hk = heads
    q, k, v = rand(rng, 2, h, 9, d, dtype=dtype), rand(rng, 2, hk, 21, d, dtype=dtype), rand(rng, 2, hk, 21, dv, dtype=dtype)
    o, lse = tileattn.flash_attention(q, k, v, is_causal=True, return_lse=True)
    assert o.shape == (2, h, 9, dv) and o.dtype == dtype
    name = np.dtype(dtype).name
    check_close(o, q, k, v, name, causal=True)
    check_lse_rule(lse, q, k, v, name, causal=True)
    # The check bites: the same outputs scaled by 1 + 1e-3 (fp32) / 1e-2 (fp16) fail.
    with pytest.raises(AssertionError):
        check_close(o, q, k, v, name, perturb=1e-3 if dtype == np.float32 else 1e-2, causal=True)


def test_flash_attention_bshd_and_out(rng):
    q, k, v = rand(rng, 1, 13, 4, 192), rand(rng, 1, 30, 2, 192), rand(rng, 1, 30, 2, 128)
    out = np.empty((1, 13, 4, 128), np.float32)
    o = tileattn.flash_attention(q, k, v, layout="bshd", window=(7, 0), out=out)
    assert o is out
    tr = lambda x: np.swapaxes(x, 1, 2)
    check_close(tr(o), tr(q), tr(k), tr(v), "float32", window=(7, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_attention_torch_mqa(rng, dtype):
    q = torch.from_numpy(rand(rng, 1, 8, 5, 576)).to(dtype)
    k = torch.from_numpy(rand(rng, 1, 1, 40, 576)).to(dtype)
    v = torch.from_numpy(rand(rng, 1, 1, 40, 512)).to(dtype)
    o = tileattn.flash_attention(q, k, v, is_causal=True)
    assert o.shape == (1, 8, 5, 512) and o.dtype == dtype
    as64 = lambda x: x.float().numpy()
    check_close(as64(o), as64(q), as64(k), as64(v), "bfloat16" if dtype == torch.bfloat16 else "float32",
                causal=True)


@pytest.mark.parametrize("d, dv", [(192, 128), (64, 32), (40, 72)])
@pytest.mark.parametrize("dtype, with_lse", [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)])
def test_gradients_with_value_head_dim(d, dv, dtype, with_lse):
    """dQ, dK (D wide) and dV (Dv wide) through autograd (the C++ backward; a loss through lse
    takes the PyTorch math) against float64, by the rule of test_grad.py."""
    from test_grad import grads, masked_scores, math_attention
    gen = torch.Generator().manual_seed(7)
    b, h, hk, nq, nk = 2, 4, 2, 9, 13
    q = torch.randn(b, h, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, hk, nk, d, generator=gen).to(dtype)
    v = torch.randn(b, hk, nk, dv, generator=gen).to(dtype)
    g = torch.randn(b, h, nq, dv, generator=gen).to(dtype).float()
    g_lse = torch.randn(b, h, nq, generator=gen) if with_lse else None
    scale = d ** -0.5

    def ours(q, k, v):
        return tileattn.flash_attention(q, k, v, is_causal=True, return_lse=True)

    def naive():  # the same-precision backward (test_grad.naive_grads) with V's own head dim
        qf, kf, vf = q.float(), k.float().repeat_interleave(h // hk, 1), v.float().repeat_interleave(h // hk, 1)
        p = torch.softmax(masked_scores(qf, kf, scale, causal=True), -1)
        o = (p @ vf).to(dtype).float()
        ds = p * (g @ vf.transpose(-1, -2) - (g * o).sum(-1, keepdim=True) +
                  (0 if g_lse is None else g_lse.unsqueeze(-1)))
        dq = ds @ kf * scale
        dk = (ds.transpose(-1, -2) @ qf * scale).view(b, hk, h // hk, nk, d).sum(2)
        dvv = (p.transpose(-1, -2) @ g).view(b, hk, h // hk, nk, dv).sum(2)
        return tuple(t.to(dtype) for t in (dq, dk, dvv))

    got = grads(ours, q, k, v, g, g_lse)
    ref = grads(lambda q, k, v: math_attention(q, k, v, scale, causal=True), q.double(), k.double(), v.double(),
                g.double(), None if g_lse is None else g_lse.double())
    o_ref, _ = math_attention(q.double(), k.double(), v.double(), scale, causal=True)
    row_sum = (o_ref * g.double()).sum(-1).abs().max().item()
    perturb = 1e-3 if dtype == torch.float32 else 1e-2
    name_of = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
    for name, a, r, n in zip("qkv", got, ref, naive()):
        assert a.shape == r.shape and a.dtype == dtype
        extra = DELTA_FLOOR_FRACTION * row_sum if name != "v" else 0.0
        args = (a.double().numpy(), r.numpy(), n.double().numpy(), gradient_floor_fraction(name_of[dtype]))
        verdict = check_rows(*args, extra_floor=extra)
        assert verdict["ok"], f"d{name}: {verdict}"
        assert not check_rows(*args, perturb=perturb, extra_floor=extra)["ok"], f"d{name} x (1 + {perturb}) passed"


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_kvcache_mla_decode(rng, paged, dtype):
    """576 / 512, one KV head, 16 query heads: prefill 1100 tokens, then decode one token (the
    packed tiles and the split-KV merge) against the reference over the whole sequence."""
    b, h, d, dv, cached = 2, 16, 576, 512, 1100
    # Uniform in [-1, 1] as the C++ case table: with normal inputs a 1100-key average of V cancels
    # to |O| ~ 0.03 and fp32 decode sits at 0.97-1.02 of the tolerance whatever V's head dim
    # (512 / 512 as 576 / 512).
    uniform = lambda *shape: rng.uniform(-1, 1, shape).astype(dtype)
    k_all, v_all = uniform(b, 1, cached + 1, d), uniform(b, 1, cached + 1, dv)
    q = uniform(b, h, 1, d)
    if paged:
        page, pages = 64, 2 * 18
        table = rng.permutation(pages).astype(np.int32).reshape(b, 18)
        kc, vc = np.zeros((pages, 1, page, d), dtype), np.zeros((pages, 1, page, dv), dtype)
    else:
        table = None
        kc, vc = np.zeros((b, 1, cached + 3, d), dtype), np.zeros((b, 1, cached + 3, dv), dtype)
    tileattn.attention_with_kvcache(q[:, :, :0], kc, vc, k_all[:, :, :cached], v_all[:, :, :cached],
                                    cache_seqlens=np.zeros(b, np.int32), block_table=table)
    o, lse = tileattn.attention_with_kvcache(q, kc, vc, k_all[:, :, cached:], v_all[:, :, cached:],
                                             cache_seqlens=np.full(b, cached, np.int32), block_table=table,
                                             return_lse=True)
    assert o.shape == (b, h, 1, dv)
    check_close(o, q, k_all, v_all, np.dtype(dtype).name, causal=True)
    check_lse_rule(lse, q, k_all, v_all, np.dtype(dtype).name, causal=True)


def test_kvcache_torch_op_path(rng):
    """The custom op (what torch.compile sees) gives O with V's head dim, as the direct call."""
    q = torch.from_numpy(rand(rng, 1, 4, 2, 192))
    kc, vc = torch.zeros(1, 2, 16, 192), torch.zeros(1, 2, 16, 128)
    k, v = torch.from_numpy(rand(rng, 1, 2, 2, 192)), torch.from_numpy(rand(rng, 1, 2, 2, 128))
    o = torch.ops.tileattn.attention_with_kvcache(q, kc, vc, k, v, torch.zeros(1, dtype=torch.int32), None, None,
                                                  None, False, 192 ** -0.5, True, -1, -1)[0]
    assert o.shape == (1, 4, 2, 128)
    check_close(o.numpy(), q.numpy(), k.numpy(), v.numpy(), "float32", causal=True)
    fake = torch.library.opcheck  # the fake kernel's shapes match the real one's
    fake(torch.ops.tileattn.attention_with_kvcache.default,
         (q, kc.clone(), vc.clone(), k, v, torch.zeros(1, dtype=torch.int32), None, None, None, False,
          192 ** -0.5, True, -1, -1), test_utils=("test_faketensor",))


def test_sdpa_dropin_matches_torch(rng):
    q, k, v = (torch.from_numpy(rand(rng, 2, 4, 11, 192)), torch.from_numpy(rand(rng, 2, 4, 17, 192)),
               torch.from_numpy(rand(rng, 2, 4, 17, 128)))
    for causal in (False, True):
        got = tileattn.scaled_dot_product_attention(q, k, v, is_causal=causal)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        assert got.shape == want.shape == (2, 4, 11, 128)
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=2e-6)
    got3 = tileattn.scaled_dot_product_attention(q[0], k[0], v[0])  # rank 3
    assert got3.shape == (4, 11, 128)


def test_flash_attn_func_and_kvcache_dropins(rng):
    q, k, v = rand(rng, 1, 6, 4, 576), rand(rng, 1, 30, 1, 576), rand(rng, 1, 30, 1, 512)  # bshd
    qt, kt, vt = map(torch.from_numpy, (q, k, v))
    o = tileattn.flash_attn_func(qt, kt, vt, causal=True)
    assert o.shape == (1, 6, 4, 512)
    tr = lambda x: np.swapaxes(np.asarray(x), 1, 2)
    check_close(tr(o.numpy()), tr(q), tr(k), tr(v), "float32", causal=True)
    # FA2's cache layout [B, S, Hkv, D]: a 30-token cache, then one new token appended.
    kc, vc = torch.zeros(1, 40, 1, 576), torch.zeros(1, 40, 1, 512)
    kc[:, :29], vc[:, :29] = kt[:, :29], vt[:, :29]
    o = tileattn.flash_attn_with_kvcache(qt[:, -1:], kc, vc, kt[:, 29:], vt[:, 29:],
                                         cache_seqlens=torch.tensor([29], dtype=torch.int32), causal=True)
    assert o.shape == (1, 1, 4, 512)
    check_close(tr(o.numpy()), tr(q[:, -1:]), tr(k), tr(v), "float32", causal=True)
    assert torch.equal(vc[:, 29], vt[:, 29])


def test_bad_head_dims_name_the_argument(rng):
    q, k = rand(rng, 1, 2, 3, 64), rand(rng, 1, 2, 5, 64)
    with pytest.raises(ValueError, match="v: head_dim must be in 1..512"):
        tileattn.flash_attention(q, k, rand(rng, 1, 2, 5, 600))
    with pytest.raises(ValueError, match="q: head_dim must be in 1..576"):
        tileattn.flash_attention(rand(rng, 1, 2, 3, 600), rand(rng, 1, 2, 5, 600), rand(rng, 1, 2, 5, 64))
    with pytest.raises(ValueError, match="v: shape .* must equal k's"):
        tileattn.flash_attention(q, k, rand(rng, 1, 2, 6, 32))
    with pytest.raises(ValueError, match="out"):
        tileattn.flash_attention(q, k, rand(rng, 1, 2, 5, 32), out=np.empty((1, 2, 3, 64), np.float32))
    kc, vc = np.zeros((1, 2, 8, 64), np.float32), np.zeros((1, 2, 8, 32), np.float32)
    before = vc.copy()
    with pytest.raises(ValueError, match="v_cache: shape .* must equal k_cache's"):
        tileattn.attention_with_kvcache(q, kc, np.zeros((1, 1, 8, 32), np.float32))
    with pytest.raises(ValueError, match="v: shape .* v_cache's \\(32\\)"):
        tileattn.attention_with_kvcache(q, kc, vc, rand(rng, 1, 2, 1, 64), rand(rng, 1, 2, 1, 64), cache_seqlens=0)
    with pytest.raises(ValueError, match="v_cache: head_dim must be in 1..512"):
        tileattn.attention_with_kvcache(q, kc, np.zeros((1, 2, 8, 513), np.float32))
    np.testing.assert_array_equal(vc, before)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_varlen_packed_with_value_head_dim(rng, framework):
    """Packed sequences (cu_seqlens, [total, H, D]) with V 128 wide against Q/K 192: each
    sequence equals its own reference; flash_attn_varlen_func (torch) gives the same output."""
    lengths_q, lengths_k = [5, 0, 11], [9, 3, 11]
    cq = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q, k, v = rand(rng, cq[-1], 4, 192), rand(rng, ck[-1], 2, 192), rand(rng, ck[-1], 2, 128)
    conv = (lambda x: x) if framework == "numpy" else torch.from_numpy
    o = tileattn.flash_attention(conv(q), conv(k), conv(v), is_causal=True, cu_seqlens_q=conv(cq),
                                 cu_seqlens_k=conv(ck))
    o = np.asarray(o)
    assert o.shape == (cq[-1], 4, 128)
    per = lambda x, c, b: np.swapaxes(x[c[b]:c[b + 1]], 0, 1)[None]  # [1, H, n, D]
    for b in range(3):
        if lengths_q[b]:
            check_close(per(o, cq, b), per(q, cq, b), per(k, ck, b), per(v, ck, b), "float32", causal=True)
    if framework == "torch":
        fa2 = tileattn.flash_attn_varlen_func(conv(q), conv(k), conv(v), conv(cq), conv(ck), 11, 11, causal=True)
        np.testing.assert_array_equal(fa2.numpy(), o)
