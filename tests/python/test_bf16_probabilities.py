"""tileattn.set_bf16_probabilities: P rounded to bf16 for P @ V on the bf16 dot-product rungs.

Each P entry then carries a relative error of at most 2^-8 (bf16's unit roundoff), so an output
element moves by at most 2^-8 (P |V|) (the row sums stay fp32 sums of the unrounded P): the
rule of docs/accuracy.md plus that bound per row. On a CPU without a bf16 dot-product rung
(AVX2, or AVX-512 without BF16) the setting must change nothing.
"""
import numpy as np
import pytest
import torch

import tileattn
from reference import (DELTA_FLOOR_FRACTION, attention, check_rows, gradient_floor_fraction, output_floor_fraction,
                       round_to)

BF16_RUNGS = ("avx512bf16", "amx")


@pytest.fixture(autouse=True)
def restore_setting():
    yield
    tileattn.set_bf16_probabilities(False)


def inputs(b=1, h=4, hkv=2, nq=96, nk=700, d=64, seed=3):
    rng = np.random.default_rng(seed)
    q, k, v = (torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float32)).bfloat16()
               for shape in ((b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)))
    return q, k, v


def test_default_off_and_bad_values():
    assert tileattn.get_bf16_probabilities() is False
    tileattn.set_bf16_probabilities(True)
    assert tileattn.get_bf16_probabilities() is True
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="enabled"):
            tileattn.set_bf16_probabilities(bad)
    assert tileattn.get_bf16_probabilities() is True


@pytest.mark.parametrize("causal", [False, True])
def test_within_the_rule_and_the_rounding_bound(causal):
    q, k, v = inputs()
    exact = tileattn.flash_attention(q, k, v, is_causal=causal)
    tileattn.set_bf16_probabilities(True)
    rounded = tileattn.flash_attention(q, k, v, is_causal=causal)
    tileattn.set_bf16_probabilities(False)
    again = tileattn.flash_attention(q, k, v, is_causal=causal)
    assert torch.equal(again, exact)
    if tileattn.info()["bf16_isa"] not in BF16_RUNGS:
        assert torch.equal(rounded, exact)  # no bf16 products here: nothing to round
        return
    assert not torch.equal(rounded, exact)
    qf, kf, vf = (x.float().numpy() for x in (q, k, v))
    ref, _ = attention(qf, kf, vf, causal=causal)
    naive, _ = attention(qf, kf, vf, causal=causal, dtype=np.float32, round_output=round_to("bfloat16"))
    p_abs_v, _ = attention(qf, kf, np.abs(vf), causal=causal)
    allowance = np.ldexp(p_abs_v.max(axis=-1), -8)
    verdict = check_rows(rounded.float().numpy(), ref, naive, output_floor_fraction("bfloat16"),
                         row_allowance=allowance)
    assert verdict["ok"], verdict
    # The check bites: every row moved by 8x its allowance fails.
    coarse = check_rows(rounded.float().numpy() + 8 * allowance[..., None], ref, naive,
                        output_floor_fraction("bfloat16"), row_allowance=allowance)
    assert not coarse["ok"]


def test_fp32_inputs_unchanged():
    q, k, v = (x.float() for x in inputs())
    exact = tileattn.flash_attention(q, k, v)
    tileattn.set_bf16_probabilities(True)
    assert torch.equal(tileattn.flash_attention(q, k, v), exact)


def test_mask_and_sinks_gradients_within_the_forward_rounding_bound(monkeypatch):
    """A float mask that requires grad and sinks, under set_bf16_probabilities: the backward
    (PyTorch math, tileattn/_torch_backward.py: fp32 P and dS, nothing rounded to bf16) reads the
    forward's O, whose P V had P rounded. O_i then moves by sum_j r_ij P_ij V_j (|r_ij| <= 2^-8),
    so D_i = dO_i . O_i by at most e_i = 2^-8 sum_j P_ij |dP_ij| (dP = dO V^T); dS = P (dP - D)
    by P_ij e_i, hence d_mask (dS summed over the dims the mask broadcasts along) by the same sum
    of P_ij e_i, and d_sinks = -sum_i P_sink,i D_i by sum_i P_sink,i e_i (docs/accuracy.md). Each
    is checked by the rule (naive: fp32 math, O rounded to bf16 before D) plus that bound per row;
    the rounding shows (d_mask differs from the unrounded forward's) and the check bites (every
    row moved by 4x its allowance fails)."""
    rung = next((isa for isa, flag in (("avx512bf16", "avx512_bf16"), ("amx", "amx_bf16"))
                 if tileattn.info()[flag]), None)
    if rung is None:
        pytest.skip("no bf16 dot-product rung on this CPU")
    monkeypatch.setenv("TILEATTN_ISA", rung)
    rng = np.random.default_rng(11)
    b, h, hkv, nq, nk, d = 2, 4, 2, 33, 47, 32
    q, k, v = (torch.from_numpy(rng.uniform(-1, 1, s).astype(np.float32)).bfloat16()
               for s in ((b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)))
    mask = torch.from_numpy(rng.normal(0, 1, (1, 1, nq, nk)).astype(np.float32))
    sinks = torch.from_numpy(rng.normal(1.0, 0.5, h).astype(np.float32))
    g = torch.from_numpy(rng.uniform(-1, 1, (b, h, nq, d)).astype(np.float32)).bfloat16().float()

    def run(rounded):
        tileattn.set_bf16_probabilities(rounded)
        m, s = mask.clone().requires_grad_(), sinks.clone().requires_grad_()
        o = tileattn.flash_attention(q, k, v, attn_mask=m, sinks=s, is_causal=True)
        (o.float() * g).sum().backward()
        return o.detach(), m.grad.double().numpy(), s.grad.double().numpy()

    _, mask_exact, sinks_exact = run(False)
    o, d_mask, d_sinks = run(True)
    assert not np.array_equal(d_mask, mask_exact), "the rounded forward's O changed nothing"

    # float64 (and fp32 naive) gradients of the mask and the sinks from the formulas above.
    def grads(dtype, round_o):
        qq, kk, vv = (x.to(dtype).repeat_interleave(h // x.shape[1], 1) if x is not q else x.to(dtype)
                      for x in (q, k, v))
        s = qq @ kk.transpose(-1, -2) * d ** -0.5 + mask.to(dtype)
        keep = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
        s = s.masked_fill(~keep, float("-inf"))
        logits = torch.cat([s, sinks.to(dtype).view(1, h, 1, 1).expand(b, h, nq, 1)], -1)
        p_all = torch.softmax(logits, -1)
        p, p_sink = p_all[..., :-1], p_all[..., -1]
        out = p @ vv
        if round_o:
            out = out.bfloat16().to(dtype)
        gg = g.to(dtype)
        dp = gg @ vv.transpose(-1, -2)
        delta = (gg * out).sum(-1)
        ds = p * (dp - delta.unsqueeze(-1))
        return ds.sum((0, 1), keepdim=True), -(p_sink * delta).sum((0, 2)), p, p_sink, dp, delta

    ref_mask, ref_sinks, p, p_sink, dp, delta = grads(torch.float64, False)
    naive_mask, naive_sinks = (x.double() for x in grads(torch.float32, True)[:2])
    e = 2.0**-8 * (p * dp.abs()).sum(-1)  # [b, h, nq]: the bound on D's move
    mask_allowance = (p * e.unsqueeze(-1)).sum((0, 1)).amax(-1).numpy()  # one per mask row
    sinks_allowance = np.array([float((p_sink * e).sum((0, 2)).max())])  # d_sinks is one row
    delta_floor = DELTA_FLOOR_FRACTION * float(delta.abs().max())
    floor = gradient_floor_fraction("bfloat16")
    for name, got, ref, naive, allowance in (
            ("d_mask", d_mask, ref_mask.numpy(), naive_mask.numpy(), mask_allowance),
            ("d_sinks", d_sinks, ref_sinks.numpy(), naive_sinks.numpy(), sinks_allowance)):
        got, ref, naive = (np.asarray(x).reshape(-1, ref.shape[-1]) for x in (got, ref, naive))
        verdict = check_rows(got, ref, naive, floor, extra_floor=delta_floor, row_allowance=allowance)
        assert verdict["ok"], (name, verdict)
        # The check bites: every row moved by 4x its allowance fails.
        moved = check_rows(got + 4 * allowance.reshape(-1, 1), ref, naive, floor, extra_floor=delta_floor,
                           row_allowance=allowance)
        assert not moved["ok"], (name, "moved by 4x the allowance and passed", moved)
