"""flash_attention on torch tensors: against torch's scaled_dot_product_attention for every
mask convention, and against the float64 reference (tolerance rule) for every dtype."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import tileattn
from reference import check_close

DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@pytest.fixture(autouse=True, params=["dlpack", "attributes"])
def tensor_reader(request):
    """Every test runs with both ways the binding reads a tensor: the DLPack C exchange API
    (torch >= 2.10) and the tensor's attributes (older torch, and the fallback)."""
    from tileattn import _tileattn
    previous = _tileattn.use_dlpack_exchange(request.param == "dlpack")
    yield request.param
    _tileattn.use_dlpack_exchange(previous)


def make(b, h, hk, nq, nk, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g).to(dtype)
    k = torch.randn(b, hk, nk, d, generator=g).to(dtype)
    v = torch.randn(b, hk, nk, d, generator=g).to(dtype)
    return q, k, v


def assert_close_to_sdpa(o, expected):
    # Both are fp32 attention; SDPA's error against float64 is itself ~1e-7 relative.
    torch.testing.assert_close(o, expected, atol=2e-6, rtol=2e-5)


def test_no_mask_matches_sdpa():
    q, k, v = make(2, 4, 4, 13, 21, 32)
    assert_close_to_sdpa(tileattn.flash_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


def test_causal_equal_lengths_matches_sdpa_is_causal():
    q, k, v = make(2, 4, 4, 17, 17, 32)
    assert_close_to_sdpa(tileattn.flash_attention(q, k, v, is_causal=True),
                         F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_causal_is_bottom_right_not_top_left():
    """With Nq != Nk tileattn matches causal_lower_right; SDPA's is_causal (top-left) differs."""
    q, k, v = make(1, 2, 2, 5, 12, 16)
    o = tileattn.flash_attention(q, k, v, is_causal=True)
    assert_close_to_sdpa(o, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(5, 12)))
    assert not torch.allclose(o, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-3)


def test_boolean_mask_matches_sdpa():
    q, k, v = make(2, 4, 4, 9, 14, 16)
    mask = torch.rand(2, 1, 9, 14, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True  # SDPA gives NaN for fully masked rows; tileattn gives 0
    assert_close_to_sdpa(tileattn.flash_attention(q, k, v, attn_mask=mask),
                         F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_additive_mask_matches_sdpa():
    q, k, v = make(1, 3, 3, 8, 10, 16)
    mask = torch.randn(8, 10)
    assert_close_to_sdpa(tileattn.flash_attention(q, k, v, attn_mask=mask),
                         F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v = make(1, 2, 2, 4, 6, 8)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    o, lse = tileattn.flash_attention(q, k, v, attn_mask=mask, return_lse=True)
    assert torch.all(o[:, :, 2] == 0) and torch.all(torch.isneginf(lse[:, :, 2]))


def test_window_matches_sdpa_with_band_mask():
    q, k, v = make(1, 2, 2, 10, 16, 16)
    i = torch.arange(10)[:, None] + 6
    j = torch.arange(16)[None, :]
    band = (j >= i - 3) & (j <= i + 1)
    assert_close_to_sdpa(tileattn.flash_attention(q, k, v, attn_mask=(3, 1)),
                         F.scaled_dot_product_attention(q, k, v, attn_mask=band))


@pytest.mark.parametrize("hk", [1, 2])
def test_gqa_matches_sdpa_enable_gqa(hk):
    q, k, v = make(2, 8, hk, 11, 11, 64)
    assert_close_to_sdpa(tileattn.flash_attention(q, k, v, is_causal=True),
                         F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


def test_bshd_layout_matches_sdpa():
    q, k, v = make(2, 4, 2, 7, 9, 32)
    o = tileattn.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bshd",
                                 attn_mask=causal_lower_right(7, 9)._materialize())
    assert o.shape == (2, 7, 4, 32)
    assert_close_to_sdpa(o.transpose(1, 2), F.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_lower_right(7, 9), enable_gqa=True))


def test_softmax_scale_matches_sdpa():
    q, k, v = make(1, 2, 2, 6, 6, 16)
    assert_close_to_sdpa(tileattn.flash_attention(q, k, v, softmax_scale=0.3),
                         F.scaled_dot_product_attention(q, k, v, scale=0.3))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True])
def test_dtypes_against_reference(dtype, causal):
    q, k, v = make(2, 4, 2, 19, 33, 64, dtype=dtype)
    o, lse = tileattn.flash_attention(q, k, v, is_causal=causal, return_lse=True)
    assert o.dtype == dtype and lse.dtype == torch.float32
    f = lambda t: t.float().numpy()
    check_close(f(o), f(q), f(k), f(v), DTYPES[dtype], got_lse=lse.numpy(), causal=causal)
    # The rule bites: the same output x 1.001 (float32) or x 1.01 (16-bit) is rejected.
    with pytest.raises(AssertionError, match="max error"):
        check_close(f(o), f(q), f(k), f(v), DTYPES[dtype], perturb=1e-3 if dtype == torch.float32 else 1e-2,
                    causal=causal)


def test_half_precision_mask_is_converted():
    q, k, v = make(1, 2, 2, 5, 7, 16, dtype=torch.bfloat16)
    mask = torch.randn(5, 7)
    torch.testing.assert_close(tileattn.flash_attention(q, k, v, attn_mask=mask.bfloat16()),
                               tileattn.flash_attention(q, k, v, attn_mask=mask.bfloat16().float()),
                               atol=0, rtol=0)


def test_non_contiguous_tensors_are_read_in_place():
    q, k, v = make(2, 4, 2, 8, 12, 32)
    qt = q.transpose(2, 3).contiguous().transpose(2, 3)  # dim stride != 1
    kv = torch.stack([k, v], dim=-1)                       # interleaved k/v: stride 2 in dim
    o = tileattn.flash_attention(qt, kv[..., 0], kv[..., 1])
    assert_close_to_sdpa(o, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def test_numpy_in_numpy_out_torch_in_torch_out():
    q, k, v = make(1, 1, 1, 3, 3, 8)
    assert isinstance(tileattn.flash_attention(q, k, v), torch.Tensor)
    assert isinstance(tileattn.flash_attention(q.numpy(), k.numpy(), v.numpy()), np.ndarray)


def test_dropout_reproducible_with_manual_seed():
    q, k, v = make(1, 2, 2, 16, 16, 16)
    torch.manual_seed(3)
    a = tileattn.flash_attention(q, k, v, dropout_p=0.25)
    torch.manual_seed(3)
    b = tileattn.flash_attention(q, k, v, dropout_p=0.25)
    assert torch.equal(a, b) and not torch.equal(a, tileattn.flash_attention(q, k, v, dropout_p=0.25))


def negative_bit_view(x):
    """A view with x's values and the negative bit set: its memory holds -x."""
    return torch.complex(torch.zeros_like(x), -x).conj().imag


def test_negative_bit_tensors_are_refused_by_name():
    """Read (or written) as memory, a tensor with the negative bit set gives the negation of
    its values: silently wrong results. The error names it; resolve_neg() makes it usable.
    With autograd (the op path) torch's dispatcher resolves the bit itself."""
    q, k, v = make(1, 2, 2, 4, 6, 8)
    mask = torch.randn(4, 6)
    args = dict(q=q, k=k, v=v, attn_mask=mask)
    for name in args:
        bad = dict(args, **{name: negative_bit_view(args[name])})
        assert bad[name].is_neg() and torch.equal(bad[name], args[name])
        with pytest.raises(ValueError, match=f"{name}: tensor has the negative bit set"):
            tileattn.flash_attention(**bad)
    out = negative_bit_view(torch.zeros(1, 2, 4, 8))
    with pytest.raises(ValueError, match="out: tensor has the negative bit set"):
        tileattn.flash_attention(q, k, v, out=out)
    assert torch.equal(tileattn.flash_attention(negative_bit_view(q).resolve_neg(), k, v),
                       tileattn.flash_attention(q, k, v))
    qg = negative_bit_view(q).requires_grad_(True)
    assert torch.equal(tileattn.flash_attention(qg, k, v).detach(), tileattn.flash_attention(q, k, v))


def test_sparse_tensors_are_refused_by_name():
    q, k, v = make(1, 1, 1, 4, 4, 8)
    with pytest.raises(ValueError, match="q: torch.sparse_coo tensors are not supported"):
        tileattn.flash_attention(q.to_sparse(), k, v)
    with pytest.raises(ValueError, match="v: torch.sparse_coo tensors are not supported"):
        tileattn.flash_attention(q, k, v.to_sparse())
