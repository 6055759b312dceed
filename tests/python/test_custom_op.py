"""The torch custom ops: registration checked by torch.library.opcheck, and seen whole by
torch.compile (fullgraph, so a graph break would fail)."""
import pytest
import torch

import tileattn
import tileattn._torch_ops  # noqa: F401  (registers torch.ops.tileattn.*)


def inputs(requires_grad=False):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 6, 16, generator=g)
    k = torch.randn(1, 2, 9, 16, generator=g)
    v = torch.randn(1, 2, 9, 16, generator=g)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def test_opcheck_forward_and_backward_ops():
    q, k, v = inputs(requires_grad=True)
    mask = torch.rand(6, 9, generator=torch.Generator().manual_seed(3)) > 0.2
    ops = torch.ops.tileattn
    torch.library.opcheck(ops.flash_attention.default, (q, k, v, mask, 0.0, 0.25, True, -1, -1, 0, 0),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    q, k, v = inputs()
    o, lse = ops.flash_attention(q, k, v, None, 0.0, 0.25, False, -1, -1, 0, 0)
    torch.library.opcheck(ops.flash_attention_backward.default,
                          (q, k, v, o, lse, torch.randn_like(o), torch.zeros_like(lse), None, 0.0, 0.25,
                           False, -1, -1, 0, 0), test_utils=("test_schema", "test_faketensor"))
    # With a soft cap (the trailing argument, default 0.0).
    q, k, v = inputs(requires_grad=True)
    torch.library.opcheck(ops.flash_attention.default, (q, k, v, mask, 0.0, 0.25, True, -1, -1, 0, 0, 2.0),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    q, k, v = inputs()
    o, lse = ops.flash_attention(q, k, v, None, 0.0, 0.25, False, -1, -1, 0, 0, 2.0)
    torch.library.opcheck(ops.flash_attention_backward.default,
                          (q, k, v, o, lse, torch.randn_like(o), torch.zeros_like(lse), None, 0.0, 0.25,
                           False, -1, -1, 0, 0, 2.0), test_utils=("test_schema", "test_faketensor"))


def test_compile_fullgraph_with_softcap():
    def layer(q, k, v):
        return tileattn.flash_attention(q * 2, k, v, is_causal=True, softcap=2.0).sum()

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    q, k, v = inputs(requires_grad=True)
    compiled(q, k, v).backward()
    got = [t.grad.clone() for t in (q, k, v)]
    q2, k2, v2 = inputs(requires_grad=True)
    layer(q2, k2, v2).backward()
    for a, b in zip(got, (q2.grad, k2.grad, v2.grad)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_compile_fullgraph_forward_and_backward():
    def layer(q, k, v):
        return tileattn.flash_attention(q * 2, k, v, is_causal=True).sum()

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    q, k, v = inputs(requires_grad=True)
    compiled(q, k, v).backward()
    got = [t.grad.clone() for t in (q, k, v)]
    q2, k2, v2 = inputs(requires_grad=True)
    layer(q2, k2, v2).backward()
    for a, b in zip(got, (q2.grad, k2.grad, v2.grad)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_make_fx_records_the_op():
    from torch.fx.experimental.proxy_tensor import make_fx
    q, k, v = inputs()
    graph = make_fx(lambda q, k, v: tileattn.flash_attention(q, k, v))(q, k, v)
    assert "tileattn.flash_attention" in str(graph.code)


def test_merge_states_op_under_compile():
    q, k, v = inputs()
    o_a, l_a = tileattn.flash_attention(q, k[:, :, :4], v[:, :, :4], return_lse=True)
    o_b, l_b = tileattn.flash_attention(q, k[:, :, 4:], v[:, :, 4:], return_lse=True)
    merged = torch.compile(tileattn.merge_states, backend="aot_eager", fullgraph=True)(o_a, l_a, o_b, l_b)
    torch.testing.assert_close(merged[0], tileattn.flash_attention(q, k, v), atol=1e-6, rtol=1e-5)


def test_direct_call_without_autograd_equals_the_op():
    """Plain inference calls skip the op's dispatch (for speed); the result must be the op's."""
    q, k, v = inputs()
    mask = torch.rand(6, 9, generator=torch.Generator().manual_seed(4)) > 0.2
    o, lse = tileattn.flash_attention(q, k, v, attn_mask=mask, is_causal=True, return_lse=True)
    o2, lse2 = torch.ops.tileattn.flash_attention(q, k, v, mask, 0.0, 16 ** -0.5, True, -1, -1, 0, 0)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def kvcache_inputs():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 1, 16, generator=g)
    k_cache, v_cache = torch.randn(2, 2, 12, 16, generator=g), torch.randn(2, 2, 12, 16, generator=g)
    k, v = torch.randn(2, 2, 1, 16, generator=g), torch.randn(2, 2, 1, 16, generator=g)
    cos, sin = torch.randn(12, 4, generator=g), torch.randn(12, 4, generator=g)
    return q, k_cache, v_cache, k, v, cos, sin


class RecordOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ops dispatched while active; a mode is what makes a call observable."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_kvcache_direct_call_equals_the_op_and_bumps_the_cache_versions():
    """A plain inference call skips the op's dispatch; under a dispatch mode the op runs. Both
    give the same output and cache, and both bump the caches' version counters (the op is
    declared as mutating them, so autograd can tell a saved cache changed)."""
    q, kc, vc, k, v, cos, sin = kvcache_inputs()
    kc2, vc2 = kc.clone(), vc.clone()
    seqlens = torch.tensor([3, 7])
    versions = (kc._version, vc._version)
    o, lse = tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, rotary_cos=cos,
                                             rotary_sin=sin, return_lse=True)
    assert kc._version > versions[0] and vc._version > versions[1]
    with RecordOps() as mode:
        o2, lse2 = tileattn.attention_with_kvcache(q, kc2, vc2, k, v, cache_seqlens=seqlens,
                                                   rotary_cos=cos, rotary_sin=sin, return_lse=True)
    assert "tileattn.attention_with_kvcache.default" in mode.names
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert torch.equal(seqlens, torch.tensor([3, 7]))  # the caller's lengths are not advanced


def test_make_fx_records_the_kvcache_op():
    from torch.fx.experimental.proxy_tensor import make_fx
    q, kc, vc, k, v, _, _ = kvcache_inputs()
    graph = make_fx(lambda q, kc, vc, k, v: tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=2))(
        q, kc, vc, k, v)
    assert "tileattn.attention_with_kvcache" in str(graph.code)


@pytest.mark.parametrize("seqlens", [torch.tensor([3, 7]), torch.tensor([3, 7], dtype=torch.int32), 4])
def test_kvcache_under_compile_fullgraph(seqlens):
    """torch.compile sees the whole kv-cache call: the lengths are checked on metadata while
    tracing and on their values when the op runs. Same output and cache as the eager call."""
    q, kc, vc, k, v, cos, sin = kvcache_inputs()
    kc2, vc2 = kc.clone(), vc.clone()

    def step(q, kc, vc, k, v, seqlens):
        return tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, rotary_cos=cos,
                                               rotary_sin=sin, return_lse=True)

    o, lse = step(q, kc, vc, k, v, seqlens)
    o2, lse2 = torch.compile(step, backend="aot_eager", fullgraph=True)(q, kc2, vc2, k, v, seqlens)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_kvcache_op_checks_the_lengths_values_when_it_runs():
    q, kc, vc, k, v, _, _ = kvcache_inputs()
    for bad in (torch.tensor([-1, 2]), torch.tensor([1, 2 ** 31])):
        with pytest.raises(ValueError, match="cache_seqlens"):
            torch.compile(lambda q, kc, vc, k, v, s: tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=s),
                          backend="aot_eager", fullgraph=True)(q, kc, vc, k, v, bad)


def test_kvcache_op_path_checks_alibi_slopes_and_sinks_like_the_direct_call():
    """The op hands the kernel bare pointers to alibi_slopes and sinks: a wrong shape (a slice
    of a longer tensor, whose next element the kernel would read) or a tensor on the meta device
    is the direct call's ValueError on every path torch can observe, and nothing is appended."""
    q, kc, vc, k, v, _, _ = kvcache_inputs()
    backing = torch.ones(9)
    bad = [("alibi_slopes", backing[:3], r"alibi_slopes: expected shape \[4\] or \[2, 4\], got \(3,\)"),
           ("alibi_slopes", backing[:3].reshape(1, 3), r"alibi_slopes: expected shape \[4\] or \[2, 4\], got \(1, 3\)"),
           ("alibi_slopes", backing[:8].reshape(4, 2), r"alibi_slopes: expected shape \[4\] or \[2, 4\], got \(4, 2\)"),
           ("sinks", backing[:3], r"sinks: expected shape \[4\] \(one logit per query head\), got \(3,\)"),
           ("alibi_slopes", torch.ones(4, device="meta"), "alibi_slopes: tensor is on device 'meta' but q is not"),
           ("sinks", torch.ones(4, device="meta"), "sinks: tensor is on device 'meta' but q is not")]
    compiled = torch.compile(lambda q, kc, vc, k, v, **kw: tileattn.attention_with_kvcache(
        q, kc, vc, k, v, cache_seqlens=2, **kw), backend="eager")
    for name, value, message in bad:
        with pytest.raises(ValueError, match=message):  # the direct call
            tileattn.attention_with_kvcache(q, kc.clone(), vc.clone(), k, v, cache_seqlens=2, **{name: value})
        caches = kc.clone(), vc.clone()
        with pytest.raises(ValueError, match=message):
            tileattn.attention_with_kvcache(q.clone().requires_grad_(), *caches, k, v, cache_seqlens=2,
                                            **{name: value})
        with pytest.raises(ValueError, match=message), RecordOps():
            tileattn.attention_with_kvcache(q, *caches, k, v, cache_seqlens=2, **{name: value})
        with pytest.raises(ValueError, match=message):
            compiled(q, *caches, k, v, **{name: value})
        assert torch.equal(caches[0], kc) and torch.equal(caches[1], vc)


def test_flash_attention_under_a_dispatch_mode_goes_through_the_op():
    q, k, v = inputs()
    with RecordOps() as mode:
        o = tileattn.flash_attention(q, k, v, is_causal=True)
    assert "tileattn.flash_attention.default" in mode.names
    assert torch.equal(o, tileattn.flash_attention(q, k, v, is_causal=True))


def test_plain_inference_calls_skip_the_ops(monkeypatch):
    """The speed contract of docs/python.md: plain tensors with nothing observing take the one
    C++ call, never the op (whose Python dispatch costs more than a decode step's C++ call);
    with autograd they take the op."""
    from tileattn import _forward, _kvcache, _torch_ops

    def refuse(*args, **kwargs):
        raise AssertionError("the custom op was called")

    monkeypatch.setattr(_torch_ops, "flash_attention_op", refuse)
    monkeypatch.setattr(_torch_ops, "attention_with_kvcache_op", refuse)
    q, k, v = inputs()
    tileattn.flash_attention(q, k, v, is_causal=True)
    with torch.no_grad():
        tileattn.flash_attention(q.requires_grad_(True), k, v)
    q, kc, vc, k1, v1, cos, sin = kvcache_inputs()
    tileattn.attention_with_kvcache(q, kc, vc, k1, v1, cache_seqlens=2, rotary_cos=cos, rotary_sin=sin)
    with pytest.raises(AssertionError, match="the custom op was called"):
        tileattn.flash_attention(q.requires_grad_(True), kc, vc)
    assert _forward._torch_tensor is torch.Tensor and _kvcache._torch_tensor is torch.Tensor


def test_jit_trace_records_the_op():
    """torch.jit.trace sees plain tensors with no gradient: the direct C++ path must decline
    (torch_eager.cpp asks torch._C._is_tracing()) or the trace would miss the attention."""
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    with torch.no_grad():
        traced = torch.jit.trace(lambda q, k, v: tileattn.flash_attention(q, k, v), (q, k, v),
                                 check_trace=False)
    assert "tileattn::flash_attention" in str(traced.graph)
    q2 = torch.randn(1, 2, 4, 8)
    assert torch.equal(traced(q2, k, v), tileattn.flash_attention(q2, k, v))
