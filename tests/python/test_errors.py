"""Bad input raises ValueError/TypeError naming the argument (NotImplementedError for what is
not built), never a crash, and writes nothing."""
import numpy as np
import pytest
import torch

import tileattn


def qkv(dtype=np.float32, b=1, h=2, hk=2, n=4, d=8):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((b, h, n, d), (b, hk, n, d), (b, hk, n, d)))


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(layout="bsdh"), ValueError, "layout"),
    (dict(layout=None), ValueError, "layout"),
    (dict(window=(1,)), ValueError, "window"),
    (dict(window=(-2, 0)), ValueError, "window"),
    (dict(window=(1.5, 0)), TypeError, "window"),
    (dict(attn_mask=(1, 2), window=(1, 2)), ValueError, "attn_mask"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
    (dict(softmax_scale="x"), TypeError, "softmax_scale"),
    (dict(dropout_p=1.0), ValueError, "dropout_p"),
    (dict(dropout_p=-0.1), ValueError, "dropout_p"),
    (dict(is_causal=1), TypeError, "is_causal"),
    (dict(attn_mask=np.ones((3, 4), bool)), ValueError, "attn_mask"),
    (dict(attn_mask=np.ones((4, 4), np.int32)), TypeError, "attn_mask"),
    (dict(attn_mask=np.ones((1, 1, 1, 1, 4, 4), bool)), ValueError, "attn_mask"),
    (dict(return_lse=None), TypeError, "return_lse: expected a bool"),
    (dict(return_lse="yes"), TypeError, "return_lse: expected a bool"),
    (dict(window=(2**70, 1)), ValueError, r"window: left must be in -1 .. 2\^63 - 1"),
    (dict(attn_mask=(1, 2**64)), ValueError, "attn_mask: right"),
    (dict(softmax_scale=1e300), ValueError, r"^softmax_scale: must be finite in float32 \(\|scale\| < 3.4e38\), got 1e\+300$"),
    (dict(softmax_scale=-3.5e38), ValueError, "softmax_scale: must be finite in float32"),
    (dict(softmax_scale=10**400), ValueError, "softmax_scale: must be finite in float32"),
])
def test_bad_options(kwargs, error, words):
    q, k, v = qkv()
    with pytest.raises(error, match=words):
        tileattn.flash_attention(q, k, v, **kwargs)


def test_bad_arrays():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="q: expected a 4-D"):
        tileattn.flash_attention(q[0], k, v)
    with pytest.raises(ValueError, match="v: shape"):
        tileattn.flash_attention(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match="k: batch"):
        tileattn.flash_attention(q, np.concatenate([k, k]), np.concatenate([v, v]))
    with pytest.raises(ValueError, match="k: head_dim"):
        tileattn.flash_attention(q, k[..., :4], v[..., :4])
    q3, k3, v3 = qkv(h=3, hk=2)
    with pytest.raises(ValueError, match="k: 2 heads must divide q's 3"):
        tileattn.flash_attention(q3, k3, v3)
    with pytest.raises(TypeError, match="k: dtype float16 differs"):
        tileattn.flash_attention(q, k.astype(np.float16), v)
    with pytest.raises(TypeError, match="q: dtype float64"):
        tileattn.flash_attention(q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match="q: dtype >f4"):
        tileattn.flash_attention(q.astype(">f4"), k, v)
    with pytest.raises(TypeError, match="q: expected a numpy.ndarray or torch.Tensor"):
        tileattn.flash_attention(q.tolist(), k, v)
    with pytest.raises(TypeError, match="k: is a torch array"):
        tileattn.flash_attention(q, torch.from_numpy(k), v)
    big = qkv(d=600)
    with pytest.raises(ValueError, match="q: head_dim must be in 1..576"):
        tileattn.flash_attention(*big)


def test_float32_scale_limit():
    """The largest double that still rounds to a finite float32 is accepted; the next is not."""
    q, k, v = qkv()
    limit = (2.0 - 2.0**-24) * 2.0**127
    tileattn.flash_attention(q, k, v, softmax_scale=np.nextafter(limit, 0))
    with pytest.raises(ValueError, match="softmax_scale"):
        tileattn.flash_attention(q, k, v, softmax_scale=limit)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_missing_arrays_are_named(framework):
    """None for an array gives an error naming it, not nanobind's "incompatible function
    arguments" -- on the direct path and (torch with autograd) the op path."""
    q, k, v = qkv()
    if framework == "torch":
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    for args, name in (((None, k, v), "q"), ((q, None, v), "k"), ((q, k, None), "v")):
        with pytest.raises(TypeError, match=f"{name}: expected a numpy.ndarray or torch.Tensor, got NoneType"):
            tileattn.flash_attention(*args)
    for args, name in (((q, None, k), "k_cache"), ((q, k, None), "v_cache")):
        with pytest.raises(TypeError, match=f"{name}: expected a numpy.ndarray or torch.Tensor, got NoneType"):
            tileattn.attention_with_kvcache(*args)
    if framework == "torch":
        qg = q.clone().requires_grad_(True)
        with pytest.raises(TypeError, match="k: expected a numpy.ndarray or torch.Tensor, got NoneType"):
            tileattn.flash_attention(qg, None, v)
        with pytest.raises(TypeError, match="k_cache: expected a numpy.ndarray or torch.Tensor, got NoneType"):
            tileattn.attention_with_kvcache(qg, None, v)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(rotary_interleaved="no"), TypeError, "rotary_interleaved: expected a bool, got str"),
    (dict(rotary_interleaved=1), TypeError, "rotary_interleaved: expected a bool, got int"),
    (dict(return_lse="yes"), TypeError, "return_lse: expected a bool, got str"),
    (dict(return_lse=None), TypeError, "return_lse: expected a bool, got NoneType"),
    (dict(softmax_scale=1e300), ValueError, "softmax_scale: must be finite in float32"),
    (dict(window=(0, 2**63)), ValueError, "window: right must be in -1"),
])
def test_kvcache_bad_options(kwargs, error, words):
    q, k, v = qkv()
    with pytest.raises(error, match=words):
        tileattn.attention_with_kvcache(q, k, v, **kwargs)


def test_bool_options_take_numpy_bools():
    q, k, v = qkv()
    o, lse = tileattn.flash_attention(q, k, v, return_lse=np.bool_(True))
    o2, lse2 = tileattn.attention_with_kvcache(q, k, v, rotary_interleaved=np.bool_(False),
                                               return_lse=np.True_, is_causal=False)
    np.testing.assert_array_equal(o, o2)


def test_set_num_threads_checks_type_and_range():
    before = tileattn.get_num_threads()
    with pytest.raises(TypeError, match="threads: expected an int >= 0, got float"):
        tileattn.set_num_threads(1.5)
    with pytest.raises(TypeError, match="threads"):
        tileattn.set_num_threads(True)
    with pytest.raises(ValueError, match="threads"):
        tileattn.set_num_threads(-1)
    with pytest.raises(ValueError, match="threads"):
        tileattn.set_num_threads(2**40)  # beyond the bindings' C int: every later call would fail
    assert tileattn.get_num_threads() == before


def test_get_num_threads_says_how_many_threads_the_kernels_use():
    hardware = tileattn.info()["threads"]
    before = tileattn._kernel._settings["threads"]
    try:
        tileattn.set_num_threads(0)
        assert tileattn.get_num_threads() == hardware  # 0: every hardware thread, not "0"
        tileattn.set_num_threads(1)
        assert tileattn.get_num_threads() == 1
        tileattn.set_num_threads(hardware + 5)
        assert tileattn.get_num_threads() == hardware  # the library caps at the hardware's count
    finally:
        tileattn.set_num_threads(before)


def test_torch_device_and_dtype_errors():
    q, k, v = (torch.from_numpy(x) for x in qkv())
    with pytest.raises(ValueError, match="q: tensor is on device 'meta'"):
        tileattn.flash_attention(q.to("meta"), k, v)
    with pytest.raises(ValueError, match="attn_mask: tensor is on device 'meta'"):
        tileattn.flash_attention(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(TypeError, match="v: dtype torch.float64"):
        tileattn.flash_attention(q, k, v.double())
    with pytest.raises(TypeError, match="attn_mask: dtype torch.int64"):
        tileattn.flash_attention(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="attn_mask: must be a torch array"):
        tileattn.flash_attention(q, k, v, attn_mask=np.ones((4, 4), bool))


def test_unaligned_numpy_strides():
    raw = np.zeros(1 + 64 * 4, np.uint8)[1:].view(np.float32).reshape(1, 2, 4, 8)
    q, k, v = qkv()
    odd = np.lib.stride_tricks.as_strided(q, strides=(q.strides[0], q.strides[1], q.strides[2], 6))
    with pytest.raises(ValueError, match="q: byte stride 6"):
        tileattn.flash_attention(odd, k, v)
    # Unaligned (but element-multiple) data is fine.
    tileattn.flash_attention(raw, k, v)


def test_library_errors_become_value_errors():
    """Checks only the C++ side makes (element strides that overflow) arrive as ValueError."""
    from tileattn import _tileattn
    with pytest.raises(ValueError, match="q"):
        _tileattn.forward(0, (1, 1, 1, 2, 2, 8), 4096, (0, 0, 2**62, 1), 4096, (0, 0, 8, 1),
                          4096, (0, 0, 8, 1), 8192, (0, 0, 8, 1), 0, (0, 0, 1), 0, 0, (0, 0, 0, 1),
                          False, -1, -1, float("nan"), 0.0, 0, 1)
    with pytest.raises(ValueError, match="out: output overlaps"):  # a given o is the public out=
        q, k, v = qkv()
        _tileattn.forward_arrays(q, k, v, None, 0, False, -1, -1, 0.5, 0.0, 0, 0, False, o=q)


def test_not_supported_becomes_not_implemented(monkeypatch):
    monkeypatch.setenv("TILEATTN_ISA", "reference")  # the float64 path has no dropout
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match="dropout"):
        tileattn.flash_attention(q, k, v, dropout_p=0.5)


def test_merge_states_errors():
    o = np.zeros((1, 2, 3, 4), np.float32)
    lse = np.zeros((1, 2, 3), np.float32)
    with pytest.raises(ValueError, match="o_b: shape"):
        tileattn.merge_states(o, lse, o[:, :1], lse)
    with pytest.raises(ValueError, match="lse_b: expected shape"):
        tileattn.merge_states(o, lse, o, lse[..., :2])
    with pytest.raises(TypeError, match="lse_a: expected dtype float32"):
        tileattn.merge_states(o, lse.astype(np.float64), o, lse)
