"""flash_attention on packed variable-length batches (cu_seqlens_q / cu_seqlens_k, q [total_q, H, D]),
forward and autograd, and return_attn_probs, against the float64 reference sequence by sequence
with the project's tolerance rule (reference.check_close / check_rows)."""
import numpy as np
import pytest
import torch

import tileattn
from reference import DELTA_FLOOR_FRACTION, check_close, check_rows, gradient_floor_fraction
from test_grad import grads, math_attention, naive_grads

LENGTHS_Q = [5, 0, 17, 1]
LENGTHS_K = [9, 4, 17, 30]


def cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def packed(rng, lengths, heads, d, dtype=np.float32):
    return rng.standard_normal((int(sum(lengths)), heads, d)).astype(dtype)


def sequence(x, cu_x, b):
    """Sequence b of a packed [total, H, D] array as [1, H, n, D]."""
    return np.swapaxes(np.asarray(x, dtype=np.float32)[cu_x[b]:cu_x[b + 1]], 0, 1)[None]


CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window=(3, 2)),
    "softcap+causal": dict(causal=True, softcap=2.0),
    "alibi": dict(alibi=True),
}


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_float64_reference_per_sequence(rng, framework, case):
    h, hk, d = 4, 2, 24
    cq, ck = cu(LENGTHS_Q), cu(LENGTHS_K)
    q, k, v = packed(rng, LENGTHS_Q, h, d), packed(rng, LENGTHS_K, hk, d), packed(rng, LENGTHS_K, hk, d)
    opts = dict(CASES[case])
    slopes = None
    if opts.pop("alibi", False):
        slopes = (rng.random((len(LENGTHS_Q), h)) * 0.5).astype(np.float32)
    args = (q, k, v, cq, ck) if framework == "numpy" else tuple(torch.from_numpy(x) for x in (q, k, v, cq, ck))
    o, lse = tileattn.flash_attention(*args[:3], cu_seqlens_q=args[3], cu_seqlens_k=args[4],
                                      max_seqlen_q=max(LENGTHS_Q), max_seqlen_k=max(LENGTHS_K),
                                      is_causal=opts.get("causal", False), window=opts.get("window"),
                                      softcap=opts.get("softcap", 0.0), alibi_slopes=slopes, return_lse=True)
    o, lse = np.asarray(o), np.asarray(lse)
    assert o.shape == q.shape and lse.shape == (h, len(q))
    for b in range(len(LENGTHS_Q)):
        if LENGTHS_Q[b] == 0:
            continue
        mask = dict(opts)
        if slopes is not None:
            mask["alibi_slopes"] = slopes[b]
        check_close(sequence(o, cq, b), sequence(q, cq, b), sequence(k, ck, b), sequence(v, ck, b), "float32",
                    got_lse=lse[None, :, cq[b]:cq[b + 1]], **mask)


def test_packed_rows_are_independent_of_their_neighbours(rng):
    """A sequence's output does not change when another sequence's keys change: no key crosses
    a cu_seqlens boundary (a check that bites even where the tolerance is loose)."""
    h, d = 2, 16
    cq, ck = cu(LENGTHS_Q), cu(LENGTHS_K)
    q, k, v = packed(rng, LENGTHS_Q, h, d), packed(rng, LENGTHS_K, h, d), packed(rng, LENGTHS_K, h, d)
    o1 = tileattn.flash_attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    k2 = k.copy()
    k2[ck[3]:] += 5.0  # only the last sequence's keys
    o2 = tileattn.flash_attention(q, k2, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    np.testing.assert_array_equal(o1[:cq[3]], o2[:cq[3]])
    assert not np.array_equal(o1[cq[3]:], o2[cq[3]:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case, with_lse", [("causal", False), ("window", False), ("softcap+causal", False),
                                            ("alibi", False), ("causal", True)])
def test_gradients_match_float64_reference_per_sequence(dtype, case, with_lse):
    """Autograd through the C++ backward kernel on the packed rows (a loss through lse: PyTorch
    math, one sequence at a time)."""
    gen = torch.Generator().manual_seed(11)
    h, hk, d = 4, 2, 16
    lq, lk = [3, 7, 1], [6, 7, 12]
    cq, ck = torch.from_numpy(cu(lq)), torch.from_numpy(cu(lk))
    q = torch.randn(sum(lq), h, d, generator=gen).to(dtype)
    k = torch.randn(sum(lk), hk, d, generator=gen).to(dtype)
    v = torch.randn(sum(lk), hk, d, generator=gen).to(dtype)
    g = torch.randn(sum(lq), h, d, generator=gen).to(dtype).float()
    g_lse = torch.randn(h, sum(lq), generator=gen) if with_lse else None
    opts = dict(CASES[case])
    slopes = torch.rand(len(lq), h, generator=gen) * 0.5 if opts.pop("alibi", False) else None

    def ours(q, k, v):
        return tileattn.flash_attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, is_causal=opts.get("causal", False),
                                        window=opts.get("window"), softcap=opts.get("softcap", 0.0),
                                        alibi_slopes=slopes, return_lse=True)

    got = grads(ours, q, k, v, g, g_lse)
    scale = d ** -0.5
    for b in range(len(lq)):
        rq, rk = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        seq = lambda t, r: t[r].transpose(0, 1)[None]  # noqa: E731  [1, H, n, D]
        mask = dict(opts)
        if slopes is not None:
            mask["alibi_slopes"] = slopes[b]
        gb, gl = seq(g, rq), (None if g_lse is None else g_lse[:, rq][None])
        qb, kb, vb = seq(q, rq), seq(k, rk), seq(v, rk)
        ref = grads(lambda q, k, v: math_attention(q, k, v, scale, **mask), qb.double(), kb.double(), vb.double(),
                    gb.double(), None if gl is None else gl.double())
        naive = naive_grads(qb, kb, vb, gb, gl, scale, dtype, **mask)
        o_ref, _ = math_attention(qb.double(), kb.double(), vb.double(), scale, **mask)
        row_sum = (o_ref * gb.double()).sum(-1).abs().max().item()
        for name, a, r, n, rows in zip("qkv", got, ref, naive, (rq, rk, rk)):
            extra = DELTA_FLOOR_FRACTION * row_sum if name != "v" else 0.0
            args = (seq(a, rows).double().numpy(), r.numpy(), n.double().numpy(),
                    gradient_floor_fraction({torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]))
            verdict = check_rows(*args, extra_floor=extra)
            assert verdict["ok"], f"sequence {b} d{name}: {verdict}"
            # ... and bites (bf16: x 1.03, a few units of its 2^-8 roundoff).
            perturb = 1e-3 if dtype == torch.float32 else 3e-2
            assert not check_rows(*args, perturb=perturb, extra_floor=extra)["ok"], f"d{name} x (1 + {perturb}) passed"


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_attention_probabilities(rng, framework):
    """return_attn_probs: probs @ v reproduces o, rows sum to 1 where a key is visible, 0 outside
    the mask; the soft cap and ALiBi are in them."""
    b, h, nq, nk, d = 2, 2, 6, 9, 8
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32) for n in (nq, nk, nk))
    slopes = np.array([0.3, 0.1], np.float32)
    args = (q, k, v) if framework == "numpy" else tuple(torch.from_numpy(x) for x in (q, k, v))
    o, lse, probs = tileattn.flash_attention(*args, is_causal=True, softcap=1.5, alibi_slopes=slopes,
                                             return_lse=True, return_attn_probs=True)
    o, probs = np.asarray(o, np.float64), np.asarray(probs, np.float64)
    assert probs.shape == (b, h, nq, nk) and probs.dtype == np.float64
    np.testing.assert_allclose(probs @ v.astype(np.float64), o, atol=1e-5)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
    assert (probs[:, :, 0, nk - nq + 1:] == 0).all()  # causal, bottom-right
    o2, probs2 = tileattn.flash_attention(*args, is_causal=True, return_attn_probs=True)
    assert not np.allclose(np.asarray(probs2), probs, atol=1e-3)  # the cap and the bias change them


def test_attention_probabilities_varlen_and_autograd():
    gen = torch.Generator().manual_seed(2)
    lq, lk = [2, 5], [4, 5]
    cq, ck = torch.tensor(cu(lq)), torch.tensor(cu(lk))
    q = torch.randn(7, 2, 8, generator=gen, requires_grad=True)
    k, v = torch.randn(9, 2, 8, generator=gen), torch.randn(9, 2, 8, generator=gen)
    o, probs = tileattn.flash_attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, is_causal=True,
                                        return_attn_probs=True)
    assert probs.shape == (2, 2, 5, 5) and not probs.requires_grad
    o0 = (probs[0, :, :2, :4] @ v[:4].transpose(0, 1).double().float()).transpose(0, 1)
    torch.testing.assert_close(o0, o[:2].detach(), atol=1e-5, rtol=1e-5)
    assert (probs[0, :, 2:] == 0).all() and (probs[0, :, :, 4:] == 0).all()  # padding of the short sequence
    o.sum().backward()
    assert q.grad is not None


def test_dropout_probabilities_are_the_forward_pattern():
    """With dropout, probs carry the pattern the forward used (torch: same seed): probs @ v == o."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8) for _ in range(3))
    o, probs = tileattn.flash_attention(q, k, v, dropout_p=0.3, return_attn_probs=True)
    assert (probs == 0).any()
    torch.testing.assert_close(probs @ v, o, atol=1e-5, rtol=1e-5)


def test_errors_name_the_argument(rng):
    q, k, v = packed(rng, [3, 4], 2, 8), packed(rng, [3, 4], 2, 8), packed(rng, [3, 4], 2, 8)
    c = cu([3, 4])
    with pytest.raises(ValueError, match="cu_seqlens_q, cu_seqlens_k: give both"):
        tileattn.flash_attention(q, k, v, cu_seqlens_q=c)
    with pytest.raises(NotImplementedError, match="attn_mask: not supported with cu_seqlens"):
        tileattn.flash_attention(q, k, v, cu_seqlens_q=c, cu_seqlens_k=c, attn_mask=np.ones((7, 7), bool))
    with pytest.raises(ValueError, match="max_seqlen_k: 3 is less than the longest sequence \\(4\\)"):
        tileattn.flash_attention(q, k, v, cu_seqlens_q=c, cu_seqlens_k=c, max_seqlen_k=3)
    # The custom op's path (autograd can observe the call) checks it too, when the op runs.
    tq = torch.from_numpy(q).requires_grad_()
    with pytest.raises(ValueError, match="max_seqlen_q: 2 is less than the longest sequence \\(4\\)"):
        tileattn.flash_attention(tq, torch.from_numpy(k), torch.from_numpy(v), cu_seqlens_q=torch.from_numpy(c),
                                 cu_seqlens_k=torch.from_numpy(c), max_seqlen_q=2)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        tileattn.flash_attention(q, k, v, cu_seqlens_q=c, cu_seqlens_k=cu([3, 5]))
    with pytest.raises(ValueError, match="q: expected a 3-D packed array"):
        tileattn.flash_attention(q[None], k, v, cu_seqlens_q=c, cu_seqlens_k=c)
    with pytest.raises(TypeError, match="cu_seqlens_q: expected an integer array"):
        tileattn.flash_attention(q, k, v, cu_seqlens_q=c.astype(np.float32), cu_seqlens_k=c)
    with pytest.raises(ValueError, match="max_seqlen_q, max_seqlen_k: only with cu_seqlens"):
        tileattn.flash_attention(q[None], k[None], v[None], max_seqlen_q=3)


def test_rows_outside_every_sequence_see_no_key():
    """Packed rows before cu_seqlens[0] or from cu_seqlens[-1] on take part in no attention: O 0,
    LSE -inf, and 0 in the gradients (not what the fresh buffers held), through autograd too."""
    torch.manual_seed(0)
    h, d = 2, 8
    for _ in range(3):  # fresh buffers from an allocator that held 1e30 just before
        junk = [torch.full((9, h, d), 1e30) for _ in range(8)]
        del junk
        q = torch.randn(8, h, d, requires_grad=True)
        k = torch.randn(9, h, d, requires_grad=True)
        v = torch.randn(9, h, d, requires_grad=True)
        cq = torch.tensor([1, 3, 7], dtype=torch.int32)  # q rows 0 and 7 in no sequence
        ck = torch.tensor([0, 4, 8], dtype=torch.int32)  # k/v row 8 in no sequence
        o, lse = tileattn.flash_attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=4,
                                          max_seqlen_k=4, return_lse=True)
        assert torch.all(o[[0, 7]] == 0)
        assert torch.all(lse[:, [0, 7]] == -torch.inf)
        assert torch.isfinite(o[1:7]).all()
        o.sum().backward()
        assert torch.all(q.grad[[0, 7]] == 0)
        assert torch.all(k.grad[8] == 0) and torch.all(v.grad[8] == 0)
