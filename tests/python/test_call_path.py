"""The one-call path of flash_attention (tileattn._tileattn.forward_arrays): outputs it
allocates or is given, the checks it makes on the op path (metadata only: autograd, fake
tensors), and the kernel timer the call-overhead benchmark relies on."""
import numpy as np
import pytest
import torch

import tileattn
from tileattn import _tileattn


def make(layout="bhsd", dtype=torch.float32, b=2, h=4, hk=2, nq=5, nk=7, d=16):
    g = torch.Generator().manual_seed(0)
    if layout == "bhsd":
        shapes = ((b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d))
    else:
        shapes = ((b, nq, h, d), (b, nk, hk, d), (b, nk, hk, d))
    return tuple(torch.randn(*s, generator=g).to(dtype) for s in shapes)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_output_is_new_contiguous_in_q_dtype_even_for_strided_q(layout, framework):
    q, k, v = make(layout)
    strided = torch.empty(q.shape[:3] + (2 * q.shape[3],))[..., ::2]
    strided.copy_(q)
    expected = tileattn.flash_attention(q, k, v, layout=layout)
    if framework == "numpy":
        o = tileattn.flash_attention(strided.numpy(), k.numpy(), v.numpy(), layout=layout)
        assert o.flags.c_contiguous and o.dtype == np.float32 and o.shape == tuple(q.shape)
        np.testing.assert_array_equal(o, expected.numpy())
    else:
        o = tileattn.flash_attention(strided, k, v, layout=layout)
        assert o.is_contiguous() and o.dtype == q.dtype and o.shape == q.shape
        assert o.data_ptr() not in (q.data_ptr(), strided.data_ptr())
        assert torch.equal(o, expected)


def test_lse_is_computed_only_when_asked():
    q, k, v = make()
    o, lse = _tileattn.forward_arrays(q, k, v, None, 0, False, -1, -1, None, 0.0, 0, 0, False)
    assert lse is None
    o2, lse2 = _tileattn.forward_arrays(q, k, v, None, 0, False, -1, -1, None, 0.0, 0, 0, True)
    assert torch.equal(o, o2) and lse2.shape == (2, 4, 5) and lse2.dtype == torch.float32
    _, lse3 = tileattn.flash_attention(q, k, v, return_lse=True)
    assert torch.equal(lse2, lse3)


def test_given_outputs_are_written_and_checked():
    q, k, v = (x.numpy() for x in make())
    expected, expected_lse = tileattn.flash_attention(q, k, v, return_lse=True)
    o = np.full(q.shape, np.nan, np.float32)
    lse = np.full(q.shape[:3], np.nan, np.float32)
    got = _tileattn.forward_arrays(q, k, v, None, 0, False, -1, -1, None, 0.0, 0, 0, False, o=o, lse=lse)
    assert got[0] is o and got[1] is lse
    np.testing.assert_array_equal(o, expected)
    np.testing.assert_array_equal(lse, expected_lse)

    def run(**outputs):
        _tileattn.forward_arrays(q, k, v, None, 0, False, -1, -1, None, 0.0, 0, 0, False, **outputs)

    read_only = o.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="out: array is read-only"):
        run(o=read_only)
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 4, 5, 16\), got \(1, 4, 5, 16\)"):
        run(o=o[:1].copy())
    with pytest.raises(TypeError, match="out: dtype float16, expected q's float32"):
        run(o=o.astype(np.float16))
    with pytest.raises(TypeError, match="out: must be a numpy array like q"):
        run(o=torch.from_numpy(o))
    with pytest.raises(TypeError, match="lse: dtype float64, expected float32"):
        run(o=o, lse=lse.astype(np.float64))
    with pytest.raises(ValueError, match=r"lse: expected shape \(2, 4, 5\)"):
        run(o=o, lse=lse[:, :2].copy())


def test_op_path_checks_arrays_before_the_op():
    """With autograd the call goes through the custom op; the arrays are checked (on their
    metadata) before it, with the same messages as the direct path."""
    q, k, v = make()
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="k: head_dim 8 differs from q's 16"):
        tileattn.flash_attention(q, k[..., :8], v[..., :8])
    with pytest.raises(TypeError, match="v: dtype torch.float64"):
        tileattn.flash_attention(q, k, v.double())
    with pytest.raises(ValueError, match="attn_mask: shape"):
        tileattn.flash_attention(q, k, v, attn_mask=torch.ones(3, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="q: tensor is on device 'meta'"):
        tileattn.flash_attention(q.detach().to("meta").requires_grad_(True), k, v)


def test_check_forward_converts_the_mask_and_resolves_the_scale():
    q, k, v = make()
    half_mask = torch.randn(5, 7).half()
    mask, scale = _tileattn.check_forward(q, k, v, half_mask, 0, False, -1, -1, None, 0.0)
    assert mask.dtype == torch.float32 and torch.equal(mask, half_mask.float())
    assert scale == 16 ** -0.5
    bool_mask = torch.ones(5, 7, dtype=torch.bool)
    mask, scale = _tileattn.check_forward(q, k, v, bool_mask, 0, False, -1, -1, 0.25, 0.0)
    assert mask is bool_mask and scale == 0.25


def test_check_forward_works_on_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        q, k, v = (mode.from_tensor(x) for x in make())
        mask, scale = _tileattn.check_forward(q, k, v, None, 0, True, -1, -1, None, 0.0)
        assert mask is None and scale == 16 ** -0.5
        with pytest.raises(ValueError, match="k: 3 heads must divide q's 4"):
            _tileattn.check_forward(q, k[:, :1].expand(2, 3, 7, 16), v[:, :1].expand(2, 3, 7, 16),
                                    None, 0, True, -1, -1, None, 0.0)


def test_gradients_with_a_half_precision_mask_use_the_converted_mask():
    q, k, v = make()
    mask = torch.randn(5, 7).half()
    q1, q2 = q.clone().requires_grad_(True), q.clone().requires_grad_(True)
    tileattn.flash_attention(q1, k, v, attn_mask=mask).sum().backward()
    tileattn.flash_attention(q2, k, v, attn_mask=mask.float()).sum().backward()
    assert torch.equal(q1.grad, q2.grad)


def test_kernel_timer_counts_only_while_on():
    q, k, v = (x.numpy() for x in make())
    _tileattn.time_kernel(False)
    tileattn.flash_attention(q, k, v)
    assert _tileattn.time_kernel(True) == 0.0
    tileattn.flash_attention(q, k, v)
    seconds = _tileattn.time_kernel(False)
    assert 0.0 < seconds < 1.0
    assert _tileattn.time_kernel(False) == 0.0


def test_torch_tensors_are_read_through_the_dlpack_exchange_api_where_torch_has_it():
    """torch >= 2.10 publishes the DLPack C exchange API; if this package stopped recognising
    it (a new version, a layout change), every call would silently take the slower path."""
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this torch has no DLPack C exchange API (the attribute reader is used)")
    assert _tileattn.dlpack_exchange_available(torch.zeros(1))
