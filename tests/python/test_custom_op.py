"""The torch custom ops: registration checked by torch.library.opcheck, and seen whole by
torch.compile (fullgraph, so a graph break would fail)."""
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
