"""`out=`: flash_attention and attention_with_kvcache write a given output instead of
allocating one (a decode loop reuses it), with the same result bit for bit; a bad `out` is
refused with an error naming it, before anything is written; with torch, only where autograd,
tracers and torch.compile cannot observe the call."""
import numpy as np
import pytest
import torch

import tileattn


def make(b=2, h=4, hk=2, nq=5, nk=7, d=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*s, generator=g).to(dtype)
                 for s in ((b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d)))


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_flash_attention_writes_out_bit_for_bit(framework, layout):
    q, k, v = make()
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    if framework == "numpy":
        q, k, v = (x.numpy() for x in (q, k, v))
    expected, expected_lse = tileattn.flash_attention(q, k, v, is_causal=True, layout=layout,
                                                      return_lse=True)
    # A strided out: every other element of a wider buffer.
    wide = torch.full(tuple(q.shape[:3]) + (2 * q.shape[3],), float("nan"))
    out = wide[..., ::2] if framework == "torch" else wide.numpy()[..., ::2]
    got, lse = tileattn.flash_attention(q, k, v, is_causal=True, layout=layout, return_lse=True,
                                        out=out)
    assert got is out
    if framework == "torch":
        assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
        assert torch.isnan(wide[..., 1::2]).all()  # the gaps are untouched
    else:
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(lse, expected_lse)
        assert np.isnan(wide.numpy()[..., 1::2]).all()


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_bad_out_is_refused_by_name(framework):
    q, k, v = make()
    conv = (lambda x: x.numpy()) if framework == "numpy" else (lambda x: x)
    q, k, v = conv(q), conv(k), conv(v)
    good = conv(torch.zeros(tuple(q.shape)))
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 4, 5, 16\), got \(2, 4, 5, 8\)"):
        tileattn.flash_attention(q, k, v, out=conv(torch.zeros(2, 4, 5, 8)))
    with pytest.raises(TypeError, match="out: dtype"):
        tileattn.flash_attention(q, k, v, out=conv(torch.zeros(tuple(q.shape), dtype=torch.float16)))
    other = good.numpy() if framework == "torch" else torch.from_numpy(good)
    with pytest.raises(TypeError, match="out: must be a"):
        tileattn.flash_attention(q, k, v, out=other)
    # The library's checks call the output "o"; the caller passed `out`.
    with pytest.raises(ValueError, match="^out: output overlaps input q$"):
        tileattn.flash_attention(q, k, v, out=q)

    assert not good.any()


def test_torch_out_only_where_torch_cannot_observe_the_call():
    q, k, v = make()
    q.requires_grad_(True)
    out = torch.zeros(tuple(q.shape))
    with pytest.raises(ValueError, match="out: not supported when torch can observe the call"):
        tileattn.flash_attention(q, k, v, out=out)
    assert not out.any()
    with pytest.raises(ValueError, match="out: not supported"):
        tileattn.flash_attention(q.detach(), k, v, dropout_p=0.5, out=out)
    with torch.no_grad():
        got = tileattn.flash_attention(q, k, v, out=out)
    assert got is out and torch.equal(out, tileattn.flash_attention(q.detach(), k, v))


def as_numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else x


def kv_setup(framework, paged):
    g = torch.Generator().manual_seed(1)
    b, h, hk, d, cap = 2, 4, 2, 16, 32
    q = torch.randn(b, h, 1, d, generator=g)
    k_new, v_new = torch.randn(b, hk, 1, d, generator=g), torch.randn(b, hk, 1, d, generator=g)
    if paged:
        k_cache, v_cache = torch.randn(8, hk, 8, d, generator=g), torch.randn(8, hk, 8, d, generator=g)
        table = torch.tensor([[3, 1, 6, 0], [2, 7, 5, 4]], dtype=torch.int32)
    else:
        k_cache, v_cache = torch.randn(b, hk, cap, d, generator=g), torch.randn(b, hk, cap, d, generator=g)
        table = None
    arrays = [q, k_cache, v_cache, k_new, v_new, table]
    if framework == "numpy":
        arrays = [None if x is None else x.numpy() for x in arrays]
    return arrays


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_writes_out_bit_for_bit_and_appends_the_same(framework, paged):
    runs = []
    for use_out in (False, True):
        q, kc, vc, kn, vn, table = kv_setup(framework, paged)
        out = None
        if use_out:
            out = torch.full(tuple(q.shape), float("nan"))
            out = out.numpy() if framework == "numpy" else out
        lengths = np.array([11, 17]) if framework == "numpy" else torch.tensor([11, 17])
        o = tileattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lengths, block_table=table,
                                            out=out)
        if use_out:
            assert o is out
        runs.append(tuple(as_numpy(x).copy() for x in (o, kc, vc)))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_kvcache_bad_out_leaves_the_cache_unchanged(framework):
    q, kc, vc, kn, vn, _ = kv_setup(framework, False)
    before = (as_numpy(kc).copy(), as_numpy(vc).copy())
    lengths = np.array([11, 17]) if framework == "numpy" else torch.tensor([11, 17])
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 4, 1, 16\)"):
        tileattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lengths, out=kc[:, :, :1])
    # An out inside the cache itself (the first 128 elements of k_cache, then of v_cache), or
    # over the new keys / values: named as the caller named them.
    for cache, name in ((kc, "k_cache"), (vc, "v_cache")):
        view = cache.reshape(-1)[: 2 * 4 * 16].reshape(2, 4, 1, 16)
        with pytest.raises(ValueError, match=f"^out: output overlaps input {name}$"):
            tileattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lengths, out=view)
    for name in ("k", "v"):
        shared = np.zeros(2 * 4 * 16, np.float32)
        if framework == "torch":
            shared = torch.from_numpy(shared)
        new = shared[: 2 * 2 * 16].reshape(2, 2, 1, 16)
        new[...] = kn if name == "k" else vn
        args = (new, vn) if name == "k" else (kn, new)
        with pytest.raises(ValueError, match=f"^out: output overlaps input {name}$"):
            tileattn.attention_with_kvcache(q, kc, vc, *args, cache_seqlens=lengths,
                                            out=shared.reshape(2, 4, 1, 16))
    np.testing.assert_array_equal(as_numpy(kc), before[0])
    np.testing.assert_array_equal(as_numpy(vc), before[1])
    if framework == "torch":
        q.requires_grad_(True)
        with pytest.raises(ValueError, match="out: not supported"):
            tileattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lengths,
                                            out=torch.zeros(2, 4, 1, 16))
        np.testing.assert_array_equal(kc.numpy(), before[0])


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_views_of_one_buffer_that_share_no_element_are_accepted(framework):
    """q, k, v and out of one [B, N, 4, H, D] array (a fused QKV projection with its output
    beside it), and an int8 cache's k_scale / v_scale interleaved as [B, Hkv, cap, 2]: no element
    is shared, so they are accepted and give the separate arrays' result bit for bit; an out on
    top of k is refused."""
    g = torch.Generator().manual_seed(3)
    b, n, h, d = 2, 9, 3, 16
    buf = torch.randn(b, n, 4, h, d, generator=g)
    buf[:, :, 3] = float("nan")
    if framework == "numpy":
        buf = buf.numpy()
    q, k, v, out = (buf[:, :, i] for i in range(4))
    copies = [x.copy() if framework == "numpy" else x.clone() for x in (q, k, v)]
    want = tileattn.flash_attention(*copies, is_causal=True, layout="bshd")
    got = tileattn.flash_attention(q, k, v, is_causal=True, layout="bshd", out=out)
    assert got is out
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    with pytest.raises(ValueError, match="out: output overlaps input k"):
        tileattn.flash_attention(q, k, v, layout="bshd", out=k)

    rng = np.random.default_rng(4)
    hk, cap, nk = 2, 32, 20
    kn = rng.standard_normal((b, hk, nk, d)).astype(np.float32)
    vn = rng.standard_normal((b, hk, nk, d)).astype(np.float32)
    qd = rng.standard_normal((b, 4, 1, d)).astype(np.float32)
    results = []
    for fused in (True, False):
        kc, vc = np.zeros((b, hk, cap, d), np.int8), np.zeros((b, hk, cap, d), np.int8)
        scales = np.zeros((b, hk, cap, 2), np.float32)
        ks, vs = (scales[..., 0], scales[..., 1]) if fused else (scales[..., 0].copy(), scales[..., 1].copy())
        if framework == "torch":
            kc, vc, ks, vs = (torch.from_numpy(x) for x in (kc, vc, ks, vs))
        results.append(np.asarray(tileattn.attention_with_kvcache(
            qd if framework == "numpy" else torch.from_numpy(qd), kc, vc,
            kn if framework == "numpy" else torch.from_numpy(kn),
            vn if framework == "numpy" else torch.from_numpy(vn),
            cache_seqlens=0, k_scale=ks, v_scale=vs)))
    np.testing.assert_array_equal(results[0], results[1])


def to_dtype(x, dtype):
    """A torch tensor in dtype, or (numpy) the float16 array; numpy has no bfloat16."""
    return x.to(dtype) if isinstance(x, torch.Tensor) else x.astype(np.float16)


@pytest.mark.parametrize("framework, dtype", [("numpy", torch.float16), ("torch", torch.float16),
                                              ("torch", torch.bfloat16)])  # numpy has no bfloat16
def test_float32_out_for_16_bit_inputs(framework, dtype):
    """A float32 `out` for fp16/bf16 inputs gets O before its rounding to 16 bits (the C++
    fp32_output): rounded, it is the ordinary result bit for bit; the LSE is the same; against
    float64 it is closer than the 16-bit output."""
    q, k, v = make(nq=37, nk=300, d=64)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    if framework == "numpy":
        q, k, v = (x.numpy() for x in (q, k, v))
    expected, expected_lse = tileattn.flash_attention(q, k, v, return_lse=True)
    out = torch.full(tuple(q.shape), float("nan"))
    out = out.numpy() if framework == "numpy" else out
    got, lse = tileattn.flash_attention(q, k, v, return_lse=True, out=out)
    assert got is out
    wide = lambda x: torch.as_tensor(x).double()  # noqa: E731 (numpy float16 or torch, exactly)
    assert torch.equal(wide(to_dtype(out, dtype)), wide(expected))
    assert torch.equal(wide(lse), wide(expected_lse))
    q64, k64, v64 = (wide(x) for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q64, k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1))
    err32 = (wide(out) - ref).abs().max().item()
    err16 = (wide(expected) - ref).abs().max().item()
    assert err32 < err16 / 20, (err32, err16)
    with pytest.raises(TypeError, match="expected q's .* or float32"):
        tileattn.flash_attention(q, k, v, out=out.astype(np.float64) if framework == "numpy" else out.double())


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_float32_out_for_a_bf16_cache(paged):
    runs = []
    for wide in (False, True):
        q, kc, vc, kn, vn, table = kv_setup("torch", paged)
        q, kc, vc, kn, vn = (x.to(torch.bfloat16) for x in (q, kc, vc, kn, vn))
        out = torch.full(tuple(q.shape), float("nan")) if wide else None
        o = tileattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=torch.tensor([11, 17]),
                                            block_table=table, out=out)
        assert o.dtype == (torch.float32 if wide else torch.bfloat16)
        runs.append((o.to(torch.bfloat16), kc, vc))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
