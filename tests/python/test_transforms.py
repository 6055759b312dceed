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


def close(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_func_grad_equals_autograd():
    """torch.func.grad (and vjp) through flash_attention and the drop-ins give autograd's
    gradients (torch.func.grad raised torch's "must override the setup_context" error)."""
    import torch.func as tf
    q, k, v = qkv(requires_grad=False)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(3))

    def loss(q, k, v, sinks):
        o, lse = tileattn.flash_attention(q, k, v, is_causal=True, sinks=sinks, return_lse=True)
        return (o * o).sum() + lse.sum()

    got = tf.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, sinks)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    loss(*leaves).backward()
    close(got, [t.grad for t in leaves])

    def sdpa(q):
        return tileattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    _, pullback = tf.vjp(sdpa, q)
    g = torch.randn(2, 4, 6, 16, generator=torch.Generator().manual_seed(4))
    leaf = q.clone().requires_grad_()
    sdpa(leaf).backward(g)
    close(pullback(g), [leaf.grad])


def test_vmap_and_per_sample_grads_equal_a_loop():
    """torch.func.vmap over an extra leading dim, and vmap(grad) (per-sample gradients), equal
    one call per entry (vmap failed: "Cannot access data pointer of Tensor that doesn't have
    storage", from the direct C++ call reading vmap's wrapper tensors)."""
    import torch.func as tf
    q, k, v = qkv(requires_grad=False)

    def attend(q, k, v):  # one entry: [H, N, D]
        return tileattn.flash_attention(q[None], k[None], v[None], is_causal=True)[0]

    close([tf.vmap(attend)(q, k, v)], [torch.stack([attend(q[i], k[i], v[i]) for i in range(2)])])
    sdpa = lambda q, k, v: tileattn.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    close([tf.vmap(sdpa)(q, k, v)], [sdpa(q, k, v)])

    def loss(q, k, v):
        return (attend(q, k, v) ** 2).sum()

    per_sample = tf.vmap(tf.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for i in range(2):
        leaves = [t[i].clone().requires_grad_() for t in (q, k, v)]
        loss(*leaves).backward()
        close([g[i] for g in per_sample], [t.grad for t in leaves])


def test_forward_mode_ad_is_refused_by_name():
    """Forward-mode AD has no rule here: it must raise, never return a zero or missing tangent
    (torch.func.jvp gave zeros and forward_ad.unpack_dual(o).tangent None, silently)."""
    import torch.autograd.forward_ad as fwAD
    import torch.func as tf
    q, k, v = qkv(requires_grad=False)
    with pytest.raises(NotImplementedError, match="flash_attention: forward-mode AD"):
        tf.jvp(lambda q: tileattn.flash_attention(q, k, v), (q,), (torch.ones_like(q),))
    with fwAD.dual_level():
        dual = fwAD.make_dual(q, torch.ones_like(q))
        with pytest.raises(NotImplementedError, match="flash_attention: forward-mode AD"):
            tileattn.flash_attention(dual, k, v)
        kc, vc = k.clone(), v.clone()
        with pytest.raises(NotImplementedError, match="attention_with_kvcache: forward-mode AD"):
            tileattn.attention_with_kvcache(dual[:, :, :1], kc, vc, cache_seqlens=5)
        lse = torch.zeros(2, 4, 6)
        with pytest.raises(NotImplementedError, match="merge_states: forward-mode AD"):
            tileattn.merge_states(dual, lse, q, lse)
        # A dual level without a dual input is no forward AD: the call runs.
        torch.testing.assert_close(tileattn.flash_attention(q, k, v), tileattn.flash_attention(q, k, v))
    with pytest.raises(NotImplementedError, match="flash_attention: forward-mode AD"):
        tf.hessian(lambda q: tileattn.flash_attention(q, k, v).sum())(q)


def test_func_transforms_refuse_what_has_no_gradient():
    import torch.func as tf
    q, k, v = qkv(requires_grad=False)
    with pytest.raises(NotImplementedError, match="attention_with_kvcache: has no gradient"):
        tf.grad(lambda q: tileattn.attention_with_kvcache(q, k.clone(), v.clone(), cache_seqlens=5).sum())(q[:, :, :1])
    lse = torch.zeros(2, 4, 6)
    with pytest.raises(NotImplementedError, match="merge_states: has no gradient"):
        tf.grad(lambda o: tileattn.merge_states(o, lse, q, lse)[0].sum())(q)
    inner = tf.grad(lambda q: tileattn.flash_attention(q, k, v).pow(2).sum())
    with pytest.raises(NotImplementedError, match="flash_attention: double backward"):
        tf.grad(lambda q: inner(q).sum())(q)


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_vmap_grad_with_unbatched_operands_and_a_mask_gradient():
    """Per-sample gradients where only q is vmapped, through lse and a float mask's gradient (the
    PyTorch-math backward added batched blocks in place into unbatched buffers: "output with
    shape [...] doesn't match the broadcast shape")."""
    import torch.func as tf
    q, k, v, m = _r(3, 2, 4, 5, 16), _r(2, 2, 7, 16, seed=1), _r(2, 2, 7, 16, seed=2), _r(5, 7, seed=3)

    def loss(q, k, v, m):
        o, lse = tileattn.flash_attention(q, k, v, attn_mask=m, return_lse=True)
        return (o * o).sum() + lse.sum()

    got = tf.vmap(tf.grad(loss, argnums=(0, 1, 2, 3)), in_dims=(0, None, None, None))(q, k, v, m)
    for i in range(3):
        leaves = [t.clone().requires_grad_() for t in (q[i], k, v, m)]
        loss(*leaves).backward()
        close([g[i] for g in got], [t.grad for t in leaves])

