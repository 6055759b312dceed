"""Gradients of flash_attention (torch autograd through the custom op) against torch autograd of
a float64 math reference, with the project's tolerance for gradients (reference.check_rows, as the
C++ backward tests, src/testing/tolerance.hpp): every row (one query's dQ, one key's dK or dV) at
most twice the error of the same math in the working precision on that row (fp32 arithmetic,
gradients rounded to the dtype), plus a floor proportional to the gradient's magnitude,
gradient_floor_fraction(dtype) x max |reference gradient|, and for dQ and dK a term at
max |rowsum(dO * O)| -- the row sum cancels inside dS = P * (dP - rowsum(dO * O)).

(torch.autograd.gradcheck itself needs float64 inputs, which is not a kernel dtype; this is
its float64-reference form.)"""
import pytest
import torch

import tileattn
from reference import DELTA_FLOOR_FRACTION, check_rows, gradient_floor_fraction

NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def masked_scores(q, k, scale, causal=False, window=(-1, -1), bool_mask=None, add_mask=None, softcap=0.0,
                  alibi_slopes=None):
    """scale * q k^T (soft-capped: softcap * tanh(. / softcap)) with the masks applied (-inf where
    hidden), in q's dtype; k already per head."""
    nq, nk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        dist = (torch.arange(nq)[:, None] + (nk - nq) - torch.arange(nk)[None, :]).abs().to(s.dtype)
        s = s - alibi_slopes.to(s.dtype).expand(q.shape[0], q.shape[1])[:, :, None, None] * dist
    i = torch.arange(nq)[:, None] + (nk - nq)
    j = torch.arange(nk)[None, :]
    keep = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window[0] >= 0:
        keep &= j >= i - window[0]
    if window[1] >= 0:
        keep &= j <= i + window[1]
    if bool_mask is not None:
        keep = keep & bool_mask
    if add_mask is not None:
        s = s + add_mask.to(s.dtype)
    return s.masked_fill(~keep, float("-inf"))


def math_attention(q, k, v, scale, **mask):
    """Differentiable attention in q's dtype; [B, H, N, D]; returns (o, lse)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    s = masked_scores(q, k, scale, **mask)
    # max + log(sum(exp(s - max))), max held constant: its gradient is the softmax. At a bias of
    # finfo(float32).min the lse (~-3.4e38, in float64 too) swallows log(keys), so exp(s - lse),
    # as torch.logsumexp's backward forms it, would sum to the number of keys instead of 1.
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m.squeeze(-1) + torch.exp(s - m).sum(-1).log()
    p = torch.softmax(s, -1)
    return p @ v, lse


def naive_grads(q, k, v, g, g_lse, scale, dtype, **mask):
    """The naive same-precision backward, as the C++ naive_backward forms it
    (src/training/reference_backward.cpp): inputs as stored, P in fp32, O rounded to the dtype
    before D = rowsum(dO * O), dS = P * (dP - D + dlse) (times 1 - tanh^2 through a soft cap),
    gradients in fp32 rounded to the dtype."""
    b, h, nq, d = q.shape
    hk = k.shape[1]
    group = h // hk
    q, k, v = q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    p = torch.softmax(masked_scores(q, k, scale, **mask), -1)
    o = (p @ v).to(dtype).float()
    delta = (g * o).sum(-1, keepdim=True)
    ds = p * (g @ v.transpose(-1, -2) - delta + (0 if g_lse is None else g_lse.unsqueeze(-1)))
    if mask.get("softcap"):
        t = torch.tanh(q @ k.transpose(-1, -2) * scale / mask["softcap"])
        ds = ds * (1 - t * t)
    dq = ds @ k * scale
    dk = (ds.transpose(-1, -2) @ q * scale).view(b, hk, group, -1, d).sum(2)
    dv = (p.transpose(-1, -2) @ g).view(b, hk, group, -1, d).sum(2)
    return tuple(t.to(dtype) for t in (dq, dk, dv))


def grads(fn, q, k, v, g, g_lse):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, lse = fn(q, k, v)
    loss = (o.float() * g).sum() + (0 if g_lse is None else (lse * g_lse).sum())
    loss.backward()
    return q.grad, k.grad, v.grad


CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window=(3, 1)),
    "causal+window": dict(causal=True, window=(4, -1)),
    "bool_mask": dict(bool_mask=True),
    "additive_mask": dict(add_mask=True),
    # Hugging Face's padding: whole query rows biased by -1e9 or finfo(float32).min (finite,
    # beyond the scores' precision: the row averages its keys, as naive attention does).
    "padding_rows": dict(add_mask="padding"),
    # Soft cap 1 on scores of standard deviation ~1 (randn inputs, D = 16): most are bent by it.
    "softcap": dict(softcap=1.0),
    "softcap+causal": dict(softcap=1.0, causal=True),
    "softcap+additive_mask": dict(softcap=1.0, add_mask=True),
    # ALiBi slopes per (batch, head); with a soft cap and causal.
    "alibi": dict(alibi=True),
    "alibi+softcap+causal": dict(alibi=True, softcap=1.0, causal=True),
}


# A loss through lse takes python/tileattn/_torch_backward.py's PyTorch math; its P is the
# softmax of its own scores (exp(s - lse) with the kernel's lse, clamped at -2.36e38, was 0 in a
# finfo(float32).min row: the padding_rows cases with lse check that it no longer is).
def param(dtype, case, layout, with_lse):
    return pytest.param(dtype, case, layout, with_lse)


# Every mask case in every dtype; layouts and gradients through lse in float32.
PARAMS = [param(dtype, case, "bhsd", False) for dtype in NAMES for case in CASES] + \
         [param(torch.float32, case, layout, with_lse) for case in CASES
          for layout, with_lse in (("bshd", False), ("bhsd", True), ("bshd", True))]


@pytest.mark.parametrize("dtype, case, layout, with_lse", PARAMS)
def test_gradients_match_float64_reference(dtype, case, layout, with_lse):
    gen = torch.Generator().manual_seed(5)
    b, h, hk, nq, nk, d = 2, 4, 2, 9, 13, 16
    q = torch.randn(b, h, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, hk, nk, d, generator=gen).to(dtype)
    v = torch.randn(b, hk, nk, d, generator=gen).to(dtype)
    # dO as the kernel receives it: autograd hands o's gradient over in o's dtype.
    g = torch.randn(b, h, nq, d, generator=gen).to(dtype).float()
    g_lse = torch.randn(b, h, nq, generator=gen) if with_lse else None
    opts = dict(CASES[case])
    mask = None
    if opts.pop("bool_mask", False):
        mask = torch.rand(nq, nk, generator=gen) > 0.3
        opts["bool_mask"] = mask
    add_mask = opts.pop("add_mask", False)
    if add_mask:
        mask = torch.randn(b, 1, nq, nk, generator=gen)
        if add_mask == "padding":
            mask[:, :, 0] = -1e9
            mask[:, :, 1] = torch.finfo(torch.float32).min
        opts["add_mask"] = mask
    if opts.pop("alibi", False):
        opts["alibi_slopes"] = torch.rand(b, h, generator=gen) * 0.5
    scale = d ** -0.5
    window = opts.get("window")

    def ours(q, k, v):
        tr = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
        o, lse = tileattn.flash_attention(tr(q), tr(k), tr(v), attn_mask=mask, is_causal=opts.get("causal", False),
                                          window=window, layout=layout, return_lse=True,
                                          softcap=opts.get("softcap", 0.0),
                                          alibi_slopes=opts.get("alibi_slopes"))
        return tr(o), lse

    got = grads(ours, q, k, v, g, g_lse)
    ref = grads(lambda q, k, v: math_attention(q, k, v, scale, **opts),
                q.double(), k.double(), v.double(), g.double(), None if g_lse is None else g_lse.double())
    naive = naive_grads(q, k, v, g, g_lse, scale, dtype, **opts)
    o_ref, _ = math_attention(q.double(), k.double(), v.double(), scale, **opts)
    row_sum = (o_ref * g.double()).sum(-1).abs().max().item()
    perturb = 1e-3 if dtype == torch.float32 else 1e-2
    for name, a, r, n in zip("qkv", got, ref, naive):
        assert a.dtype == dtype
        n = n.double()
        extra = DELTA_FLOOR_FRACTION * row_sum if name != "v" else 0.0
        args = (a.double().numpy(), r.numpy(), n.numpy(), gradient_floor_fraction(NAMES[dtype]))
        verdict = check_rows(*args, extra_floor=extra)
        assert verdict["ok"], f"d{name}: {verdict}"
        # ... and bites: x (1 + perturb) fails, except dK and dV where rows are biased beyond
        # fp32's precision (every key's gradient sums over those rows' error).
        if not (case == "padding_rows" and name != "q"):
            assert not check_rows(*args, perturb=perturb, extra_floor=extra)["ok"], f"d{name} x (1 + {perturb}) passed"


def test_dropout_backward_replays_the_forward_pattern():
    """o is linear in v for a fixed dropout pattern, so sum(o * g) == sum(dv * v) exactly in math;
    a backward with a different pattern than the forward's would break the identity."""
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(1, 2, 24, 16, generator=gen)
    k = torch.randn(1, 2, 24, 16, generator=gen)
    v = torch.randn(1, 2, 24, 16, generator=gen).requires_grad_()
    g = torch.randn(1, 2, 24, 16, generator=gen)
    o = tileattn.flash_attention(q, k, v, dropout_p=0.4, is_causal=True)
    (o * g).sum().backward()
    lhs = (o.double() * g.double()).sum()
    rhs = (v.grad.double() * v.double()).sum()
    assert torch.allclose(lhs, rhs, rtol=1e-5, atol=1e-5), (lhs, rhs)
    # ... and the pattern really drops something.
    assert not torch.allclose(o, tileattn.flash_attention(q, k, v, is_causal=True))


def test_grad_only_for_inputs_that_require_it():
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    k.requires_grad_()
    tileattn.flash_attention(q, k, v).sum().backward()
    assert k.grad is not None and q.grad is None and v.grad is None


def test_lse_loss_and_mask_gradient_with_a_sequence_without_keys():
    """The PyTorch-math backward (a loss on lse, a float mask's gradient) with Nk = 0 for a packed
    sequence or the whole call: zero gradients and d_sinks = the lse's gradient summed (each row's
    lse is its sink), as the kernel gives them; it raised IndexError (amax of an empty dim)."""
    q = torch.randn(5, 1, 8, requires_grad=True)
    k, v = torch.randn(3, 1, 8, requires_grad=True), torch.randn(3, 1, 8, requires_grad=True)
    o, lse = tileattn.flash_attention(q, k, v, cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32),
                                      cu_seqlens_k=torch.tensor([0, 3, 3], dtype=torch.int32), return_lse=True)
    (o.sum() + lse[:, :3].sum()).backward()
    assert torch.equal(q.grad[3:], torch.zeros(2, 1, 8)) and torch.isfinite(q.grad).all()
    sinks = torch.tensor([0.5, -1.0], requires_grad=True)
    q2 = torch.randn(1, 2, 3, 8, requires_grad=True)
    empty = torch.randn(1, 2, 0, 8, requires_grad=True)
    o2, lse2 = tileattn.flash_attention(q2, empty, empty, sinks=sinks, return_lse=True)
    (o2.sum() + lse2.sum()).backward()
    assert torch.equal(sinks.grad, torch.tensor([3.0, 3.0])) and torch.equal(q2.grad, torch.zeros(1, 2, 3, 8))
    mask = torch.zeros(3, 0, requires_grad=True)
    tileattn.flash_attention(q2, empty, empty, attn_mask=mask).sum().backward()
    assert mask.grad is not None and mask.grad.shape == (3, 0)
