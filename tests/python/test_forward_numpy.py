"""flash_attention on NumPy arrays against the float64 reference (tolerance rule)."""
import numpy as np
import pytest

import tileattn
from reference import check_close


def make(rng, b, h, hk, nq, nk, d, dtype=np.float32):
    q = rng.standard_normal((b, h, nq, d)).astype(dtype)
    k = rng.standard_normal((b, hk, nk, d)).astype(dtype)
    v = rng.standard_normal((b, hk, nk, d)).astype(dtype)
    return q, k, v


SHAPES = [  # b, h, hk, nq, nk, d
    (1, 1, 1, 1, 1, 8),
    (2, 4, 4, 33, 33, 64),    # MHA
    (1, 8, 2, 17, 70, 59),    # GQA, nq < nk, awkward head_dim
    (2, 6, 1, 40, 25, 128),   # MQA, nq > nk (causal rows with no key)
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(rng, dtype, shape, causal):
    q, k, v = make(rng, *shape, dtype=dtype)
    o, lse = tileattn.flash_attention(q, k, v, is_causal=causal, return_lse=True)
    assert o.dtype == dtype and o.shape == q.shape and lse.dtype == np.float32
    check_close(o, q, k, v, np.dtype(dtype).name, got_lse=lse, causal=causal)
    # The rule bites: the same output x 1.001 (float32) or x 1.01 (float16) is rejected.
    with pytest.raises(AssertionError, match="max error"):
        check_close(o, q, k, v, np.dtype(dtype).name, perturb=1e-3 if dtype == np.float32 else 1e-2, causal=causal)


@pytest.mark.parametrize("window", [(3, 0), (0, 2), (5, 5), (-1, 4), (7, -1)])
def test_window_as_argument_and_as_mask_tuple(rng, window):
    q, k, v = make(rng, 2, 4, 2, 21, 30, 32)
    o1 = tileattn.flash_attention(q, k, v, window=window)
    o2 = tileattn.flash_attention(q, k, v, attn_mask=window)
    np.testing.assert_array_equal(o1, o2)
    check_close(o1, q, k, v, "float32", window=window)


def test_window_with_causal(rng):
    q, k, v = make(rng, 1, 2, 2, 19, 19, 16)
    o = tileattn.flash_attention(q, k, v, is_causal=True, window=(4, -1))
    check_close(o, q, k, v, "float32", causal=True, window=(4, -1))


@pytest.mark.parametrize("mask_shape", [(13, 29), (2, 1, 13, 29), (1, 4, 13, 29), (2, 4, 13, 29), (1, 29)])
def test_boolean_mask_broadcasts(rng, mask_shape):
    q, k, v = make(rng, 2, 4, 2, 13, 29, 24)
    mask = rng.random(mask_shape) > 0.3
    o = tileattn.flash_attention(q, k, v, attn_mask=mask)
    check_close(o, q, k, v, "float32", bool_mask=mask)


def test_additive_mask_with_minus_infinity_rows(rng):
    q, k, v = make(rng, 1, 2, 1, 9, 12, 16)
    mask = rng.standard_normal((9, 12)).astype(np.float32)
    mask[3, :] = -np.inf   # a row that sees nothing: zeros, not NaN
    mask[5, ::2] = -np.inf
    o, lse = tileattn.flash_attention(q, k, v, attn_mask=mask, return_lse=True)
    assert np.all(o[:, :, 3] == 0) and np.all(np.isneginf(lse[:, :, 3]))
    check_close(o, q, k, v, "float32", got_lse=lse, add_mask=mask)


def test_additive_mask_float64_is_converted(rng):
    q, k, v = make(rng, 1, 2, 2, 8, 8, 16)
    mask = rng.standard_normal((8, 8))
    o = tileattn.flash_attention(q, k, v, attn_mask=mask)
    np.testing.assert_array_equal(o, tileattn.flash_attention(q, k, v, attn_mask=mask.astype(np.float32)))


def test_bshd_layout_equals_bhsd(rng):
    q, k, v = make(rng, 2, 4, 2, 11, 14, 32)
    o = tileattn.flash_attention(q, k, v, is_causal=True)
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    o2 = tileattn.flash_attention(t(q), t(k), t(v), is_causal=True, layout="bshd")
    assert o2.shape == (2, 11, 4, 32)
    np.testing.assert_array_equal(o2.transpose(0, 2, 1, 3), o)


def test_any_strides_are_read_in_place(rng):
    """Transposed, sliced, reversed (negative strides) and broadcast (zero strides) views."""
    q, k, v = make(rng, 2, 4, 2, 16, 20, 32)
    big = rng.standard_normal((2, 20, 4, 64)).astype(np.float32)
    q_view = big[:, ::-1][:, 2:18].transpose(0, 2, 1, 3)[..., ::2]  # negative row stride, dim stride 2
    k_view = np.broadcast_to(k[:, :1], k.shape)                      # zero head stride
    assert q_view.strides[2] < 0 and k_view.strides[1] == 0
    o = tileattn.flash_attention(q_view, k_view, v[..., ::-1], is_causal=True)
    check_close(o, np.ascontiguousarray(q_view), np.ascontiguousarray(k_view),
                np.ascontiguousarray(v[..., ::-1]), "float32", causal=True)


def test_softmax_scale(rng):
    q, k, v = make(rng, 1, 2, 2, 8, 8, 16)
    o = tileattn.flash_attention(q, k, v, softmax_scale=0.37)
    check_close(o, q, k, v, "float32", scale=0.37)


def test_empty_key_sequence_gives_zeros(rng):
    q, k, v = make(rng, 1, 2, 2, 5, 0, 16)
    o, lse = tileattn.flash_attention(q, k, v, return_lse=True)
    assert np.all(o == 0) and np.all(np.isneginf(lse))


def test_dropout_zero_probability_is_plain_attention(rng):
    q, k, v = make(rng, 1, 2, 2, 8, 8, 16)
    np.testing.assert_array_equal(tileattn.flash_attention(q, k, v, dropout_p=0.0),
                                  tileattn.flash_attention(q, k, v))


def test_dropout_is_reproducible_with_numpy_seed(rng):
    q, k, v = make(rng, 1, 2, 2, 16, 16, 16)
    np.random.seed(7)
    a = tileattn.flash_attention(q, k, v, dropout_p=0.5)
    np.random.seed(7)
    b = tileattn.flash_attention(q, k, v, dropout_p=0.5)
    c = tileattn.flash_attention(q, k, v, dropout_p=0.5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, tileattn.flash_attention(q, k, v))


def test_threads_setting(rng):
    q, k, v = make(rng, 2, 4, 2, 40, 40, 32)
    base = tileattn.flash_attention(q, k, v)
    try:
        tileattn.set_num_threads(1)
        assert tileattn.get_num_threads() == 1
        np.testing.assert_array_equal(tileattn.flash_attention(q, k, v), base)
    finally:
        tileattn.set_num_threads(0)


def test_info():
    info = tileattn.info()
    isas = ("generic", "avx2", "avx512", "avx512bf16", "amx", "reference")
    assert info["isa"] in isas and info["bf16_isa"] in isas and info["threads"] >= 1
    assert all(isinstance(info[k], bool) for k in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8"))
    assert not info["amx_bf16"] or info["avx512f"]  # every AMX CPU has AVX-512
    # AVX512-VBMI as the kernel reports it (Linux's flag name has no underscore)
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    assert info["avx512_vbmi"] is ("avx512vbmi" in flags)
    assert info["avx512_vnni"] is ("avx512_vnni" in flags)
    # CPUID leaf 1's display family and model (x86-64 CPUs start at family 6; AMD Zen 4 is 0x19)
    assert isinstance(info["cpu_family"], int) and info["cpu_family"] >= 6
    assert isinstance(info["cpu_model"], int) and info["cpu_model"] >= 0
