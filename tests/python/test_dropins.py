"""The drop-ins: tileattn.scaled_dot_product_attention against torch's own SDPA on the same tensors,
and flash_attn_func / flash_attn_varlen_func / flash_attn_with_kvcache against a float64 model of
FlashAttention-2's documented semantics (bshd layouts, bottom-right causal, its cache layouts,
cache_batch_idx / cache_leftpad and rotary positions), with the project's tolerance rule."""
import warnings

import numpy as np

import pytest
import torch
import torch.nn.functional as F

import tileattn
from reference import (DELTA_FLOOR_FRACTION, attention, check_close, check_rows, gradient_floor_fraction,
                       round_to)
from test_grad import grads, math_attention, naive_grads

NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


# ---------------------------------------------------------------- scaled_dot_product_attention

def sdpa_inputs(dtype, b=2, h=4, hk=4, nq=9, nk=9, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, nq, d, generator=g).to(dtype), torch.randn(b, hk, nk, d, generator=g).to(dtype),
            torch.randn(b, hk, nk, d, generator=g).to(dtype))


def sdpa_cases():
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(9, 13, generator=g) > 0.3
    keep[:, 0] = True  # no fully masked row
    return {
        "plain": dict(nk=13),
        "causal square": dict(is_causal=True),
        "causal, more keys (top-left)": dict(nk=13, is_causal=True),
        "causal, more queries (top-left)": dict(nq=13, nk=9, is_causal=True),
        "bool mask [L, S]": dict(nk=13, attn_mask=keep),
        "float mask [B, 1, L, S]": dict(nk=13, attn_mask=torch.randn(2, 1, 9, 13, generator=g)),
        "gqa": dict(hk=2, enable_gqa=True, is_causal=True),
        "mqa, scale": dict(hk=1, nk=13, enable_gqa=True, scale=0.3),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(sdpa_cases()))
def test_sdpa_matches_torch_sdpa_forward_and_backward(dtype, case):
    opts = dict(sdpa_cases()[case])
    shape = {key: opts.pop(key) for key in ("hk", "nq", "nk") if key in opts}
    q, k, v = sdpa_inputs(dtype, **shape)
    if isinstance(opts.get("attn_mask"), torch.Tensor) and opts["attn_mask"].is_floating_point():
        opts["attn_mask"] = opts["attn_mask"].to(dtype)
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(dtype)

    def run(fn):
        x = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = fn(*x, **opts)
        (o.float() * g.float()).sum().backward()
        return [o.detach()] + [t.grad for t in x]

    ours = run(tileattn.scaled_dot_product_attention)
    theirs = run(F.scaled_dot_product_attention)
    f64 = run(lambda *x, **o: F.scaled_dot_product_attention(
        *(t.double() for t in x), **{key: (val.double() if isinstance(val, torch.Tensor) and val.is_floating_point()
                                            else val) for key, val in o.items()}))
    # Torch's SDPA in the same dtype is the same-precision baseline; float64 SDPA the reference.
    floors = ("output", "grad", "grad", "grad")
    for name, a, t, r, floor in zip(("o", "dq", "dk", "dv"), ours, theirs, f64, floors):
        assert a.dtype == dtype and a.shape == t.shape
        fraction = (0.5 * {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}[dtype] +
                    (16 if floor == "output" else 64) * 2.0**-24)
        verdict = check_rows(a.double().numpy(), r.double().numpy(), t.double().numpy(), fraction,
                             extra_floor=0.0 if name in ("o", "dv") else
                             DELTA_FLOOR_FRACTION * (f64[0] * g.double()).sum(-1).abs().max().item())
        assert verdict["ok"], f"{name}: {verdict}"


def test_sdpa_top_left_causal_differs_from_bottom_right():
    """is_causal with Nq != Nk is PyTorch's top-left mask, not flash_attention's bottom-right."""
    q, k, v = sdpa_inputs(torch.float32, nq=4, nk=10)
    ours = tileattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert not torch.allclose(ours, tileattn.flash_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("variant", ["causal_lower_right", "causal_upper_left"])
@pytest.mark.parametrize("nq, nk", [(4, 11), (11, 4), (7, 7)])
def test_sdpa_takes_torch_causal_bias_masks(variant, nq, nk):
    """torch.nn.attention.bias's masks are tensor subclasses whose storage holds no mask: they
    must be read for the causal mask they name, not as an array."""
    from torch.nn.attention import bias
    q, k, v = sdpa_inputs(torch.float32, nq=nq, nk=nk)
    i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    keep = j <= i + (nk - nq if variant == "causal_lower_right" else 0)

    def run(fn, mask, dtype):
        x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o = fn(*x, attn_mask=mask)
        o.sum().backward()
        return [o.detach().float()] + [t.grad.float() for t in x]

    expected = run(F.scaled_dot_product_attention, keep, torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own, for causal_lower_right with nq > nk
        mask = getattr(bias, variant)(nq, nk)
    for got in (run(tileattn.scaled_dot_product_attention, mask, torch.float32),
                run(lambda *x, attn_mask: tileattn.flash_attention(*x, attn_mask=attn_mask), mask, torch.float32)):
        for name, a, r in zip(("o", "dq", "dk", "dv"), got, expected):
            torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5, msg=name)
    with pytest.raises(ValueError, match="attn_mask: a causal bias of"):
        tileattn.scaled_dot_product_attention(q, k, v, attn_mask=getattr(bias, variant)(nq + 1, nk + 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(9, 13), (2, 1, 9, 13), (1, 4, 1, 13), (1, 4, 9, 1)])
def test_sdpa_float_mask_gets_its_gradient(dtype, shape):
    """A float mask that requires grad (a learned bias) gets d(loss)/d(mask): dS summed over the
    dims it broadcasts along, as torch's SDPA gives it."""
    q, k, v = sdpa_inputs(dtype, nk=13)
    mask = torch.randn(shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(dtype)

    def run(fn, dtype):
        x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, mask)]
        o = fn(*x[:3], attn_mask=x[3])
        (o * g.to(dtype)).sum().backward()
        return x[3].grad

    ours = run(tileattn.scaled_dot_product_attention, dtype)
    assert ours is not None and ours.dtype == dtype and ours.shape == mask.shape
    naive = run(F.scaled_dot_product_attention, dtype)
    ref = run(F.scaled_dot_product_attention, torch.float64)
    # Rows of the mask's last dim; a mask broadcast along the keys has gradient ~0 (softmax is
    # shift-invariant), which the floor (a fraction of dO's size) covers.
    fraction = gradient_floor_fraction(NAMES[dtype])
    verdict = check_rows(ours.double().reshape(-1, shape[-1]).numpy(), ref.reshape(-1, shape[-1]).numpy(),
                         naive.double().reshape(-1, shape[-1]).numpy(), fraction,
                         extra_floor=fraction * float(g.double().abs().max()) * float(v.double().abs().max()))
    assert verdict["ok"], verdict
    with pytest.raises(NotImplementedError, match="attn_mask: a gradient for the mask together with dropout"):
        m = mask.detach().requires_grad_()
        tileattn.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=0.3).sum().backward()


def test_sdpa_under_autocast_runs_in_the_autocast_dtype():
    """torch.autocast("cpu") casts SDPA's inputs to its dtype; q and k in fp32 with v in bf16
    (what a model's RoPE leaves) run as bf16, not an error."""
    q, k, v = sdpa_inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = tileattn.scaled_dot_product_attention(q, k, v.bfloat16(), is_causal=True)
        theirs = F.scaled_dot_product_attention(q, k, v.bfloat16(), is_causal=True)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), theirs.float(), atol=2e-2, rtol=0)
    assert tileattn.scaled_dot_product_attention(q, k, v).dtype == torch.float32  # outside: as given


def test_sdpa_causal_without_keys_is_zeros():
    """is_causal with S = 0: every row sees no key, zeros as torch gives (the empty top-left
    mask's data pointer may be null)."""
    q, k, v = sdpa_inputs(torch.float32, nq=4, nk=0)
    for causal in (True, False):
        o = tileattn.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        assert o.shape == (2, 4, 4, 16) and not o.any()
    assert not tileattn.flash_attention(q, k, v, attn_mask=torch.ones(4, 0, dtype=torch.bool)).any()


def test_sdpa_ranks_3_and_5_and_numpy():
    q, k, v = sdpa_inputs(torch.float32, b=6, h=2, hk=2)
    for shape in ((12, 9, 16), (2, 3, 2, 9, 16)):
        x = [t.reshape(shape[:-2] + t.shape[-2:]) for t in (q, k, v)]
        torch.testing.assert_close(tileattn.scaled_dot_product_attention(*x, is_causal=True),
                                   F.scaled_dot_product_attention(*x, is_causal=True))
    x = [t.reshape((2, 3) + t.shape[1:]) for t in (q, k, v)]
    mask = torch.rand(3, 1, 9, 9, generator=torch.Generator().manual_seed(3)) > 0.2  # broadcast over dim 0
    mask[..., 0] = True
    torch.testing.assert_close(tileattn.scaled_dot_product_attention(*x, attn_mask=mask),
                               F.scaled_dot_product_attention(*x, attn_mask=mask))
    o = tileattn.scaled_dot_product_attention(*(t.numpy() for t in (q, k, v)))
    torch.testing.assert_close(torch.from_numpy(o), F.scaled_dot_product_attention(q, k, v))


def test_sdpa_errors_like_torch():
    q, k, v = sdpa_inputs(torch.float32, hk=2)
    for fn in (tileattn.scaled_dot_product_attention, F.scaled_dot_product_attention):
        with pytest.raises(RuntimeError):
            fn(q, k, v)  # GQA without enable_gqa
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        tileattn.scaled_dot_product_attention(q, k, v)
    q, k, v = sdpa_inputs(torch.float32)
    with pytest.raises(RuntimeError, match="attn_mask: must be None when is_causal=True"):
        tileattn.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(9, 9, dtype=torch.bool), is_causal=True)


def test_sdpa_argument_errors_are_sdpa_argument_errors():
    """Every argument error of the drop-in is a SdpaArgumentError (so a RuntimeError, as torch
    raises), also those flash_attention finds; the message is flash_attention's, and a dtype error
    stays a TypeError too."""
    from tileattn._sdpa import SdpaArgumentError

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape).to(dtype)

    bool_mask = dict(dtype=torch.bool)
    cases = [  # (query, key, value, options, words, also a TypeError)
        (t(1, 3, 2, 8), t(1, 2, 4, 8), t(1, 2, 4, 8), dict(enable_gqa=True), "heads must divide", False),
        (t(1, 2, 2, 8), t(1, 2, 4, 4), t(1, 2, 4, 8), {}, "head_dim", False),
        (t(2, 2, 2, 8), t(3, 2, 4, 8), t(3, 2, 4, 8), {}, "batch", False),
        (t(1, 2, 2, 8), t(1, 2, 4, 8, dtype=torch.bfloat16), t(1, 2, 4, 8), {}, "dtype", True),
        (t(1, 2, 2, 8), t(1, 2, 4, 8), t(1, 2, 4, 8), dict(attn_mask=torch.ones(3, 4, **bool_mask)), "attn_mask", False),
        (t(1, 2, 2, 8), t(1, 2, 4, 8), t(1, 2, 4, 8), dict(attn_mask=torch.ones(2, 4, dtype=torch.int64)),
         "attn_mask", True),
        (t(2, 3, 2, 4, 8), t(3, 2, 2, 5, 8), t(3, 2, 2, 5, 8), {}, r"key: leading dims \(3, 2\)", False),
        (t(2, 3, 2, 4, 8), t(2, 3, 2, 5, 8), t(2, 3, 2, 5, 8), dict(attn_mask=torch.ones(4, 1, 4, 5, **bool_mask)),
         "attn_mask", False),
        (t(2, 4, 8), t(2, 5, 8), t(2, 5, 8).double(), {}, "dtype", True),
    ]
    for q, k, v, options, words, type_error in cases:
        with pytest.raises(SdpaArgumentError, match=words) as info:
            tileattn.scaled_dot_product_attention(q, k, v, **options)
        assert isinstance(info.value, RuntimeError) and isinstance(info.value, TypeError) == type_error
        with pytest.raises(RuntimeError):  # torch too
            F.scaled_dot_product_attention(q, k, v, **options)


# ---------------------------------------------------------------- flash_attn_func / varlen

def bhsd(x):
    return np.swapaxes(np.asarray(x, dtype=np.float32), 1, 2)


FA2_CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window_size=(4, 1)),
    "causal+window+softcap": dict(causal=True, window_size=(5, -1), softcap=2.0),
    "alibi": dict(alibi=True),
}


def fa2_mask_options(opts, slopes):
    """The FA2 drop-in's options as reference.attention takes them."""
    out = dict(causal=opts.get("causal", False), window=opts.get("window_size", (-1, -1)),
               softcap=opts.get("softcap", 0.0))
    if slopes is not None:
        out["alibi_slopes"] = slopes
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(FA2_CASES))
def test_flash_attn_func_forward_and_backward(dtype, case):
    gen = torch.Generator().manual_seed(4)
    b, nq, nk, h, hk, d = 2, 7, 12, 4, 2, 16
    q = torch.randn(b, nq, h, d, generator=gen).to(dtype)
    k = torch.randn(b, nk, hk, d, generator=gen).to(dtype)
    v = torch.randn(b, nk, hk, d, generator=gen).to(dtype)
    opts = dict(FA2_CASES[case])
    slopes = torch.rand(b, h, generator=gen) * 0.5 if opts.pop("alibi", False) else None
    model = fa2_mask_options(opts, None if slopes is None else slopes.numpy())
    out = tileattn.flash_attn_func(q, k, v, alibi_slopes=slopes, **opts)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    check_close(bhsd(out.float()), bhsd(q.float()), bhsd(k.float()), bhsd(v.float()), NAMES[dtype], **model)

    g = torch.randn(b, h, nq, d, generator=gen).to(dtype).float()
    tr = lambda t: t.transpose(1, 2)  # noqa: E731
    got = grads(lambda q, k, v: (tr(tileattn.flash_attn_func(tr(q), tr(k), tr(v), alibi_slopes=slopes, **opts)), None),
                tr(q), tr(k), tr(v), g, None)
    mask = dict(model, alibi_slopes=slopes) if slopes is not None else model
    scale = d ** -0.5
    ref = grads(lambda q, k, v: math_attention(q, k, v, scale, **mask), tr(q).double(), tr(k).double(),
                tr(v).double(), g.double(), None)
    naive = naive_grads(tr(q), tr(k), tr(v), g, None, scale, dtype, **mask)
    o_ref, _ = math_attention(tr(q).double(), tr(k).double(), tr(v).double(), scale, **mask)
    row_sum = (o_ref * g.double()).sum(-1).abs().max().item()
    for name, a, r, n in zip("qkv", got, ref, naive):
        extra = DELTA_FLOOR_FRACTION * row_sum if name != "v" else 0.0
        verdict = check_rows(a.double().numpy(), r.numpy(), n.double().numpy(), gradient_floor_fraction(NAMES[dtype]),
                             extra_floor=extra)
        assert verdict["ok"], f"d{name}: {verdict}"


def test_flash_attn_func_returns_fa2_triple():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 6, 2, 8) for _ in range(3))
    out, lse, s_dmask = tileattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert lse.shape == (1, 2, 6) and s_dmask.shape == (1, 2, 6, 6)
    torch.testing.assert_close(out, tileattn.flash_attn_func(q, k, v, causal=True))
    torch.testing.assert_close(s_dmask.sum(-1), torch.ones(1, 2, 6))
    # A row that sees no key (causal, more queries than keys): softmax_lse +inf, as FlashAttention-2's
    # kernels write it (tileattn's own lse is -inf there); out is zeros.
    out, lse, _ = tileattn.flash_attn_func(q, k[:, :3], v[:, :3], causal=True, return_attn_probs=True)
    assert torch.equal(lse[..., :3], torch.full((1, 2, 3), float("inf"))) and torch.isfinite(lse[..., 3:]).all()
    assert not out[:, :3].any()
    assert torch.equal(tileattn.flash_attention(q, k[:, :3], v[:, :3], is_causal=True, layout="bshd",
                                                return_lse=True)[1][..., :3], torch.full((1, 2, 3), float("-inf")))
    # With dropout, dropped entries are negated (FlashAttention-2's encoding): |S| is the softmax.
    out, lse, s_dmask = tileattn.flash_attn_func(q, k, v, dropout_p=0.5, causal=True, return_attn_probs=True)
    assert (s_dmask < 0).any()
    torch.testing.assert_close(s_dmask.abs().sum(-1), torch.ones(1, 2, 6))
    kept = torch.where(s_dmask > 0, s_dmask / 0.5, torch.zeros(()))
    torch.testing.assert_close(torch.einsum("bhij,bjhd->bihd", kept, v), out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["causal", "causal+window+softcap", "alibi"])
def test_flash_attn_varlen_func(rng, case):
    lq, lk = [4, 1, 9], [6, 8, 9]
    cq = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32)
    ck = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32)
    h, hk, d = 4, 1, 16
    q = torch.from_numpy(rng.standard_normal((sum(lq), h, d)).astype(np.float32)).requires_grad_()
    k = torch.from_numpy(rng.standard_normal((sum(lk), hk, d)).astype(np.float32)).requires_grad_()
    v = torch.from_numpy(rng.standard_normal((sum(lk), hk, d)).astype(np.float32)).requires_grad_()
    opts = dict(FA2_CASES[case])
    slopes = torch.from_numpy((rng.random(h) * 0.5).astype(np.float32)) if opts.pop("alibi", False) else None
    out = tileattn.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), alibi_slopes=slopes, **opts)
    model = fa2_mask_options(opts, None if slopes is None else slopes.numpy())
    for b in range(3):
        rq, rk = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        seq = lambda t, r: bhsd(t.detach()[r][None])  # noqa: E731
        check_close(seq(out, rq), seq(q, rq), seq(k, rk), seq(v, rk), "float32", **model)
    # The backward is the native varlen path's (test_varlen.py checks it against float64).
    out.sum().backward()
    native = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    tileattn.flash_attention(*native, cu_seqlens_q=cq, cu_seqlens_k=ck, is_causal=opts.get("causal", False),
                             window=tileattn._flash_attn._window(opts.get("window_size")),
                             softcap=opts.get("softcap", 0.0), alibi_slopes=slopes).sum().backward()
    for a, n in zip((q, k, v), native):
        torch.testing.assert_close(a.grad, n.grad, rtol=0, atol=0)
    _, lse, s_dmask = tileattn.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), return_attn_probs=True)
    assert lse.shape == (h, sum(lq)) and s_dmask.shape == (3, h, max(lq), max(lk))
    with pytest.raises(NotImplementedError, match="block_table"):  # inference only, as in FlashAttention-2
        tileattn.flash_attn_varlen_func(q, k, v, cq, ck, 9, 9, block_table=torch.zeros(3, 1, dtype=torch.int32))


@pytest.mark.parametrize("case", ["causal", "causal+window+softcap", "alibi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_attn_varlen_func_block_table(rng, case, dtype):
    # Keys in pages of 4 tokens, shuffled: the same attention as the packed varlen call on the
    # keys gathered back, against the float64 model per sequence.
    lq, lk, page = [4, 0, 9, 3], [6, 8, 13, 0], 4
    cq = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32)
    ck = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32)
    h, hk, d, dv = 4, 2, 16, 8
    blocks = [(n + page - 1) // page for n in lk]
    order = rng.permutation(sum(blocks) + 3)  # 3 unused pages
    table = torch.zeros(len(lk), max(blocks), dtype=torch.int32)
    k_pages = torch.from_numpy(rng.standard_normal((len(order), page, hk, d)).astype(np.float32)).to(dtype)
    v_pages = torch.from_numpy(rng.standard_normal((len(order), page, hk, dv)).astype(np.float32)).to(dtype)
    k = torch.zeros(sum(lk), hk, d, dtype=dtype)
    v = torch.zeros(sum(lk), hk, dv, dtype=dtype)
    used = 0
    for b, n in enumerate(lk):
        for i in range(blocks[b]):
            table[b, i] = int(order[used])
            used += 1
        for j in range(n):
            k[int(ck[b]) + j] = k_pages[table[b, j // page], j % page]
            v[int(ck[b]) + j] = v_pages[table[b, j // page], j % page]
    q = torch.from_numpy(rng.standard_normal((sum(lq), h, d)).astype(np.float32)).to(dtype)
    opts = dict(FA2_CASES[case])
    slopes = torch.from_numpy((rng.random(h) * 0.5).astype(np.float32)) if opts.pop("alibi", False) else None
    out = tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cq, ck, max(lq), max(lk), alibi_slopes=slopes,
                                          block_table=table, **opts)
    assert out.shape == (sum(lq), h, dv) and out.dtype == dtype
    model = fa2_mask_options(opts, None if slopes is None else slopes.numpy())
    name = "float32" if dtype == torch.float32 else "bfloat16"
    for b in range(len(lq)):
        rq, rk = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if lq[b] == 0:
            continue
        if lk[b] == 0:
            assert not out[rq].any()  # no key: zeros
            continue
        seq = lambda t, r: bhsd(t.float()[r][None])  # noqa: E731
        check_close(seq(out, rq), seq(q, rq), seq(k, rk), seq(v, rk), name, **model)
    packed = tileattn.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), alibi_slopes=slopes, **opts)
    torch.testing.assert_close(out, packed, rtol=0, atol=2e-2 if dtype == torch.bfloat16 else 1e-5)
    with pytest.raises(ValueError, match="block_table"):
        tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cq, ck, max(lq), max(lk), block_table=table[:2])
    with pytest.raises(ValueError, match="max_seqlen"):
        tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cq, ck, 2, max(lk), block_table=table)


def test_flash_attn_varlen_func_block_table_errors_name_the_sequence():
    """Each sequence is its own one-sequence call: its errors name the caller's sequence and
    block_table row, not the call's 0. max_seqlen None is accepted, as without block_table."""
    h, d, page = 2, 8, 4
    q = torch.randn(7, h, d)
    k_pages, v_pages = torch.randn(6, page, h, d), torch.randn(6, page, h, d)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    cq = torch.tensor([0, 3, 7], dtype=torch.int32)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"^block_table: sequence 1 needs 4 pages of 4 tokens for 13 tokens "
                                             r"but the table has 3 entries per sequence$"):
            tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cq, torch.tensor([0, 5, 18], dtype=torch.int32),
                                            4, 13, block_table=table)
        with pytest.raises(ValueError, match=r"^block_table\[1, 2\] = 9 is out of range 0..5 \(num_pages = 6\)$"):
            tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cq, torch.tensor([0, 5, 17], dtype=torch.int32),
                                            4, 12, block_table=torch.tensor([[0, 1, 2], [3, 4, 9]], dtype=torch.int32))
        with pytest.raises(ValueError, match=r"^alibi_slopes: expected shape \[2\] or \[2, 2\], got \(3,\)$"):
            tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cq, torch.tensor([0, 5, 17], dtype=torch.int32),
                                            4, 12, alibi_slopes=torch.ones(3), block_table=table)
        with pytest.raises(ValueError, match=r"^max_seqlen_k: 11 is less than the longest sequence \(12\)$"):
            tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cq, torch.tensor([0, 5, 17], dtype=torch.int32),
                                            None, 11, block_table=table)
        ck = torch.tensor([0, 5, 17], dtype=torch.int32)
        out = tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cq, ck, None, None, block_table=table, causal=True)
        torch.testing.assert_close(out, tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cq, ck, 4, 12,
                                                                        block_table=table, causal=True))


# ---------------------------------------------------------------- flash_attn_with_kvcache

def rotate(x, cos, sin, positions, interleaved):
    """float64 rotary embedding of x [..., N, D] at `positions` [N] (FA2's two conventions)."""
    x = np.asarray(x, np.float64).copy()
    half = cos.shape[1]
    c, s = cos[positions].astype(np.float64), sin[positions].astype(np.float64)  # [N, half]
    if interleaved:
        a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = a * c - b * s, a * s + b * c
    return x


def fa2_kvcache_model(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens, batch_idx, leftpad, block_table,
                      causal, window, interleaved, round_fn):
    """FlashAttention-2's flash_attn_with_kvcache, spelled out in float64 from its docstring:
    q [B, Nq, H, D]; caches [B_c, S, Hkv, D] or pages [blocks, block_size, Hkv, D]; k, v appended at
    cache_seqlens[b] (rotated at cache_seqlens[b] + t); queries rotated at cache_seqlens[b] + t when
    causal or windowed, else at cache_seqlens[b]; keys cache_leftpad[b] .. end of sequence b's row
    cache_batch_idx[b]. Returns (per-sequence (q, k, v) [1, H|Hkv, N, D] as the attention sees them,
    the caches expected after the append)."""
    kc, vc = np.array(np.asarray(k_cache), np.float32), np.array(np.asarray(v_cache), np.float32)
    seqs = []
    for b in range(q.shape[0]):
        row = b if batch_idx is None else int(batch_idx[b])
        pad = 0 if leftpad is None else int(leftpad[b])
        old = int(cache_seqlens[b])
        n_new = 0 if k is None else k.shape[1]

        def rows_of(positions):  # (block, row) of each position
            if block_table is None:
                return [(row, p) for p in positions]
            size = kc.shape[1]
            return [(int(block_table[b][p // size]), p % size) for p in positions]

        if k is not None:
            kb = np.asarray(k[b], np.float32).swapaxes(0, 1)  # [Hkv, Nnew, D]
            if cos is not None:
                kb = round_fn(rotate(kb, cos, sin, np.arange(old, old + n_new), interleaved))
            for t, (blk, r) in enumerate(rows_of(range(old, old + n_new))):
                kc[blk, r] = kb[:, t]
                vc[blk, r] = np.asarray(v[b], np.float32)[t]
        positions = range(pad, old + n_new)
        keys = np.stack([kc[blk, r] for blk, r in rows_of(positions)], 1)[None]  # [1, Hkv, L, D]
        values = np.stack([vc[blk, r] for blk, r in rows_of(positions)], 1)[None]
        qb = np.asarray(q[b], np.float32).swapaxes(0, 1)  # [H, Nq, D]
        if cos is not None:
            per_token = causal or window != (-1, -1)
            qpos = old + (np.arange(q.shape[1]) if per_token else np.zeros(q.shape[1], int))
            qb = round_fn(rotate(qb, cos, sin, qpos, interleaved))
        seqs.append((qb[None], keys, values))
    return seqs, kc, vc


def rope(positions, rotary_dim):
    inv = 1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = np.arange(positions)[:, None] * inv[None]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


KV_CASES = {
    "append, causal": dict(new=2, causal=True),
    "append, rotary interleaved, causal": dict(new=3, rotary=True, causal=True),
    "append 1, 3 queries, rotary not causal (queries at cache_seqlens)": dict(new=1, nq=3, rotary=True),
    "append 2, 3 queries, rotary causal (queries at cache_seqlens + t)": dict(new=2, nq=3, rotary=True, causal=True),
    "rotary NeoX, window": dict(new=2, rotary=True, interleaved=False, window_size=(6, 0)),
    "batch_idx + leftpad, append, rotary causal": dict(new=2, rotary=True, causal=True, batch_idx=True, leftpad=True),
    "batch_idx, no append, softcap": dict(new=0, batch_idx=True, softcap=3.0),
    "paged, append, rotary causal": dict(new=2, rotary=True, causal=True, paged=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(KV_CASES))
def test_flash_attn_with_kvcache_matches_fa2_model(dtype, case):
    opts = dict(KV_CASES[case])
    gen = torch.Generator().manual_seed(7)
    b, h, hk, d, capacity = 3, 4, 2, 32, 40
    n_new, nq = opts.pop("new"), opts.pop("nq", None)
    nq = nq or max(n_new, 1)
    lengths = torch.tensor([5, 17, 11], dtype=torch.int32)
    rows = 5
    batch_idx = torch.tensor([4, 0, 2], dtype=torch.int32) if opts.pop("batch_idx", False) else None
    leftpad = torch.tensor([2, 0, 7], dtype=torch.int32) if opts.pop("leftpad", False) else None
    block_table = None
    if opts.pop("paged", False):
        block_size = 8  # FA2 needs multiples of 256; tileattn takes any
        block_table = torch.tensor([[3, 9, 1, 14, 6], [0, 2, 4, 5, 7], [8, 10, 11, 12, 13]], dtype=torch.int32)
        k_cache = torch.randn(15, block_size, hk, d, generator=gen).to(dtype)
    else:
        k_cache = torch.randn(rows if batch_idx is not None else b, capacity, hk, d, generator=gen).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=gen).to(dtype)
    q = torch.randn(b, nq, h, d, generator=gen).to(dtype)
    k = torch.randn(b, n_new, hk, d, generator=gen).to(dtype) if n_new else None
    v = torch.randn(b, n_new, hk, d, generator=gen).to(dtype) if n_new else None
    cos = sin = None
    interleaved = opts.pop("interleaved", True)
    if opts.pop("rotary", False):
        cos, sin = (torch.from_numpy(t) for t in rope(capacity, 16))
    window = opts.get("window_size", (-1, -1))
    causal = opts.get("causal", False)
    round_fn = lambda x: round_to(NAMES[dtype])(np.asarray(x, np.float32))  # noqa: E731
    seqs, k_expected, v_expected = fa2_kvcache_model(
        q.float(), k_cache.float(), v_cache.float(), None if k is None else k.float(), None if v is None else v.float(),
        None if cos is None else cos.numpy(), None if sin is None else sin.numpy(), lengths.numpy(),
        batch_idx, leftpad, block_table, causal, window, interleaved, round_fn)

    seqlens_before = lengths.clone()
    out, lse = tileattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lengths,
        cache_batch_idx=batch_idx, cache_leftpad=leftpad, block_table=block_table,
        rotary_interleaved=interleaved, return_softmax_lse=True, **opts)
    assert torch.equal(lengths, seqlens_before)  # not modified, as in FlashAttention-2
    assert out.shape == q.shape and out.is_contiguous() and lse.shape == (b, h, nq)
    np.testing.assert_array_equal(k_cache.float().numpy(), k_expected)
    np.testing.assert_array_equal(v_cache.float().numpy(), v_expected)
    for i, (qs, ks, vs) in enumerate(seqs):
        check_close(bhsd(out[i:i + 1].float()), qs, ks, vs, NAMES[dtype], got_lse=lse[i:i + 1].numpy(),
                    causal=causal, window=window, softcap=opts.get("softcap", 0.0))


def test_flash_attn_with_kvcache_out_is_contiguous_on_the_op_path():
    """The op path (q requires grad, tracing, torch.compile) returns FlashAttention-2's contiguous
    [B, Nq, H, D] as the direct call does (a transposed view would make .view() fail)."""
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(1, 2, 4, 64, generator=gen)
    kc, vc = torch.randn(1, 16, 2, 64, generator=gen), torch.randn(1, 16, 2, 64, generator=gen)
    direct = tileattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3)
    on_op = tileattn.flash_attn_with_kvcache(q.clone().requires_grad_(), kc, vc, cache_seqlens=3)
    assert direct.is_contiguous() and on_op.is_contiguous() and torch.equal(direct, on_op)
    assert on_op.view(1, 2, 256).shape == (1, 2, 256)


def test_flash_attn_with_kvcache_bad_indices_write_nothing():
    b, hk, d = 2, 1, 8
    k_cache, v_cache = torch.zeros(3, 10, hk, d), torch.zeros(3, 10, hk, d)
    q, k, v = torch.randn(b, 1, 2, d), torch.randn(b, 1, hk, d), torch.randn(b, 1, hk, d)
    lengths = torch.tensor([3, 4], dtype=torch.int32)
    for idx, message in (([1, 1], "sequences 0 and 1 both append to cache row 1"),
                         ([0, 3], r"cache_batch_idx\[1\] = 3 is out of range 0..2")):
        with pytest.raises(ValueError, match=message):
            tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths,
                                             cache_batch_idx=torch.tensor(idx, dtype=torch.int32))
        assert not k_cache.any() and not v_cache.any()
    with pytest.raises(ValueError, match=r"cache_leftpad\[0\] = 5 must be in 0..cache_seqlens\[0\] \(3\)"):
        tileattn.flash_attn_with_kvcache(q, k_cache[:2], v_cache[:2], k, v, cache_seqlens=lengths,
                                         cache_leftpad=torch.tensor([5, 0], dtype=torch.int32))
    assert not k_cache.any()
    with pytest.raises(NotImplementedError, match="cache_leftpad: not supported with block_table"):
        tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                         cache_leftpad=torch.tensor([0, 0], dtype=torch.int32),
                                         block_table=torch.tensor([[0], [1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="rotary_cos: rotary embedding needs new keys"):
        tileattn.flash_attn_with_kvcache(q, k_cache[:2], v_cache[:2], cache_seqlens=lengths,
                                         rotary_cos=torch.ones(10, 4), rotary_sin=torch.zeros(10, 4))
    # Duplicate rows without an append only read: allowed.
    tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                     cache_batch_idx=torch.tensor([1, 1], dtype=torch.int32))


def test_native_kvcache_batch_index_numpy_and_op_path():
    """attention_with_kvcache's cache_batch_idx / cache_leftpad on NumPy, and through the custom
    op (what torch.compile sees) with the same results as the direct call."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 2, 1, 8)).astype(np.float32)
    cache = rng.standard_normal((4, 1, 12, 8)).astype(np.float32)
    vals = rng.standard_normal((4, 1, 12, 8)).astype(np.float32)
    idx, pad, lengths = np.array([3, 1], np.int32), np.array([2, 0], np.int64), np.array([9, 5])
    o = tileattn.attention_with_kvcache(q, cache, vals, cache_seqlens=lengths, cache_batch_idx=idx,
                                        cache_leftpad=pad)
    for bi in range(2):
        keys, values = cache[idx[bi], :, pad[bi]:lengths[bi]][None], vals[idx[bi], :, pad[bi]:lengths[bi]][None]
        check_close(o[bi:bi + 1], q[bi:bi + 1], keys, values, "float32", causal=True)
    t = [torch.from_numpy(x.copy()) for x in (q, cache, vals)]
    direct = tileattn.attention_with_kvcache(*t, cache_seqlens=torch.from_numpy(lengths),
                                             cache_batch_idx=torch.from_numpy(idx), cache_leftpad=torch.from_numpy(pad))
    via_op = tileattn._torch_ops.attention_with_kvcache(
        t[0], t[1], t[2], None, None, torch.from_numpy(lengths), None, None, None, False, None, True, -1, -1,
        cache_batch_idx=torch.from_numpy(idx), cache_leftpad=torch.from_numpy(pad))[0]
    torch.testing.assert_close(direct, via_op, rtol=0, atol=0)
    torch.testing.assert_close(direct, torch.from_numpy(o), rtol=0, atol=0)


def test_flash_attn_with_kvcache_op_path_equals_direct_call():
    """A call torch can observe (q requires grad) goes through the custom op on [B, H, N, D] views;
    same results and cache contents as the direct call that reads the token-major arrays in place."""
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(2, 3, 4, 16, generator=gen)
    k, v = torch.randn(2, 3, 2, 16, generator=gen), torch.randn(2, 3, 2, 16, generator=gen)
    caches = [torch.randn(2, 20, 2, 16, generator=gen) for _ in range(2)]
    cos, sin = (torch.from_numpy(t) for t in rope(20, 8))
    lengths = torch.tensor([4, 9], dtype=torch.int32)
    direct_caches = [c.clone() for c in caches]
    direct = tileattn.flash_attn_with_kvcache(q, *direct_caches, k, v, cos, sin, cache_seqlens=lengths, causal=True)
    via_op = tileattn.flash_attn_with_kvcache(q.clone().requires_grad_(), *caches, k, v, cos, sin,
                                              cache_seqlens=lengths, causal=True)
    torch.testing.assert_close(via_op.detach(), direct, rtol=0, atol=0)
    for a, b in zip(caches, direct_caches):
        assert torch.equal(a, b)


def test_dropins_under_torch_compile_fullgraph():
    """Dynamo traces each drop-in whole (the custom ops), with the eager results."""
    compile_ = lambda f: torch.compile(f, fullgraph=True, backend="aot_eager")  # noqa: E731
    q, k, v = torch.randn(7, 2, 8), torch.randn(9, 2, 8), torch.randn(9, 2, 8)
    cq, ck = torch.tensor([0, 2, 7], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
    varlen = lambda q, k, v: tileattn.flash_attn_varlen_func(q, k, v, cq, ck, 5, 5, causal=True)  # noqa: E731
    assert torch.equal(compile_(varlen)(q, k, v), varlen(q, k, v))
    qq, kc, vc, k1 = torch.randn(2, 1, 2, 8), torch.randn(2, 10, 1, 8), torch.randn(2, 10, 1, 8), torch.randn(2, 1, 1, 8)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    step = lambda qq, kc, vc, k1: tileattn.flash_attn_with_kvcache(qq, kc, vc, k1, k1, cache_seqlens=lens,  # noqa: E731
                                                                   causal=True)
    kc2, vc2 = kc.clone(), vc.clone()
    assert torch.equal(compile_(step)(qq, kc, vc, k1), step(qq, kc2, vc2, k1))
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    q4, k4 = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 6, 8)
    sdpa = lambda q, k: tileattn.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)  # noqa: E731
    torch.testing.assert_close(compile_(sdpa)(q4, k4), sdpa(q4, k4), rtol=0, atol=0)
