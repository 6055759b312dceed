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


@pytest.mark.parametrize("batch", [1, 2])
def test_jacrev_equals_autograds_jacobian(batch):
    """torch.func.jacrev (vmap over the backward with o unbatched) equals autograd's jacobian,
    one backward per output element (with batch 1 the folded o was a stride-0 view, which the
    C++ backward refused: "o: output strides must be positive")."""
    import torch.func as tf
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(batch, 2, n, 8, generator=g) for n in (3, 4, 4))

    for argnum in range(3):
        def attend(*args):
            full = [q, k, v]
            full[argnum] = args[0]
            return tileattn.flash_attention(*full, is_causal=True)

        x = (q, k, v)[argnum]
        want = torch.autograd.functional.jacobian(attend, x)
        close([tf.jacrev(attend)(x)], [want])


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


def _per_entry(fn, args, in_dims):
    n = next(a.shape[d] for a, d in zip(args, in_dims) if d is not None)
    pick = lambda a, d, i: a if d is None else a.select(d, i)  # noqa: E731
    results = [fn(*[pick(a, d, i) for a, d in zip(args, in_dims)]) for i in range(n)]
    if isinstance(results[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*results))
    return torch.stack(results)


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


VMAP_CASES = {
    # name: (function of the vmapped arguments, arguments, in_dims)
    "gqa causal, all batched": (lambda q, k, v: tileattn.flash_attention(q, k, v, is_causal=True),
                                (_r(3, 2, 4, 5, 16), _r(3, 2, 2, 7, 16, seed=1), _r(3, 2, 2, 7, 16, seed=2)), (0, 0, 0)),
    "bshd with lse, q batched at dim 2, Dv != D": (
        lambda q, k, v: tileattn.flash_attention(q, k, v, layout="bshd", return_lse=True),
        (_r(2, 5, 3, 4, 16), _r(2, 7, 2, 16, seed=1), _r(2, 7, 2, 8, seed=2)), (2, None, None)),
    "batched [Nq, Nk] mask and [B, H] slopes": (
        lambda q, k, v, m, a: tileattn.flash_attention(q, k, v, attn_mask=m, alibi_slopes=a),
        (_r(3, 2, 4, 5, 16), _r(2, 2, 7, 16, seed=1), _r(2, 2, 7, 16, seed=2), _r(5, 7, 3, seed=3),
         _r(3, 2, 4, seed=4).abs()), (0, None, None, 2, 0)),
    "batched sinks, packed rows (one call per entry)": (
        lambda q, k, v, s: tileattn.flash_attention(q, k, v, sinks=s, cu_seqlens_q=torch.tensor([0, 3, 7]),
                                                    cu_seqlens_k=torch.tensor([0, 3, 7])),
        (_r(3, 7, 4, 16), _r(3, 7, 2, 16, seed=1), _r(3, 7, 2, 16, seed=2), _r(3, 4, seed=3)), (0, 0, 0, 0)),
    "merge_states, o_b and lse_b unbatched": (
        tileattn.merge_states, (_r(3, 2, 4, 5, 16), _r(3, 2, 4, 5, seed=1), _r(2, 4, 5, 16, seed=2),
                                _r(2, 4, 5, seed=3)), (0, 0, None, None)),
    "merge_states at dim 1": (
        tileattn.merge_states, (_r(2, 3, 4, 5, 16), _r(2, 3, 4, 5, seed=1), _r(2, 3, 4, 5, 16, seed=2),
                                _r(2, 3, 4, 5, seed=3)), (1, 1, 1, 1)),
    "sdpa drop-in": (lambda q, k, v: tileattn.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                     (_r(3, 2, 4, 5, 16), _r(3, 2, 2, 7, 16, seed=1), _r(3, 2, 2, 7, 16, seed=2)), (0, 0, 0)),
}


@pytest.mark.parametrize("case", list(VMAP_CASES))
def test_vmap_rule_equals_one_call_per_entry(case):
    """The ops' vmap rules (the vmapped dim folded into the batch, or one call per entry) give
    what one call per entry gives, without torch's fallback warning ("performance drop ...
    Please file us an issue")."""
    import warnings

    import torch.func as tf
    fn, args, in_dims = VMAP_CASES[case]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*performance drop.*")
        got = tf.vmap(fn, in_dims=in_dims)(*args)
    want = _per_entry(fn, args, in_dims)
    close(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,))


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


def test_vmap_dropout_follows_vmaps_randomness_flag():
    """randomness="same": every entry the same pattern; "different": its own (the seed's .item()
    failed under a batched seed); the backward replays each entry's pattern (o is linear in v,
    so sum(o * g) == sum(v * dv))."""
    import torch.func as tf
    q, k, v = (_r(1, 2, 6, 16, seed=i).expand(3, 1, 2, 6, 16) for i in range(3))
    g = _r(3, 1, 2, 6, 16, seed=5)

    def attend(q, k, v):
        return tileattn.flash_attention(q, k, v, dropout_p=0.5)

    def loss(q, k, v, g):
        return (attend(q, k, v) * g).sum()

    same = tf.vmap(attend, randomness="same")(q, k, v)
    assert torch.equal(same[0], same[1]) and torch.equal(same[1], same[2])
    different = tf.vmap(attend, randomness="different")(q, k, v)
    assert not torch.equal(different[0], different[1])
    for randomness in ("same", "different"):
        torch.manual_seed(7)
        o = tf.vmap(attend, randomness=randomness)(q, k, v)
        torch.manual_seed(7)
        dv = tf.vmap(tf.grad(loss, argnums=2), randomness=randomness)(q, k, v, g)
        torch.testing.assert_close((v * dv).sum((1, 2, 3, 4)), (o * g).sum((1, 2, 3, 4)), atol=1e-4, rtol=1e-5)
