"""Float64 reference attention and the tolerance rule of the project, for the Python tests.

The rule (docs/accuracy.md; the C++ twin is src/testing/tolerance.hpp): every row of a tensor
(the last axis: one query's output, one key's dK or dV) must have its error against the float64
reference at most twice the error of a naive implementation in the same precision on that row,
plus a floor proportional to the tensor's magnitude: c(dtype) x max |reference|.
"""
import numpy as np

# Unit roundoff (half a unit in the last place at 1) of each storage type.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def output_floor_fraction(dtype_name):
    """c(dtype) for outputs: half a unit of the storage type + 16 units of the fp32 accumulator."""
    return 0.5 * UNIT_ROUNDOFF[dtype_name] + 16 * UNIT_ROUNDOFF["float32"]


def gradient_floor_fraction(dtype_name):
    """c(dtype) for gradients: the storage term + 64 units of fp32 (the fp32 LSE's rounding)."""
    return 0.5 * UNIT_ROUNDOFF[dtype_name] + 64 * UNIT_ROUNDOFF["float32"]


# D = rowsum(dO * O) enters dQ's and dK's floor at 64 units of fp32 (dS = P * (dP - D) cancels it).
# In float16/bfloat16 D also carries O's storage rounding, which the naive error covers row by row:
# a naive must round O to the dtype before D and, with dropout, take the keep scale
# 1 / (1 - p) in float32 from the float32 p as the kernel does (src/testing/tolerance.hpp).
DELTA_FLOOR_FRACTION = 64 * UNIT_ROUNDOFF["float32"]


def check_rows(got, ref, naive, floor_fraction, perturb=0.0, extra_floor=0.0, row_allowance=None):
    """The rule on one tensor, rows along the last axis; got is multiplied by (1 + perturb) first.
    row_allowance (one value per row, or None) widens each row's tolerance by a documented bound
    (tileattn.set_bf16_probabilities: 2^-8 (P |V|)).

    Returns a dict: ok, ratio (worst row's error / tolerance), and that row's error,
    naive_error and tolerance, with the floor and the magnitude max |ref|."""
    got = np.asarray(got, dtype=np.float64) * (1.0 + perturb)
    ref = np.asarray(ref, dtype=np.float64)
    naive = np.asarray(naive, dtype=np.float64)
    assert got.shape == ref.shape == naive.shape, (got.shape, ref.shape, naive.shape)
    nan_mismatch = bool((np.isnan(got) != np.isnan(ref)).any())
    d = max(ref.shape[-1], 1) if ref.ndim else 1
    got, ref, naive = (x.reshape(-1, d) for x in (got, ref, naive))
    fin = ~np.isnan(ref)
    magnitude = float(np.abs(ref[fin]).max(initial=0.0))
    floor = floor_fraction * magnitude + extra_floor
    with np.errstate(invalid="ignore"):
        error = np.where(fin, np.abs(got - ref), 0.0).max(axis=1, initial=0.0)
        naive_error = np.where(fin & ~np.isnan(naive), np.abs(naive - ref), 0.0).max(axis=1, initial=0.0)
    tolerance = 2 * naive_error + floor
    if row_allowance is not None:
        tolerance = tolerance + np.asarray(row_allowance, dtype=np.float64).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = error / np.where(tolerance > 0, tolerance, 1)
    ratio = np.where(error == 0, 0.0, np.where(tolerance > 0, ratio, np.inf))
    worst = int(np.argmax(ratio)) if ratio.size else 0
    out = dict(ratio=float(ratio[worst]) if ratio.size else 0.0, row=worst, floor=floor, magnitude=magnitude,
               error=float(error[worst]) if ratio.size else 0.0,
               naive_error=float(naive_error[worst]) if ratio.size else 0.0,
               tolerance=float(tolerance[worst]) if ratio.size else floor, nan_mismatch=nan_mismatch)
    out["ok"] = not nan_mismatch and out["ratio"] <= 1
    return out


def check_lse(got_lse, ref_lse, naive_lse):
    """The LSE, row by row: |got - ref| less the LSE's own rounding to fp32 (two units in the last
    place at its size) <= 2 x |naive - ref| + 16 fp32 units x max(1, |ref|) (the C++ rule's
    lse_floor_fraction, src/testing/tolerance.hpp); -inf exactly where the reference has it."""
    got_lse, ref_lse, naive_lse = (np.asarray(x, dtype=np.float64) for x in (got_lse, ref_lse, naive_lse))
    assert np.array_equal(np.isinf(got_lse), np.isinf(ref_lse))
    fin = np.isfinite(ref_lse)
    own_rounding = 2 * 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ref_lse[fin]), 1.0))) - 23)
    err = np.maximum(np.abs(got_lse[fin] - ref_lse[fin]) - own_rounding, 0.0)
    tol = 2 * np.abs(naive_lse[fin] - ref_lse[fin]) + 16 * 2.0**-24 * np.maximum(np.abs(ref_lse[fin]), 1.0)
    bad = err > tol
    assert not bad.any(), f"lse error {err[bad].max()} > tolerance {tol[bad].min()} in {int(bad.sum())} rows"


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
              softcap=0.0, alibi_slopes=None, sinks=None, dtype=np.float64, round_output=None):
    """Attention on [B, H, N, D] arrays computed in `dtype` (float64: the reference; float32: the
    naive same-precision baseline, whose output is rounded with round_output). softcap > 0: the
    scaled scores x become softcap * tanh(x / softcap) before the masks (FlashAttention-2).

    sinks: [H] logits joining each row's softmax denominator with no value (not scaled, not
    capped). Returns (o, lse); rows that see no key give o = 0 and lse = -inf (the sink with sinks).
    """
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    b, h, nq, d = q.shape
    group = h // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    nk = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * dtype(scale)
    if softcap:
        s = dtype(softcap) * np.tanh(s / dtype(softcap))
    if alibi_slopes is not None:  # [H] or [B, H]: -slope * |i + nk - nq - j|
        slopes = np.broadcast_to(np.asarray(alibi_slopes, dtype=dtype), (b, h))
        dist = np.abs(np.arange(nq)[:, None] + (nk - nq) - np.arange(nk)[None, :]).astype(dtype)
        s = s - slopes[:, :, None, None] * dist
    keep = np.broadcast_to(visible(nq, nk, causal, window), s.shape)
    if bool_mask is not None:
        keep = keep & np.broadcast_to(bool_mask, s.shape)
    if add_mask is not None:
        s = s + np.broadcast_to(np.asarray(add_mask, dtype=dtype), s.shape)
    s = np.where(keep, s, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        if sinks is not None:
            sink = np.broadcast_to(np.asarray(sinks, dtype=dtype).reshape(1, h, 1, 1), m.shape)
            m = np.maximum(m, sink)
        m = np.where(np.isfinite(m), m, 0)
        p = np.exp(s - m)
        total = p.sum(-1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(sink - m)
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


def check_close(got, q, k, v, dtype_name, got_lse=None, perturb=0.0, **mask):
    """Asserts the tolerance rule for `got` (a [B, H, Nq, D] array, any float dtype) against
    the float64 reference of attention on q, k, v ([B, H, N, D] values exactly as stored).
    Returns check_rows' verdict (its ratio: the worst row's error over its tolerance)."""
    ref, ref_lse = attention(q, k, v, **mask)
    naive, naive_lse = attention(q, k, v, dtype=np.float32, round_output=round_to(dtype_name), **mask)
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape
    assert not np.isnan(got).any()
    verdict = check_rows(got, ref, naive, output_floor_fraction(dtype_name), perturb)
    assert verdict["ok"], (f"row {verdict['row']}: max error {verdict['error']} > tolerance {verdict['tolerance']} "
                           f"(2 x naive {verdict['naive_error']} + floor {verdict['floor']})")
    if got_lse is not None:
        check_lse(got_lse, ref_lse, naive_lse)
    return verdict
