"""Attention sinks (``sinks=[H]`` logits: exp(sink) joins each row's softmax denominator with no
value; gpt-oss) in flash_attention and attention_with_kvcache, NumPy and torch: the forward
against the float64 reference (reference.attention) and against Hugging Face's gpt-oss eager
attention run in float64, both by the project's tolerance rule; gradients (sinks.grad with q, k,
v) against torch autograd of that float64 formula, and sinks.grad against central differences;
the KV-cache paths (contiguous, paged, a long cache whose keys are split); bad input."""
import numpy as np
import pytest
import torch

import tileattn
from reference import DELTA_FLOOR_FRACTION, check_close, check_rows, gradient_floor_fraction, output_floor_fraction


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def sink_logits(h):
    """[H] sinks spread over [-2, 6]: below and above the rows' lse (~log(keys))."""
    return np.linspace(-2.0, 6.0, h).astype(np.float32)


# (b, h, hk, nq, nk, options): MHA, GQA, MQA; unequal lengths (nq > nk causal: rows that see no
# key, O = 0 and lse = the sink), a window, an additive mask, with a soft cap and ALiBi.
CASES = {
    "mha": (2, 4, 4, 37, 70, dict()),
    "gqa_causal": (2, 8, 2, 37, 70, dict(causal=True)),
    "mqa_causal_rows_without_keys": (1, 4, 1, 70, 37, dict(causal=True)),
    "window": (1, 4, 2, 50, 90, dict(window=(5, 2))),
    "additive": (2, 4, 2, 33, 40, dict(add_mask=True)),
    "softcap_alibi_causal": (1, 4, 2, 40, 60, dict(causal=True, softcap=3.0, alibi_slopes=True)),
}


def case_inputs(rng, name, dtype="float32"):
    b, h, hk, nq, nk, opts = CASES[name]
    d = 32
    q, k, v = rand(rng, b, h, nq, d), rand(rng, b, hk, nk, d), rand(rng, b, hk, nk, d)
    opts = dict(opts)
    if opts.pop("add_mask", False):
        opts["add_mask"] = rand(rng, b, h, nq, nk)
    if opts.get("alibi_slopes"):
        opts["alibi_slopes"] = (0.5 ** np.arange(1, h + 1)).astype(np.float32)
    return [x.astype(dtype) for x in (q, k, v)], opts


def call(q, k, v, sinks, opts, conv=lambda x: x, **kw):
    return tileattn.flash_attention(conv(q), conv(k), conv(v), attn_mask=conv(opts.get("add_mask")),
                                    is_causal=opts.get("causal", False), window=opts.get("window"),
                                    softcap=opts.get("softcap", 0.0),
                                    alibi_slopes=None if opts.get("alibi_slopes") is None else conv(opts["alibi_slopes"]),
                                    sinks=sinks, **kw)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", list(CASES))
def test_numpy_forward_matches_float64_reference(rng, dtype, case):
    (q, k, v), opts = case_inputs(rng, case, dtype)
    sinks = sink_logits(q.shape[1])
    o, lse = call(q, k, v, sinks, opts, return_lse=True)
    check_close(o, q, k, v, dtype, got_lse=lse, sinks=sinks, **opts)
    with pytest.raises(AssertionError):  # the sinks matter
        check_close(o, q, k, v, dtype, **opts)
    if case == "mqa_causal_rows_without_keys":  # rows 0 .. nq - nk - 1 see no key
        hidden = q.shape[2] - k.shape[2]
        assert not o[:, :, :hidden].any()
        np.testing.assert_array_equal(lse[:, :, :hidden], np.broadcast_to(sinks[None, :, None], lse[:, :, :hidden].shape))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_forward_eager_and_op_paths(rng, dtype):
    (q, k, v), opts = case_inputs(rng, "gqa_causal")
    name = "float32" if dtype == torch.float32 else "bfloat16"
    tq, tk, tv = (torch.from_numpy(x).to(dtype) for x in (q, k, v))
    sinks = torch.from_numpy(sink_logits(q.shape[1]))
    o, lse = tileattn.flash_attention(tq, tk, tv, is_causal=True, sinks=sinks, return_lse=True)
    check_close(o.float().numpy(), tq.float().numpy(), tk.float().numpy(), tv.float().numpy(), name,
                got_lse=lse.numpy(), causal=True, sinks=sinks.numpy())
    # The custom op's path (autograd can observe the call) computes the same bits; a bfloat16
    # sinks tensor is read as float32.
    o_op = tileattn.flash_attention(tq.clone().requires_grad_(), tk, tv, is_causal=True, sinks=sinks.bfloat16())
    o_bf = tileattn.flash_attention(tq, tk, tv, is_causal=True, sinks=sinks.bfloat16().float())
    assert torch.equal(o_op.detach(), o_bf)
    # bshd layout.
    o_t = tileattn.flash_attention(tq.transpose(1, 2), tk.transpose(1, 2), tv.transpose(1, 2), is_causal=True,
                                   sinks=sinks, layout="bshd")
    assert torch.equal(o_t.transpose(1, 2), o)


def hf_gpt_oss_eager(q, k, v, sinks, scale, add_mask):
    """transformers' gpt-oss eager_attention_forward, called as the model calls it (query heads
    repeated over the KV groups, the sinks concatenated as one more logit, the max subtracted,
    softmax, the sink column dropped). Returns [B, H, Nq, D]."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.num_key_value_groups = q.shape[1] // k.shape[1]
            self.sinks = sinks
            self.training = False

    out, _ = eager_attention_forward(Module(), q, k, v, add_mask, scale)
    return out.transpose(1, 2)  # eager returns [B, Nq, H, D]


def causal_additive(nq, nk, dtype):
    i = torch.arange(nq)[:, None] + (nk - nq)
    return torch.zeros(nq, nk, dtype=dtype).masked_fill(torch.arange(nk)[None, :] > i, float("-inf"))


@pytest.mark.parametrize("hq, hk", [(8, 2), (4, 4), (4, 1)])
def test_matches_hugging_face_gpt_oss_eager_in_float64(hq, hk):
    gen = torch.Generator().manual_seed(11)
    b, nq, nk, d = 2, 23, 41, 32
    q = torch.randn(b, hq, nq, d, generator=gen)
    k = torch.randn(b, hk, nk, d, generator=gen)
    v = torch.randn(b, hk, nk, d, generator=gen)
    sinks = torch.randn(hq, generator=gen) * 2 + 2
    scale = 0.125
    got = tileattn.flash_attention(q, k, v, softmax_scale=scale, is_causal=True, sinks=sinks)
    ref = hf_gpt_oss_eager(q.double(), k.double(), v.double(), sinks.double(), scale, causal_additive(nq, nk, torch.float64))
    naive = hf_gpt_oss_eager(q, k, v, sinks, scale, causal_additive(nq, nk, torch.float32))
    verdict = check_rows(got.numpy(), ref.numpy(), naive.numpy(), output_floor_fraction("float32"))
    assert verdict["ok"], verdict
    # The sink's convention matters: scaled by softmax_scale it would be another result.
    wrong = hf_gpt_oss_eager(q.double(), k.double(), v.double(), sinks.double() * scale, scale,
                             causal_additive(nq, nk, torch.float64))
    wrong_naive = hf_gpt_oss_eager(q, k, v, sinks * scale, scale, causal_additive(nq, nk, torch.float32))
    assert not check_rows(got.numpy(), wrong.numpy(), wrong_naive.numpy(), output_floor_fraction("float32"))["ok"]


def sink_attention(q, k, v, sinks, scale, causal=False, window=(-1, -1)):
    """Differentiable attention with sinks in q's dtype (the gpt-oss formula, lse included)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
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
    s = s.masked_fill(~keep, float("-inf"))
    logits = torch.cat([s, sinks.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    lse = torch.logsumexp(logits, -1)
    p = torch.softmax(logits, -1)[..., :-1]
    return p @ v, lse


def reference_grads(q, k, v, sinks, g, g_lse, dtype, **opts):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, sinks)]
    o, lse = sink_attention(*leaves, **opts)
    loss = (o * g.to(dtype)).sum() + (0 if g_lse is None else (lse * g_lse.to(dtype)).sum())
    loss.backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("opts", [dict(causal=True), dict(), dict(window=(3, 1)), dict(causal=True, rows_without_keys=True)],
                         ids=["causal", "plain", "window", "rows_without_keys"])
@pytest.mark.parametrize("with_lse", [False, True], ids=["kernel_backward", "math_backward_through_lse"])
def test_gradients_with_sinks_grad_match_float64_autograd(opts, with_lse):
    gen = torch.Generator().manual_seed(7)
    opts = dict(opts)
    b, h, hk, d = 2, 4, 2, 16
    nq, nk = (13, 9) if opts.pop("rows_without_keys", False) else (9, 13)
    q, k, v = (torch.randn(b, n, m, d, generator=gen) for n, m in ((h, nq), (hk, nk), (hk, nk)))
    sinks = torch.randn(h, generator=gen) + 1.5
    g = torch.randn(b, h, nq, d, generator=gen)
    g_lse = torch.randn(b, h, nq, generator=gen) if with_lse else None
    scale = d ** -0.5
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    o, lse = tileattn.flash_attention(*leaves[:3], is_causal=opts.get("causal", False), window=opts.get("window"),
                                      sinks=leaves[3], return_lse=True)
    ((o * g).sum() + (0 if g_lse is None else (lse * g_lse).sum())).backward()
    got = [t.grad for t in leaves]
    ref = reference_grads(q, k, v, sinks, g, g_lse, torch.float64, scale=scale, **opts)
    naive = reference_grads(q, k, v, sinks, g, g_lse, torch.float32, scale=scale, **opts)
    delta = float((g.double() * o.detach().double()).sum(-1).abs().max())
    floor = gradient_floor_fraction("float32")
    for name, a, r, n, extra in zip(("dq", "dk", "dv", "d_sinks"), got, ref, naive,
                                    (delta, delta, 0.0, delta)):
        verdict = check_rows(a.numpy(), r.numpy(), n.numpy(), floor, extra_floor=DELTA_FLOOR_FRACTION * extra)
        assert verdict["ok"], (name, verdict)
        bitten = check_rows(a.numpy(), r.numpy(), n.numpy(), floor, perturb=1e-3,
                            extra_floor=DELTA_FLOOR_FRACTION * extra)
        assert not bitten["ok"], (name, "a 0.1% change passes", bitten)


def test_sinks_grad_matches_central_differences():
    """d loss / d sinks[h] by central differences of the float32 forward (h = 1e-2; the
    difference quotient's truncation error is ~h^2 x the third derivative, ~1e-5 here)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 4, 11, 16, generator=gen), torch.randn(1, 2, 15, 16, generator=gen), \
        torch.randn(1, 2, 15, 16, generator=gen)
    g = torch.randn(1, 4, 11, 16, generator=gen)
    sinks = torch.tensor([-1.0, 0.5, 2.0, 3.5], requires_grad=True)
    (tileattn.flash_attention(q, k, v, is_causal=True, sinks=sinks) * g).sum().backward()

    def loss(s):
        return float((tileattn.flash_attention(q, k, v, is_causal=True, sinks=s).double() * g.double()).sum())

    step = 1e-2
    for hh in range(4):
        up, down = sinks.detach().clone(), sinks.detach().clone()
        up[hh] += step
        down[hh] -= step
        fd = (loss(up) - loss(down)) / (2 * step)
        assert abs(float(sinks.grad[hh]) - fd) <= 1e-4 * max(1.0, abs(fd)), (hh, float(sinks.grad[hh]), fd)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_decode_with_sinks(rng, paged):
    """Decode steps on caches of 20 and 2100 tokens (the long one's keys are split and merged:
    the sink is added once per row), numpy contiguous or torch paged, and the custom op."""
    b, h, hk, d = 2, 8, 2, 32
    lengths = [20, 2100]
    cap = 2112
    k_all, v_all = rand(rng, b, hk, cap, d), rand(rng, b, hk, cap, d)
    q = rand(rng, b, h, 1, d)
    sinks = sink_logits(h)
    seqlens = np.array(lengths, np.int32)
    if not paged:
        o, lse = tileattn.attention_with_kvcache(q, k_all, v_all, cache_seqlens=seqlens, sinks=sinks,
                                                 return_lse=True)
    else:
        page = 16
        pages = cap // page
        order = rng.permutation(b * pages)
        kp = np.zeros((b * pages, hk, page, d), np.float32)
        vp = np.zeros_like(kp)
        table = order.reshape(b, pages).astype(np.int32)
        for s in range(b):
            for i in range(pages):
                kp[table[s, i]] = k_all[s, :, i * page:(i + 1) * page]
                vp[table[s, i]] = v_all[s, :, i * page:(i + 1) * page]
        conv = torch.from_numpy
        o, lse = tileattn.attention_with_kvcache(conv(q), conv(kp), conv(vp), cache_seqlens=conv(seqlens),
                                                 block_table=conv(table), sinks=conv(sinks), return_lse=True)
        from tileattn import _torch_ops
        o_op, _ = _torch_ops.attention_with_kvcache(conv(q), conv(kp), conv(vp), None, None, conv(seqlens),
                                                    conv(table), None, None, False, None, True, -1, -1, 0.0,
                                                    None, conv(sinks))
        assert torch.equal(o_op, o)
        o, lse = o.numpy(), lse.numpy()
    for s, n in enumerate(lengths):
        check_close(o[s:s + 1], q[s:s + 1], k_all[s:s + 1, :, :n], v_all[s:s + 1, :, :n], "float32",
                    got_lse=lse[s:s + 1], causal=True, sinks=sinks)
    with pytest.raises(AssertionError):  # the sinks matter
        check_close(o[1:], q[1:], k_all[1:, :, :2100], v_all[1:, :, :2100], "float32", causal=True)


def test_bad_sinks_are_errors_naming_them_and_nothing_is_written(rng):
    q = rand(rng, 2, 4, 5, 8)
    out = np.full_like(q, 7.0)
    for bad in (np.ones(3, np.float32), np.ones((2, 4), np.float32)):
        with pytest.raises(ValueError, match="sinks"):
            tileattn.flash_attention(q, q, q, sinks=bad, out=out)
        with pytest.raises(ValueError, match="sinks"):
            t = torch.from_numpy(q)
            tileattn.flash_attention(t, t, t, sinks=torch.from_numpy(bad))
    for value in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match=r"sinks\[2\]"):
            tileattn.flash_attention(q, q, q, sinks=np.array([1, 1, value, 1], np.float32), out=out)
    with pytest.raises(TypeError, match="sinks"):
        tileattn.flash_attention(q, q, q, sinks=np.ones(4, np.int32))
    assert (out == 7.0).all()
    kc = np.zeros((2, 4, 8, 8), np.float32)
    seqlens = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match=r"sinks\[0\]"):
        tileattn.attention_with_kvcache(q, kc, kc.copy(), q, q, cache_seqlens=seqlens,
                                        sinks=np.array([np.nan, 0, 0, 0], np.float32))
    with pytest.raises(ValueError, match="sinks"):
        tileattn.attention_with_kvcache(q, kc, kc.copy(), q, q, cache_seqlens=seqlens, sinks=np.ones(5, np.float32))
    assert not kc.any() and not seqlens.any()


def test_custom_op_opcheck_with_sinks():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 6, 16, generator=gen).requires_grad_()
    k = torch.randn(1, 2, 9, 16, generator=gen).requires_grad_()
    v = torch.randn(1, 2, 9, 16, generator=gen).requires_grad_()
    sinks = torch.tensor([0.5, -1.0, 2.0, 1.0], requires_grad=True)
    ops = torch.ops.tileattn
    torch.library.opcheck(ops.flash_attention.default, (q, k, v, None, 0.0, 0.25, True, -1, -1, 0, 0, 0.0, None, sinks),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_compile_fullgraph_gives_the_same_sinks_grad():
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(1, 4, 6, 16, generator=gen), torch.randn(1, 2, 9, 16, generator=gen), \
        torch.randn(1, 2, 9, 16, generator=gen)

    def layer(q, k, v, sinks):
        return tileattn.flash_attention(q * 2, k, v, is_causal=True, sinks=sinks).sum()

    grads = []
    for fn in (torch.compile(layer, backend="aot_eager", fullgraph=True), layer):
        sinks = torch.tensor([0.5, -1.0, 2.0, 1.0], requires_grad=True)
        fn(q, k, v, sinks).backward()
        grads.append(sinks.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=0, rtol=0)
    assert grads[0].abs().min() > 0


@pytest.mark.parametrize("loss_uses_lse", [False, True])
def test_varlen_with_sinks_equals_each_sequence_alone(loss_uses_lse):
    """Packed varlen with sinks: o, lse and every gradient (sinks' included, through the C++
    backward, or the PyTorch math one when the loss uses lse) equal the per-sequence calls."""
    torch.manual_seed(11)
    heads, dim, lens_q, lens_k = 4, 16, [5, 9, 1], [7, 9, 12]
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32)
    q = torch.randn(sum(lens_q), heads, dim, requires_grad=True)
    k, v = (torch.randn(sum(lens_k), heads, dim, requires_grad=True) for _ in range(2))
    sinks = torch.randn(heads, requires_grad=True)

    def loss_of(o, lse):
        return (o * o).sum() + (lse.sum() if loss_uses_lse else 0.0)

    o, lse = tileattn.flash_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, is_causal=True,
                                      sinks=sinks, return_lse=True)
    got = torch.autograd.grad(loss_of(o, lse), (q, k, v, sinks))
    parts = [tileattn.flash_attention(q[cu_q[i]:cu_q[i + 1]][None], k[cu_k[i]:cu_k[i + 1]][None],
                                      v[cu_k[i]:cu_k[i + 1]][None], layout="bshd", is_causal=True,
                                      sinks=sinks, return_lse=True) for i in range(len(lens_q))]
    o_each = torch.cat([p[0][0] for p in parts])
    lse_each = torch.cat([p[1][0] for p in parts], dim=1)
    want = torch.autograd.grad(loss_of(o_each, lse_each), (q, k, v, sinks))
    torch.testing.assert_close(o, o_each, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, lse_each, rtol=1e-5, atol=1e-6)
    for name, a, b in zip(("dq", "dk", "dv", "d_sinks"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    probs = tileattn.flash_attention(q.detach(), k.detach(), v.detach(), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                     is_causal=True, sinks=sinks.detach(), return_attn_probs=True)[1]
    assert float(probs.sum(-1).max()) < 1.0  # each row leaves the sink its share
