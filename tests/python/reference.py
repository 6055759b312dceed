"""Float64 reference attention and the tolerance rule of the project, for the Python tests.

Tolerance (docs/accuracy.md, src/testing/problem_case.cpp): the error of a path against the
float64 reference may be at most twice the error of a naive implementation in the same
precision, plus a tiny floor (a quarter of the dtype's unit roundoff).
"""
import numpy as np

FLOOR = {"float32": 0.25 * 2.0**-23, "float16": 0.25 * 2.0**-10, "bfloat16": 0.25 * 2.0**-7}


def visible(nq, nk, causal=False, window=(-1, -1)):
    """Bool [nq, nk]: causal/window visibility, aligned bottom-right."""
    i = np.arange(nq)[:, None] + (nk - nq)
    j = np.arange(nk)[None, :]
    keep = np.ones((nq, nk), dtype=bool)
    if causal:
        keep &= j <= i
    if window[0] >= 0:
        keep &= j >= i - window[0]
    if window[1] >= 0:
        keep &= j <= i + window[1]
    return keep


def attention(q, k, v, *, scale=None, causal=False, window=(-1, -1), bool_mask=None, add_mask=None,
              dtype=np.float64, round_output=None):
    """Attention on [B, H, N, D] arrays computed in `dtype` (float64: the reference; float32: the
    naive same-precision baseline, whose output is rounded with round_output).

    Returns (o, lse); rows that see no key give o = 0 and lse = -inf.
    """
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    b, h, nq, d = q.shape
    group = h // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    nk = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * dtype(scale)
    keep = np.broadcast_to(visible(nq, nk, causal, window), s.shape)
    if bool_mask is not None:
        keep = keep & np.broadcast_to(bool_mask, s.shape)
    if add_mask is not None:
        s = s + np.broadcast_to(np.asarray(add_mask, dtype=dtype), s.shape)
    s = np.where(keep, s, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        p = np.exp(s - m)
        total = p.sum(-1, keepdims=True)
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + m[..., 0], -np.inf)
        p = np.where(total > 0, p / np.where(total > 0, total, 1), 0)
    o = np.matmul(p, v)
    if round_output is not None:
        o = round_output(o)
    return o, lse


def round_to(dtype_name):
    """A function rounding float32 values to `dtype_name` and back."""
    if dtype_name == "float32":
        return lambda x: np.asarray(x, np.float32)
    if dtype_name == "float16":
        return lambda x: np.asarray(x, np.float16).astype(np.float32)
    import torch
    return lambda x: torch.from_numpy(np.ascontiguousarray(x, np.float32)).bfloat16().float().numpy()


def check_close(got, q, k, v, dtype_name, got_lse=None, **mask):
    """Asserts the tolerance rule for `got` (a [B, H, Nq, D] array, any float dtype) against
    the float64 reference of attention on q, k, v ([B, H, N, D] values exactly as stored)."""
    ref, ref_lse = attention(q, k, v, **mask)
    naive, naive_lse = attention(q, k, v, dtype=np.float32, round_output=round_to(dtype_name), **mask)
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape
    assert not np.isnan(got).any()
    err = np.abs(got - ref).max(initial=0.0)
    naive_err = np.abs(naive - ref).max(initial=0.0)
    tol = 2 * naive_err + FLOOR[dtype_name]
    assert err <= tol, f"max error {err} > tolerance {tol} (2 x naive {naive_err} + floor)"
    if got_lse is not None:
        got_lse = np.asarray(got_lse, dtype=np.float64)
        assert np.array_equal(np.isinf(got_lse), np.isinf(ref_lse))
        fin = np.isfinite(ref_lse)
        lse_err = np.abs(got_lse[fin] - ref_lse[fin]).max(initial=0.0)
        lse_tol = 2 * np.abs(naive_lse[fin] - ref_lse[fin]).max(initial=0.0) + 4 * 2.0**-23
        assert lse_err <= lse_tol, f"lse error {lse_err} > tolerance {lse_tol}"
    return err, tol
