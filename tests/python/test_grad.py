"""Gradients of flash_attention (torch autograd through the custom op) against torch autograd of
a float64 math reference, with the project's tolerance for gradients (as the C++ backward
tests, tests/training/backward_support.hpp): at most twice the error of the same math in the
working precision (fp32 arithmetic, gradients rounded to the dtype), plus a floor of one unit in
the last place of the dtype at max(1, max |reference gradient|, max |rowsum(dO * O)|) -- the row
sum cancels inside dS = P * (dP - rowsum(dO * O)).

(torch.autograd.gradcheck itself needs float64 inputs, which is not a kernel dtype; this is
its float64-reference form.)"""
import pytest
import torch

import tileattn
from reference import FLOOR

NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def math_attention(q, k, v, scale, causal=False, window=(-1, -1), bool_mask=None, add_mask=None):
    """Differentiable attention in q's dtype; [B, H, N, D]; returns (o, lse)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    nq, nk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) * scale
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
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return p @ v, lse


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
}


# Every mask case in every dtype; layouts and gradients through lse in float32.
PARAMS = [(dtype, case, "bhsd", False) for dtype in NAMES for case in CASES] + \
         [(torch.float32, case, layout, with_lse) for case in CASES
          for layout, with_lse in (("bshd", False), ("bhsd", True), ("bshd", True))]


@pytest.mark.parametrize("dtype, case, layout, with_lse", PARAMS)
def test_gradients_match_float64_reference(dtype, case, layout, with_lse):
    gen = torch.Generator().manual_seed(5)
    b, h, hk, nq, nk, d = 2, 4, 2, 9, 13, 16
    q = torch.randn(b, h, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, hk, nk, d, generator=gen).to(dtype)
    v = torch.randn(b, hk, nk, d, generator=gen).to(dtype)
    g = torch.randn(b, h, nq, d, generator=gen)
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
    scale = d ** -0.5
    window = opts.get("window")

    def ours(q, k, v):
        tr = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
        o, lse = tileattn.flash_attention(tr(q), tr(k), tr(v), attn_mask=mask, is_causal=opts.get("causal", False),
                                          window=window, layout=layout, return_lse=True)
        return tr(o), lse

    got = grads(ours, q, k, v, g, g_lse)
    ref = grads(lambda q, k, v: math_attention(q, k, v, scale, **opts),
                q.double(), k.double(), v.double(), g.double(), None if g_lse is None else g_lse.double())
    naive = grads(lambda q, k, v: math_attention(q, k, v, scale, **opts),
                  q.float(), k.float(), v.float(), g, g_lse)
    o_ref, _ = math_attention(q.double(), k.double(), v.double(), scale, **opts)
    row_sum = (o_ref * g.double()).sum(-1).abs().max().item()
    for name, a, r, n in zip("qkv", got, ref, naive):
        assert a.dtype == dtype
        n = n.to(dtype).double()  # the naive gradient, rounded to the working dtype
        err = (a.double() - r).abs().max().item()
        ulp = 4 * FLOOR[NAMES[dtype]]
        tol = 2 * (n - r).abs().max().item() + ulp * max(1.0, r.abs().max().item(), row_sum)
        assert err <= tol, f"d{name}: error {err} > tolerance {tol}"


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
