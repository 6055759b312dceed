"""Autograd beyond one backward, and torch.func: what is supported gives autograd's answers,
what is not raises an error that says so (never a wrong or silently missing gradient)."""
import pytest
import torch

import tileattn


def qkv(requires_grad=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(11)
    shapes = ((2, 4, 6, 16), (2, 2, 9, 16), (2, 2, 9, 16))
    return [torch.randn(*s, generator=g, dtype=dtype).requires_grad_(requires_grad) for s in shapes]


def test_double_backward_is_refused_by_name():
    q, k, v = qkv()
    o = tileattn.flash_attention(q, k, v, is_causal=True)
    dq, = torch.autograd.grad((o * o).sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="flash_attention: double backward"):
        dq.sum().backward()


def test_merge_states_backward_is_refused_by_name():
    o_a, o_b = (torch.randn(1, 2, 3, 4, requires_grad=True) for _ in range(2))
    lse_a, lse_b = torch.randn(1, 2, 3), torch.randn(1, 2, 3)
    o, _ = tileattn.merge_states(o_a, lse_a, o_b, lse_b)
    with pytest.raises(NotImplementedError, match="merge_states: has no gradient"):
        o.sum().backward()
