"""What a quantized KV cache costs in accuracy: one decode step of tileattn.attention_with_kvcache
on a bf16, int8 and fp8 e4m3 cache holding the same keys/values, each against float64 attention
over the unquantized (bf16) cache. Prints one row per (shape, cache): the relative L2 error of O
over all heads (||o - ref|| / ||ref||) and the worst row's max |o - ref| / max |ref|.

Keys and values are Gaussian with per-channel standard deviations drawn log-normally (--sigma,
default 1: a few channels are 5-10x the others, as the key caches of Llama-style models have;
0: i.i.d. N(0, 1)); queries are N(0, 1). fp8 takes one scale per KV head: the head's max |x| over the prompt / 448.
Usage: PYTHONPATH=<installed tileattn> python scripts/kv_quant_error.py [--tokens N]"""
import argparse

import numpy as np
import torch

import tileattn

SHAPES = {  # heads, kv_heads, head_dim
    "Llama-3-8B / Mistral-7B": (32, 8, 128),
    "Llama-2-7B (MHA)": (32, 32, 128),
    "Qwen2-7B": (28, 4, 128),
    "Gemma-2B (MQA, D=256)": (8, 1, 256),
}


def reference(q, k, v):
    g = q.shape[1] // k.shape[1]
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


def run(shape, tokens, kind, rng, sigma):
    h, hk, d = shape
    chan = np.exp(sigma * rng.standard_normal((1, hk, 1, d)))
    k = torch.from_numpy(rng.standard_normal((1, hk, tokens, d)) * chan).bfloat16()
    v = torch.from_numpy(rng.standard_normal((1, hk, tokens, d)) * np.exp(0.5 * sigma * rng.standard_normal((1, hk, 1, d)))).bfloat16()
    q = torch.from_numpy(rng.standard_normal((1, h, 1, d))).bfloat16()
    ref = reference(q.double().numpy(), k.double().numpy(), v.double().numpy())
    if kind == "bf16":
        o = tileattn.attention_with_kvcache(q, k, v, cache_seqlens=tokens)
    else:
        dtype = torch.int8 if kind == "int8" else torch.float8_e4m3fn
        kc = torch.zeros(1, hk, tokens, d, dtype=dtype)
        vc = torch.zeros_like(kc)
        if kind == "int8":
            ks, vs = torch.zeros(1, hk, tokens), torch.zeros(1, hk, tokens)
        else:
            ks = k.float().abs().amax(dim=(0, 2, 3)) / 448
            vs = v.float().abs().amax(dim=(0, 2, 3)) / 448
        # Appended as a prefill of tokens - 1, then the decode step appends the last token.
        tileattn.attention_with_kvcache(q, kc, vc, k[:, :, :-1], v[:, :, :-1], cache_seqlens=0, k_scale=ks, v_scale=vs)
        o = tileattn.attention_with_kvcache(q, kc, vc, k[:, :, -1:], v[:, :, -1:], cache_seqlens=tokens - 1,
                                            k_scale=ks, v_scale=vs)
    err = o.double().numpy() - ref
    rel_l2 = np.linalg.norm(err) / np.linalg.norm(ref)
    row_max = (np.abs(err).max(-1) / np.abs(ref).max(-1)).max()
    return rel_l2, row_max


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of the K channel scales (V: half)")
    args = parser.parse_args()
    print(f"| shape (H / Hkv / D) | cache | rel. L2 error of O | worst row max err / max abs ref |  ({args.tokens} tokens, "
          f"median of {args.seeds} seeds, sigma {args.sigma})")
    print("|---|---|---|---|")
    for name, shape in SHAPES.items():
        for kind in ("bf16", "int8", "fp8_e4m3"):
            r = [run(shape, args.tokens, kind, np.random.default_rng(seed), args.sigma) for seed in range(args.seeds)]
            l2, mx = np.median([x[0] for x in r]), np.median([x[1] for x in r])
            print(f"| {name} ({shape[0]}/{shape[1]}/{shape[2]}) | {kind} | {l2:.2e} | {mx:.2e} |")


if __name__ == "__main__":
    main()
