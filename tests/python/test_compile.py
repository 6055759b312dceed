"""torch.compile (inductor, the default backend), torch.export and the custom ops' fake kernels:
what a compiled or exported graph computes must equal eager, forward and backward."""
import pytest
import torch

import tileattn
import tileattn._torch_ops  # noqa: F401  (registers torch.ops.tileattn.*)

ops = torch.ops.tileattn


def randn(*shape, seed=0, requires_grad=False):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return t.requires_grad_(requires_grad)


def leaves(*tensors):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


def test_backward_op_outputs_have_the_fake_kernels_strides():
    """The backward op's real outputs must have the strides its fake kernel promises (contiguous
    dq, dk, dv), also on the PyTorch-math path (a loss through lse) for "bshd" and for packed
    rows that are not contiguous: inductor's compiled backward asserts them."""
    q, k, v = randn(2, 5, 4, 16, seed=1), randn(2, 7, 2, 16, seed=2), randn(2, 7, 2, 8, seed=3)
    o, lse = ops.flash_attention(q, k, v, None, 0.0, 0.25, True, -1, -1, 1, 0)
    torch.library.opcheck(ops.flash_attention_backward.default,
                          (q, k, v, o, lse, torch.randn_like(o), torch.randn_like(lse), None, 0.0, 0.25,
                           True, -1, -1, 1, 0), test_utils=("test_schema", "test_faketensor"))
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 5, 11], dtype=torch.int32)
    q, k, v = (randn(h, n, 16, seed=h + n).transpose(0, 1) for h, n in ((4, 7), (2, 11), (2, 11)))
    o, lse = ops.flash_attention(q, k, v, None, 0.0, 0.25, True, -1, -1, 1, 0, 0.0, None, None, cu_q, cu_k)
    torch.library.opcheck(ops.flash_attention_backward.default,
                          (q, k, v, o, lse, torch.randn_like(o), torch.randn_like(lse), None, 0.0, 0.25,
                           True, -1, -1, 1, 0, 0.0, None, None, cu_q, cu_k),
                          test_utils=("test_schema", "test_faketensor"))


def test_inductor_backward_through_lse_in_bshd_equals_eager():
    """torch.compile's default backend on a loss that uses o and lse with layout "bshd" (it
    raised inductor's stride assertion in the backward)."""
    def loss(q, k, v):
        o, lse = tileattn.flash_attention(q, k, v, is_causal=True, layout="bshd", return_lse=True)
        return o.sum() + (lse * lse).sum()

    args = [randn(2, 6, 4, 16, seed=i, requires_grad=True) for i in range(3)]
    args[1], args[2] = args[1][:, :, :2].detach().requires_grad_(), args[2][:, :, :2].detach().requires_grad_()
    eager, compiled = leaves(*args), leaves(*args)
    loss(*eager).backward()
    torch.compile(loss)(*compiled).backward()
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4)


def test_dropout_compiles_without_a_graph_break_and_backward_replays_the_forwards_mask():
    """Dropout under torch.compile: the seed is drawn inside the graph (its .item() broke the
    graph on every call of the default mode), new on each run, and the backward replays the
    forward's mask. o is linear in v (o = A v, A the kept and rescaled weights), so with that
    mask sum(o * g) == sum(v * dv) for dv = A^T g."""
    from torch._dynamo.utils import counters

    def attend(q, k, v):
        return tileattn.flash_attention(q, k, v, dropout_p=0.4, is_causal=True)

    q, k, v = (randn(1, 2, 8, 16, seed=i, requires_grad=True) for i in range(3))
    g = randn(1, 2, 8, 16, seed=7)
    compiled = torch.compile(attend)
    counters.clear()
    o = compiled(q, k, v)
    assert not counters["graph_break"], dict(counters["graph_break"])
    o.backward(g)
    torch.testing.assert_close((v * v.grad).sum(), (o * g).sum(), atol=1e-4, rtol=1e-5)
    assert not torch.equal(compiled(q, k, v), o)  # a new seed per run
    # aot_eager draws the seed from torch's generator as eager does: the same output.
    torch.manual_seed(3)
    eager = attend(q, k, v)
    torch.manual_seed(3)
    torch.testing.assert_close(torch.compile(attend, backend="aot_eager", fullgraph=True)(q, k, v), eager,
                               atol=0, rtol=0)


def test_opcheck_with_a_seed_tensor():
    q, k, v = (randn(1, 2, 8, 16, seed=i, requires_grad=True) for i in range(3))
    seed = torch.tensor(1234)
    args = (q, k, v, None, 0.3, 0.25, False, -1, -1, 0, 0, 0.0, None, None, None, None, -1, -1, seed)
    torch.library.opcheck(ops.flash_attention.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    # The tensor seed is the seed: the same output as the int.
    o, _ = ops.flash_attention(*args)
    assert torch.equal(o, ops.flash_attention(*args[:10], 1234)[0])


def test_export_with_dropout():
    """torch.export of a module with dropout (it failed: a data-dependent guard on the seed's
    .item()); the exported program draws a new seed per run."""
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return tileattn.flash_attention(q, k, v, dropout_p=0.5)

    args = tuple(randn(1, 2, 8, 16, seed=i) for i in range(3))
    module = torch.export.export(Attention(), args).module()
    a, b = module(*args), module(*args)
    assert a.shape == (1, 2, 8, 16) and not torch.equal(a, b)
    torch.testing.assert_close(a.mean(), tileattn.flash_attention(*args).mean(), atol=0.2, rtol=0)


def test_module_compiles_fullgraph_on_every_call():
    """FlashAttention under torch.compile(fullgraph=True): the second prefill (a cache already
    there) used to break the graph on reset_cache's Tensor.is_inference(), which Dynamo cannot
    trace; training and inference calls equal eager."""
    from tileattn._module import AttentionConfig, FlashAttention
    config = AttentionConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    layer, eager = FlashAttention(config), FlashAttention(config)
    eager.load_state_dict(layer.state_dict())
    compiled = torch.compile(layer, fullgraph=True)
    for n in (5, 5):
        x = randn(2, n, 32, seed=n)
        torch.testing.assert_close(compiled(x), eager(x), atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        x = randn(2, 5, 32, seed=9)
        torch.testing.assert_close(compiled(x), eager(x), atol=1e-5, rtol=1e-4)
    # A cache made eagerly under inference_mode: the compiled prefill outside it makes a new one.
    fresh = FlashAttention(config)
    fresh.load_state_dict(layer.state_dict())
    with torch.inference_mode():
        fresh(x)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(fresh, fullgraph=True)(x), eager(x), atol=1e-5, rtol=1e-4)


def test_compiled_decode_steps_with_dynamic_module_ints():
    """docs/python.md's advice for compiled decode loops: FlashAttention.cache_length is an int
    attribute, which Dynamo treats as static (one recompile per step, eager after 8); with
    allow_unspec_int_on_nn_module the steps share graphs and equal eager."""
    from torch._dynamo.utils import counters

    from tileattn._module import AttentionConfig, FlashAttention
    config = AttentionConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    layer, eager = FlashAttention(config), FlashAttention(config)
    eager.load_state_dict(layer.state_dict())
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):
        prompt = randn(2, 5, 32, seed=1)
        layer(prompt), eager(prompt)
        step = torch.compile(layer.incremental_forward, backend="aot_eager")
        for i in range(10):
            x = randn(2, 1, 32, seed=10 + i)
            torch.testing.assert_close(step(x), eager.incremental_forward(x), atol=1e-5, rtol=1e-4)
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])


def _opcheck_cases():
    r = lambda *s, seed=0, grad=True: randn(*s, seed=seed, requires_grad=grad)  # noqa: E731
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
    seqlens = torch.tensor([3, 5], dtype=torch.int32)
    fwd, kv = ops.flash_attention.default, ops.attention_with_kvcache.default
    return {
        "bshd, GQA, Dv != D, window": (fwd, (r(2, 6, 4, 16), r(2, 9, 2, 16, seed=1), r(2, 9, 2, 8, seed=2), None,
                                             0.0, 0.25, False, 2, 1, 1, 0)),
        "float mask with a gradient, causal": (fwd, (r(1, 4, 6, 16), r(1, 2, 9, 16, seed=1), r(1, 2, 9, 16, seed=2),
                                                     r(1, 1, 6, 9, seed=3), 0.0, 0.25, True, -1, -1, 0, 0)),
        "packed rows (transposed), sinks, ALiBi [B, H]": (
            fwd, (r(4, 7, 16).transpose(0, 1), r(2, 9, 16, seed=1).transpose(0, 1), r(2, 9, 16, seed=2).transpose(0, 1),
                  None, 0.0, 0.25, True, -1, -1, 1, 0, 0.0, torch.rand(2, 4), r(4, seed=3), cu_q, cu_k)),
        "bf16, soft cap": (fwd, tuple(t.detach().bfloat16().requires_grad_() for t in (r(1, 4, 6, 16), r(1, 4, 9, 16, seed=1),
                                                                                   r(1, 4, 9, 16, seed=2)))
                           + (None, 0.0, 0.25, False, -1, -1, 0, 0, 3.0)),
        "kv cache: batch index, left pad, Dv != D, RoPE": (
            kv, (r(2, 4, 3, 16, grad=False), r(3, 2, 12, 16, grad=False), r(3, 2, 12, 8, grad=False),
                 r(2, 2, 3, 16, grad=False), r(2, 2, 3, 8, grad=False), seqlens, None, torch.rand(12, 8),
                 torch.rand(12, 8), False, 0.25, True, -1, -1, 0.0, None, None,
                 torch.tensor([2, 0], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32))),
        "kv cache: pages, window, sinks": (
            kv, (r(2, 4, 1, 16, grad=False), r(6, 2, 4, 16, grad=False), r(6, 2, 4, 16, grad=False), None, None,
                 seqlens, torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32), None, None, False, 0.25, True, 3, 0,
                 0.0, None, torch.zeros(4))),
        "merge_states, strided": (ops.merge_states.default,
                                  (r(2, 6, 4, 16, grad=False).transpose(1, 2), r(2, 6, 4, grad=False).transpose(1, 2),
                                   r(2, 4, 6, 16, seed=1, grad=False), r(2, 4, 6, seed=1, grad=False))),
    }


@pytest.mark.parametrize("case", list(_opcheck_cases()))
def test_opcheck_representative_inputs(case):
    """torch.library.opcheck (schema, autograd registration, fake kernels against the real
    outputs' shapes, dtypes and strides, AOT dispatch) over the ops' feature combinations."""
    op, args = _opcheck_cases()[case]
    torch.library.opcheck(op, args)
