"""Backward of flash_attention in PyTorch math, for losses that use the log-sum-exp and for
float masks that require grad.

The C++ backward kernel (include/tileattn/backward.hpp) computes dQ, dK, dV
from dO; a loss that also depends on the returned lse adds P * dlse to dS,
which the kernel does not take, so that case runs here, and so does a float mask's
gradient (dS itself, which the kernel never stores).
It follows FlashAttention-2's backward: the attention weights are recomputed
from the saved log-sum-exp, P = exp(scale * Q K^T + mask - lse), never stored
for the whole sequence -- one block of query rows at a time -- and
    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dO * O) + dlse),
    dQ = scale * dS K,   dK = scale * dS^T Q,
(with a soft cap c the scores are c * tanh(scale * Q K^T / c) + mask, and dS
is multiplied by 1 - tanh^2 before dQ and dK; with attention sinks each row's
denominator also holds exp(sink), P_sink = exp(sink - lse), and
d_sink = sum over rows of P_sink * (dlse - rowsum(dO * O)))
summed over the query heads that share a kv head (GQA). Arithmetic is fp32
(the kernel's accumulation precision); gradients come back in the inputs'
dtypes. It has no dropout.
"""
import torch

# Query rows per block: bounds the temporary [B, H, rows, Nk] fp32 matrices.
QUERY_BLOCK_ROWS = 256


def visible_keys(nq, nk, causal, window_left, window_right, rows, device=None):
    """Bool [len(rows), nk]: the causal/window part of the mask, aligned bottom-right."""
    i = torch.arange(rows.start, rows.stop, device=device).unsqueeze(1) + (nk - nq)
    j = torch.arange(nk, device=device).unsqueeze(0)
    keep = torch.ones(len(rows), nk, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= i
    if window_left >= 0:
        keep &= j >= i - window_left
    if window_right >= 0:
        keep &= j <= i + window_right
    return keep


def attention_backward_math(q, k, v, o, lse, grad_o, grad_lse, attn_mask, scale, causal,
                            window_left, window_right, layout, softcap=0.0, alibi_slopes=None, sinks=None,
                            mask_grad=False):
    """(dq, dk, dv, d_sinks) for the forward with these inputs; layout 0 bhsd, 1 bshd;
    d_sinks float32 [H] with sinks, else an empty [0] tensor. With mask_grad (a float
    attn_mask), also d_mask in the mask's shape and dtype: dS (the gradient of the scores the
    mask is added to, after the soft cap) summed over the dims the mask broadcasts along."""
    if layout == 1:  # work in [B, H, N, D] views
        q, k, v, o = (t.transpose(1, 2) for t in (q, k, v, o))
        grad_o = grad_o.transpose(1, 2) if grad_o is not None else None
    b, h, nq, d = q.shape
    hk, nk = k.shape[1], k.shape[2]
    group = h // hk
    qf, of = q.float(), o.float()
    kf = k.float().repeat_interleave(group, dim=1)  # [B, H, Nk, D]
    vf = v.float().repeat_interleave(group, dim=1)
    do = grad_o.float() if grad_o is not None else torch.zeros_like(of)
    device = q.device  # CPU, or meta (shape inference)
    dlse = grad_lse.float() if grad_lse is not None else torch.zeros(b, h, nq, device=device)
    delta = (do * of).sum(-1)  # [B, H, Nq]
    mask = attn_mask.expand(b, h, nq, nk) if attn_mask is not None else None
    if mask_grad:  # the mask's own shape as 4 dims: d_mask's accumulator
        mask_shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
        d_mask = torch.zeros(mask_shape, dtype=torch.float32, device=device)
        d_mask_rows = []  # a mask with query rows: one block of rows per step

    # Accumulated out of place (sums, and blocks of dq concatenated): under torch.func.vmap some
    # of q, k, v may be unbatched, and an in-place add of a batched block into an unbatched
    # buffer is an error there.
    dq_rows = []
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    sink = sinks.float().view(1, h, 1, 1) if sinks is not None else None
    d_sinks = torch.zeros(h if sinks is not None else 0, device=device)
    for start in range(0, nq, QUERY_BLOCK_ROWS):
        rows = range(start, min(start + QUERY_BLOCK_ROWS, nq))
        r = slice(rows.start, rows.stop)
        s = torch.matmul(qf[:, :, r], kf.transpose(-1, -2)) * scale  # (B, H, rows, Nk)
        if softcap > 0:
            t = torch.tanh(s / softcap)
            s = softcap * t
        if alibi_slopes is not None:
            i = torch.arange(rows.start, rows.stop, device=device).unsqueeze(1) + (nk - nq)
            dist = (i - torch.arange(nk, device=device).unsqueeze(0)).abs().float()  # (rows, Nk)
            slopes = alibi_slopes.float().expand(b, h)  # [H] or [B, H]
            s = s - slopes[:, :, None, None] * dist
        if mask is not None:
            if mask.dtype == torch.bool:
                s = s.masked_fill(~mask[:, :, r], float("-inf"))
            else:
                s = s + mask[:, :, r].float()
        s = s.masked_fill(~visible_keys(nq, nk, causal, window_left, window_right, rows, device), float("-inf"))
        # P as the softmax of these scores, not exp(s - lse): the kernel's lse of a
        # row biased by finfo(float32).min is clamped at -FLT_MAX * ln 2 (log2
        # units, docs/accuracy.md) while s here is -3.4e38, and exp(s - lse)
        # was 0 there. Rows that see no key (max -inf) have no weights (the
        # forward wrote zeros).
        # (no keys: amax cannot reduce an empty dim; every row's max is -inf)
        row_max = s.amax(-1, keepdim=True) if nk > 0 else s.new_full(s.shape[:-1] + (1,), float("-inf"))
        if sink is not None:
            row_max = torch.maximum(row_max, sink.expand_as(row_max))  # the sink joins the softmax
        seen = torch.isfinite(row_max)
        shift = torch.where(seen, row_max, torch.zeros((), dtype=s.dtype))
        e = torch.exp(s - shift)
        denominator = e.sum(-1, keepdim=True)
        if sink is not None:
            e_sink = torch.exp(sink - shift)
            denominator = denominator + e_sink
            p_sink = e_sink / denominator  # (B, H, rows, 1)
            d_sinks = d_sinks + (p_sink.squeeze(-1) * (dlse[:, :, r] - delta[:, :, r])).sum((0, 2))
        p = torch.where(seen, e / denominator, torch.zeros((), dtype=s.dtype))
        dv = dv + torch.matmul(p.transpose(-1, -2), do[:, :, r])
        dp = torch.matmul(do[:, :, r], vf.transpose(-1, -2))
        ds = p * (dp - delta[:, :, r].unsqueeze(-1) + dlse[:, :, r].unsqueeze(-1))
        if mask_grad:
            if mask_shape[2] == 1:  # one mask row for every query row
                d_mask = d_mask + ds.sum_to_size(mask_shape)
            else:
                d_mask_rows.append(ds.sum_to_size(mask_shape[:2] + (len(rows), mask_shape[3])))
        if softcap > 0:
            ds = ds * (1 - t * t)
        dq_rows.append(torch.matmul(ds, kf) * scale)
        dk = dk + torch.matmul(ds.transpose(-1, -2), qf[:, :, r]) * scale

    dq = torch.cat(dq_rows, dim=2) if dq_rows else torch.zeros_like(qf)
    if mask_grad and d_mask_rows:
        d_mask = torch.cat(d_mask_rows, dim=2)
    dk = dk.view(b, hk, group, nk, d).sum(2)
    dv = dv.view(b, hk, group, nk, vf.shape[-1]).sum(2)  # V's head dim
    dq, dk, dv = dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    if layout == 1:
        dq, dk, dv = (t.transpose(1, 2) for t in (dq, dk, dv))
    if mask_grad:
        return dq, dk, dv, d_sinks, d_mask.reshape(attn_mask.shape).to(attn_mask.dtype)
    return dq, dk, dv, d_sinks


def varlen_backward_math(q, k, v, o, lse, grad_o, grad_lse, scale, causal, window_left,
                         window_right, softcap, alibi_slopes, cu_q, cu_k, sinks=None):
    """attention_backward_math for a packed varlen batch (q, k, v, o [total, H, D], lse
    [H, total_q]), one sequence at a time through the [1, N, H, D] ("bshd") form; d_sinks
    (float32 [H] with sinks, else empty) sums the sequences'."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    d_sinks = torch.zeros(sinks.shape if sinks is not None else (0,), dtype=torch.float32)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        rq, rk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[i] if alibi_slopes.dim() == 2 else alibi_slopes
        parts = attention_backward_math(
            q[rq].unsqueeze(0), k[rk].unsqueeze(0), v[rk].unsqueeze(0), o[rq].unsqueeze(0),
            lse[:, rq].unsqueeze(0), grad_o[rq].unsqueeze(0), grad_lse[:, rq].unsqueeze(0), None,
            scale, causal, window_left, window_right, 1, softcap, slopes, sinks)
        dq[rq], dk[rk], dv[rk] = (t[0] for t in parts[:3])
        if sinks is not None:
            d_sinks += parts[3]
    return dq, dk, dv, d_sinks
