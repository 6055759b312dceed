"""merge_states and attention_with_kvcache (contiguous and paged caches, RoPE), NumPy and torch."""
import numpy as np
import pytest
import torch

import tileattn
from tileattn._module import apply_rope, rope_tables
from reference import check_close


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_merge_of_two_key_halves_is_attention_over_all(rng, framework):
    q, k, v = rand(rng, 2, 4, 7, 32), rand(rng, 2, 2, 20, 32), rand(rng, 2, 2, 20, 32)
    conv = (lambda x: x) if framework == "numpy" else torch.from_numpy
    q, k, v = conv(q), conv(k), conv(v)
    o_a, l_a = tileattn.flash_attention(q, k[:, :, :8], v[:, :, :8], return_lse=True)
    o_b, l_b = tileattn.flash_attention(q, k[:, :, 8:], v[:, :, 8:], return_lse=True)
    o, lse = tileattn.merge_states(o_a, l_a, o_b, l_b)
    whole, whole_lse = tileattn.flash_attention(q, k, v, return_lse=True)
    np.testing.assert_allclose(np.asarray(o), np.asarray(whole), atol=2e-6)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(whole_lse), atol=2e-6)
    assert type(o) is type(q)


def test_merge_with_empty_side_returns_other_side(rng):
    o_a, o_b = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 3, 8)
    l_a = rand(rng, 1, 2, 3)
    l_b = np.full((1, 2, 3), -np.inf, np.float32)
    o, lse = tileattn.merge_states(o_a, l_a, o_b, l_b)
    np.testing.assert_array_equal(o, o_a)
    np.testing.assert_array_equal(lse, l_a)


def test_kvcache_append_then_attend_equals_flash_attention(rng):
    b, h, hk, d, cap = 2, 4, 2, 32, 24
    kc, vc = np.zeros((b, hk, cap, d), np.float32), np.zeros((b, hk, cap, d), np.float32)
    k_all, v_all, q_all = rand(rng, b, hk, 13, d), rand(rng, b, hk, 13, d), rand(rng, b, h, 13, d)
    seqlens = np.zeros(b, np.int32)
    o = tileattn.attention_with_kvcache(q_all[:, :, :10], kc, vc, k_all[:, :, :10], v_all[:, :, :10],
                                        cache_seqlens=seqlens)
    assert np.all(seqlens == 0)  # the caller's lengths are not modified (FlashAttention-2)
    check_close(o, q_all[:, :, :10], k_all[:, :, :10], v_all[:, :, :10], "float32", causal=True)
    for t in range(10, 13):
        o, lse = tileattn.attention_with_kvcache(q_all[:, :, t:t + 1], kc, vc, k_all[:, :, t:t + 1],
                                                 v_all[:, :, t:t + 1], cache_seqlens=t, return_lse=True)
        check_close(o, q_all[:, :, t:t + 1], k_all[:, :, :t + 1], v_all[:, :, :t + 1], "float32",
                    got_lse=lse, causal=True)
    np.testing.assert_array_equal(kc[:, :, :13], k_all)
    assert np.all(kc[:, :, 13:] == 0)


def test_paged_cache_equals_contiguous(rng):
    b, h, hk, d, page = 2, 4, 2, 16, 4
    q, k, v = rand(rng, b, h, 3, d), rand(rng, b, hk, 11, d), rand(rng, b, hk, 11, d)
    pages_k, pages_v = np.zeros((8, hk, page, d), np.float32), np.zeros((8, hk, page, d), np.float32)
    table = np.array([[5, 0, 7], [2, 6, 1]], np.int32)  # pages in any order
    o = tileattn.attention_with_kvcache(q, pages_k, pages_v, k, v, cache_seqlens=np.zeros(b, np.int64),
                                        block_table=table)
    check_close(o, q, k, v, "float32", causal=True)
    np.testing.assert_array_equal(pages_k[0, :, :, :], k[0, :, 4:8])  # table[0][1] = page 0 holds tokens 4..7


def test_rotary_in_the_kernel_equals_rotating_first():
    g = torch.Generator().manual_seed(4)
    b, h, hk, d, cap = 1, 4, 2, 32, 16
    q, k, v = torch.randn(b, h, 6, d, generator=g), torch.randn(b, hk, 6, d, generator=g), torch.randn(b, hk, 6, d, generator=g)
    cos, sin = rope_tables(10000.0, cap, d)
    kc, vc = torch.zeros(b, hk, cap, d), torch.zeros(b, hk, cap, d)
    o = tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=torch.tensor([0], dtype=torch.int32),
                                        rotary_cos=cos, rotary_sin=sin)
    qr, kr = apply_rope(q, cos[:6], sin[:6]), apply_rope(k, cos[:6], sin[:6])
    torch.testing.assert_close(kc[:, :, :6], kr, atol=1e-6, rtol=0)
    torch.testing.assert_close(o, tileattn.flash_attention(qr, kr, v, is_causal=True), atol=2e-6, rtol=0)


def test_kvcache_errors_leave_the_cache_unchanged(rng):
    kc, vc = np.zeros((1, 2, 4, 8), np.float32), np.zeros((1, 2, 4, 8), np.float32)
    q, k, v = rand(rng, 1, 2, 1, 8), rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 2, 8)
    # 3 + 2 > capacity 4: the message names the Python argument k (the C++ field is k_new).
    with pytest.raises(ValueError, match=r"^k: appending 2 tokens") as overflow:
        tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=3)
    assert "k_new" not in str(overflow.value)
    assert np.all(kc == 0)
    with pytest.raises(ValueError, match=r"^k: appending 2 tokens"):
        tileattn.attention_with_kvcache(torch.from_numpy(q), torch.from_numpy(kc), torch.from_numpy(vc),
                                        torch.from_numpy(k), torch.from_numpy(v), cache_seqlens=3)
    with pytest.raises(ValueError, match="cache_seqlens"):
        tileattn.attention_with_kvcache(q, kc, vc, k, v)
    with pytest.raises(ValueError, match="k, v"):
        tileattn.attention_with_kvcache(q, kc, vc, k)
    with pytest.raises(TypeError, match="k_cache: dtype"):
        tileattn.attention_with_kvcache(q, kc.astype(np.float16), vc.astype(np.float16))
    with pytest.raises(ValueError, match="rotary_cos, rotary_sin"):
        tileattn.attention_with_kvcache(q, kc, vc, rotary_cos=np.zeros((4, 4), np.float32))


def decode_case(framework):
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 1, 8, generator=g)
    kc, vc = torch.randn(2, 2, 10, 8, generator=g), torch.randn(2, 2, 10, 8, generator=g)
    k, v = torch.randn(2, 2, 1, 8, generator=g), torch.randn(2, 2, 1, 8, generator=g)
    arrays = (q, kc, vc, k, v)
    return arrays if framework == "torch" else tuple(x.numpy() for x in arrays)


def as_framework(framework, x):
    return torch.from_numpy(x) if framework == "torch" else x


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_kvcache_lengths_as_int_scalar_or_any_integer_array(framework):
    """One C++ call reads the cache lengths (an int, a NumPy integer, or an integer array of
    any width, converted to a private int32 copy) and never changes the caller's."""
    q, kc, vc, k, v = decode_case(framework)
    expected = tileattn.attention_with_kvcache(q, kc.copy() if framework == "numpy" else kc.clone(),
                                               vc, k, v, cache_seqlens=as_framework(framework, np.array([4, 4], np.int32)))
    for lengths in (4, np.int64(4), np.array([4, 4], np.int64), np.array([4, 4], np.int16),
                    np.array([4, 9, 4])[::2], np.array([4, 4], np.uint8)):
        if isinstance(lengths, np.ndarray):
            lengths = as_framework(framework, lengths)
        before = lengths.copy() if isinstance(lengths, np.ndarray) else lengths
        got = tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lengths)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
        if isinstance(lengths, np.ndarray):
            np.testing.assert_array_equal(lengths, before)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_kvcache_argument_errors_name_the_argument(framework):
    q, kc, vc, k, v = decode_case(framework)
    t = lambda x: as_framework(framework, x)  # noqa: E731
    cases = [
        (dict(cache_seqlens=True), TypeError, "cache_seqlens: expected an int or an integer array"),
        (dict(cache_seqlens=t(np.array([1.0, 2.0]))), TypeError, "cache_seqlens: expected an int or an integer array"),
        (dict(cache_seqlens=t(np.array([1, 2, 3]))), ValueError, r"cache_seqlens: expected shape \[B\] = \(2,\)"),
        (dict(cache_seqlens=-1), ValueError, r"cache_seqlens: entries must be in 0 .. 2\^31 - 1"),
        (dict(cache_seqlens=[1, 2]), TypeError, "cache_seqlens: expected a numpy.ndarray or torch.Tensor, got list"),
        (dict(cache_seqlens=1, rotary_cos=t(np.zeros((10, 2), np.int32)), rotary_sin=t(np.zeros((10, 2), np.int32))),
         TypeError, "rotary_cos: expected a float"),
        (dict(cache_seqlens=1, rotary_cos=t(np.zeros((10, 2), np.float32)), rotary_sin=t(np.zeros((10, 3), np.float32))),
         ValueError, r"rotary_sin: shape \(10, 3\) must equal rotary_cos's \(10, 2\)"),
        (dict(cache_seqlens=1, rotary_cos=t(np.zeros(10, np.float32)), rotary_sin=t(np.zeros(10, np.float32))),
         ValueError, r"rotary_cos: expected \[positions, rotary_dim / 2\]"),
        (dict(cache_seqlens=1, block_table=t(np.zeros((2, 3), np.float32))), TypeError, "block_table: expected an integer"),
        (dict(cache_seqlens=1, block_table=t(np.zeros((3, 3), np.int32))), ValueError,
         r"block_table: expected shape \[B, max_pages\] with B = 2"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            tileattn.attention_with_kvcache(q, kc, vc, k, v, **kwargs)
    other = (lambda x: x.numpy()) if framework == "torch" else torch.from_numpy
    with pytest.raises(TypeError, match=f"k_cache: must be a {framework} array like q"):
        tileattn.attention_with_kvcache(q, other(kc), vc, k, v, cache_seqlens=1)
    with pytest.raises(ValueError, match=r"k: expected a 4-D array \[B, Hkv, Nnew, D\]"):
        tileattn.attention_with_kvcache(q, kc, vc, k[0], v[0], cache_seqlens=1)
    with pytest.raises(ValueError, match=r"v_cache: shape \(2, 2, 9, 8\) must equal k_cache's"):
        tileattn.attention_with_kvcache(q, kc, vc[:, :, :9], k, v, cache_seqlens=1)
    with pytest.raises(ValueError, match="k_cache: 3 heads must divide q's 4 heads"):
        tileattn.attention_with_kvcache(q, kc[:, :1].repeat(1, 3, 1, 1) if framework == "torch"
                                        else np.repeat(kc[:, :1], 3, axis=1),
                                        vc[:, :1].repeat(1, 3, 1, 1) if framework == "torch"
                                        else np.repeat(vc[:, :1], 3, axis=1), cache_seqlens=1)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_kvcache_converts_block_tables_and_rotary_tables_of_other_types(framework):
    """An int64 or strided block table and float64 rotary tables are converted (one small
    copy each) and give the results of the int32 / float32 ones."""
    q, _, _, k, v = decode_case(framework)
    pages = np.random.default_rng(7).standard_normal((6, 2, 4, 8)).astype(np.float32)
    table = np.array([[3, 0, 5], [1, 4, 2]], np.int32)
    cos, sin = rope_tables(10000.0, 12, 8)
    cos, sin = np.asarray(cos, np.float32), np.asarray(sin, np.float32)

    def run(table, cos, sin):
        kp, vp = as_framework(framework, pages.copy()), as_framework(framework, pages[::-1].copy())
        o = tileattn.attention_with_kvcache(q, kp, vp, k, v, cache_seqlens=np.array([5, 2]) if framework == "numpy"
                                            else torch.tensor([5, 2]), block_table=as_framework(framework, table),
                                            rotary_cos=as_framework(framework, cos),
                                            rotary_sin=as_framework(framework, sin))
        return np.asarray(o), np.asarray(kp)

    expected_o, expected_pages = run(table, cos, sin)
    strided = np.zeros((2, 6), np.int32)[:, ::2]
    strided[...] = table
    for args in ((table.astype(np.int64), cos, sin), (strided, cos, sin),
                 (table, cos.astype(np.float64), sin.astype(np.float64))):
        got_o, got_pages = run(*args)
        np.testing.assert_array_equal(got_o, expected_o)
        np.testing.assert_array_equal(got_pages, expected_pages)


def test_kvcache_large_batch_lengths(rng):
    """More sequences than the binding keeps on its stack (64): the lengths go to the heap."""
    b, hk, cap, d = 70, 1, 4, 8
    q, k, v = rand(rng, b, 2, 1, d), rand(rng, b, hk, 1, d), rand(rng, b, hk, 1, d)
    kc, vc = rand(rng, b, hk, cap, d), rand(rng, b, hk, cap, d)
    lengths = rng.integers(0, cap, b)
    kc1, vc1 = kc.copy(), vc.copy()
    o = tileattn.attention_with_kvcache(q, kc1, vc1, k, v, cache_seqlens=lengths)
    for i in (0, 63, 64, 69):
        kc2, vc2 = kc[i:i + 1].copy(), vc[i:i + 1].copy()
        o_i = tileattn.attention_with_kvcache(q[i:i + 1], kc2, vc2, k[i:i + 1], v[i:i + 1],
                                              cache_seqlens=int(lengths[i]))
        np.testing.assert_array_equal(o[i:i + 1], o_i)
        np.testing.assert_array_equal(kc1[i:i + 1], kc2)


def test_kvcache_refuses_a_read_only_cache_when_appending(rng):
    """Appending writes the cache, so a read-only one (writeable=False, or a read-only view such
    as np.broadcast_to) is refused by name before anything is written; attending alone only
    reads it."""
    q, k, v = rand(rng, 1, 2, 1, 8), rand(rng, 1, 2, 1, 8), rand(rng, 1, 2, 1, 8)
    kc, vc = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    kc.flags.writeable = False
    with pytest.raises(ValueError, match="k_cache: array is read-only"):
        tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=1)
    vc.flags.writeable = False
    with pytest.raises(ValueError, match="k_cache: array is read-only"):
        tileattn.attention_with_kvcache(q, kc, vc.copy(), k, v, cache_seqlens=1)
    with pytest.raises(ValueError, match="v_cache: array is read-only"):
        tileattn.attention_with_kvcache(q, kc.copy(), vc, k, v, cache_seqlens=1)
    row = np.zeros(8, np.float32)
    view = np.broadcast_to(row, (1, 2, 4, 8))
    with pytest.raises(ValueError, match="k_cache: array is read-only"):
        tileattn.attention_with_kvcache(q, view, vc.copy(), k, v, cache_seqlens=1)
    assert not row.any()
    o = tileattn.attention_with_kvcache(q, kc, vc, cache_seqlens=3)  # attend only: reads
    check_close(o, q, kc[:, :, :3], vc[:, :, :3], "float32", causal=True)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_kvcache_block_table_entries_must_fit_int32(framework):
    """A wider block table is narrowed to the kernel's int32 only after its entries are checked:
    2^32 + 3 must not become page 3. The same on the direct path and the torch op's."""
    q, _, _, k, v = decode_case(framework)
    conv = (lambda x: x) if framework == "numpy" else torch.from_numpy
    pages = conv(np.zeros((6, 2, 4, 8), np.float32))
    v_pages = conv(np.zeros((6, 2, 4, 8), np.float32))
    lengths = conv(np.array([0, 0]))
    for table in (np.array([[2**32 + 3, 0], [1, 2]]), np.array([[3, 0], [1, -2**32 + 2]]),
                  np.array([[2**32 + 3, 0], [1, 2]], np.uint64), np.array([[3, 0], [2**31, 2]], np.uint32)):
        with pytest.raises(ValueError, match=r"block_table\[\d, \d\] = -?\d+ does not fit in int32"):
            tileattn.attention_with_kvcache(q, pages, v_pages, k, v, cache_seqlens=lengths,
                                            block_table=conv(table))
        if framework == "torch" and table.dtype == np.int64:
            from tileattn import _torch_ops
            with pytest.raises(ValueError, match=r"block_table\[\d, \d\] = -?\d+ does not fit in int32"):
                _torch_ops.attention_with_kvcache(q, pages, v_pages, k, v, lengths, torch.from_numpy(table),
                                                  None, None, False, None, True, -1, -1)
    assert not np.asarray(pages).any()
    with pytest.raises(ValueError, match=r"cache_seqlens: entries must be in 0 .. 2\^31 - 1"):
        tileattn.attention_with_kvcache(q, pages, v_pages, k, v, cache_seqlens=2**70,
                                        block_table=conv(np.array([[3, 0], [1, 2]])))


def test_kvcache_inference_tensor_cache_is_written_only_in_inference_mode():
    """torch refuses in-place updates of inference tensors outside inference mode; so does
    the append, on the direct path and the op's. Inside inference mode, and when only
    attending, such a cache works."""
    from tileattn import _torch_ops
    q, kc, vc, k, v = decode_case("torch")
    with torch.inference_mode():
        kc_i, vc_i = kc.clone(), vc.clone()
    for cache, name in ((kc_i, "k_cache"), (vc_i, "v_cache")):
        caches = (cache, vc.clone()) if name == "k_cache" else (kc.clone(), cache)
        with pytest.raises(ValueError, match=f"{name}: is an inference tensor"):
            tileattn.attention_with_kvcache(q, *caches, k, v, cache_seqlens=2)
        with pytest.raises(ValueError, match=f"{name}: is an inference tensor"):
            _torch_ops.attention_with_kvcache(q, *caches, k, v, 2, None, None, None, False, None, True, -1, -1)
    assert torch.equal(kc_i, kc) and torch.equal(vc_i, vc)
    tileattn.attention_with_kvcache(q, kc_i, vc_i, cache_seqlens=2)  # attend only: reads
    expected = tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=2)
    with torch.inference_mode():
        got = tileattn.attention_with_kvcache(q, kc_i, vc_i, k, v, cache_seqlens=2)
    assert torch.equal(got, expected) and torch.equal(kc_i, kc)


def test_kvcache_negative_bit_tensors_are_refused_by_name():
    """A tensor with the negative bit set stores the negation of its values; read (or written)
    as memory it would give silently wrong results."""
    q, kc, vc, k, v = decode_case("torch")
    neg = lambda x: torch.complex(torch.zeros_like(x), -x).conj().imag  # noqa: E731  values x, bit set
    cos, sin = rope_tables(10000.0, 10, 8)
    args = dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v, rotary_cos=cos, rotary_sin=sin)
    for name in args:
        bad = dict(args, **{name: neg(args[name])})
        assert bad[name].is_neg() and torch.equal(bad[name], args[name])
        with pytest.raises(ValueError, match=f"{name}: tensor has the negative bit set"):
            tileattn.attention_with_kvcache(cache_seqlens=2, **bad)


def test_fused_kv_cache_and_interleaved_out_are_not_overlaps():
    """K and V of one fused cache [B, 2, Hkv, cap, D] (FlashInfer's pages [P, 2, page, Hkv, D] too)
    interleave in overlapping byte ranges without sharing an element: accepted, and the same as
    two separate caches; likewise an out= that
    interleaves with q. A view that does share elements is still refused."""
    rng = np.random.default_rng(0)
    b, h, hk, cap, d = 2, 4, 2, 16, 8
    fused = np.zeros((b, 2, hk, cap, d), np.float32)
    q = rng.standard_normal((b, h, 1, d)).astype(np.float32)
    k, v = (rng.standard_normal((b, hk, 3, d)).astype(np.float32) for _ in range(2))
    got = tileattn.attention_with_kvcache(q, fused[:, 0], fused[:, 1], k, v, cache_seqlens=0)
    kc, vc = np.zeros((b, hk, cap, d), np.float32), np.zeros((b, hk, cap, d), np.float32)
    want = tileattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=0)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(fused[:, 0], kc)
    np.testing.assert_array_equal(fused[:, 1], vc)
    buf = np.zeros((b, 2, h, 5, d), np.float32)
    buf[:, 1] = rng.standard_normal((b, h, 5, d))
    keys = rng.standard_normal((b, h, 5, d)).astype(np.float32)
    o = tileattn.flash_attention(buf[:, 1], keys, keys, out=buf[:, 0])
    np.testing.assert_array_equal(o, tileattn.flash_attention(buf[:, 1].copy(), keys, keys))
    with pytest.raises(ValueError, match="out: output overlaps input q"):
        tileattn.flash_attention(buf[:, 1], keys, keys, out=buf[:, 1])
    with pytest.raises(ValueError, match="v_cache: overlaps k_cache"):
        tileattn.attention_with_kvcache(q, fused[:, 0], fused[:, 0], k, v, cache_seqlens=0)
