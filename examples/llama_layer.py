"""A Llama-3-8B-shaped attention layer (hidden 4096, 32 heads, 8 kv heads, head_dim 128):
prefill, then token-by-token decode, timed with tileattn and with PyTorch's
scaled_dot_product_attention in the same run (the same layer, weights and inputs).

    .venv/bin/python examples/llama_layer.py [--prompt 512] [--steps 32] [--checkpoint PATH --layer 0]

Random weights unless --checkpoint names a Llama-style safetensors file or folder (read
locally with tileattn.load_huggingface_weights). Prints ms per decoded token for the whole
layer (projections included) with each attention, and their ratio.
"""
import argparse
import time

import torch

import tileattn


def decode_ms_per_token(layer, x_prompt, x_steps):
    with torch.no_grad():
        layer(x_prompt)  # prefill
        start = time.perf_counter()
        for t in range(x_steps.shape[1]):
            y = layer.incremental_forward(x_steps[:, t:t + 1])
        elapsed = time.perf_counter() - start
    return elapsed / x_steps.shape[1] * 1e3, y


def prefill_ms(layer, x_prompt):
    with torch.no_grad():
        start = time.perf_counter()
        layer(x_prompt)
        return (time.perf_counter() - start) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (prefill)")
    ap.add_argument("--steps", type=int, default=32, help="decoded tokens")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=0, help="0: every hardware thread")
    ap.add_argument("--checkpoint", help="Llama-style safetensors file or folder")
    ap.add_argument("--layer", type=int, default=0, help="decoder layer to load from --checkpoint")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
        tileattn.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    config = tileattn.AttentionConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                                      head_dim=128, rope_theta=500000.0,
                                      max_position_embeddings=args.prompt + args.steps, dtype=dtype)
    torch.manual_seed(0)
    ours = tileattn.FlashAttention(config)
    if args.checkpoint:
        ours.load_weights(tileattn.load_huggingface_weights(args.checkpoint, args.layer))
    else:  # random weights scaled like a trained layer's (unit-variance activations)
        with torch.no_grad():
            for p in ours.parameters():
                p.normal_(0.0, 4096 ** -0.5)
    theirs = tileattn.FlashAttention(config, backend="sdpa")
    theirs.load_state_dict(ours.state_dict())

    x = torch.randn(args.batch, args.prompt + args.steps, 4096).to(dtype)
    x_prompt, x_steps = x[:, :args.prompt], x[:, args.prompt:]
    prefill_ms(ours, x_prompt[:, :16]), prefill_ms(theirs, x_prompt[:, :16])  # warm up
    rows = []
    for name, layer in (("tileattn", ours), ("torch sdpa", theirs)):
        p_ms = prefill_ms(layer, x_prompt)
        d_ms, y = decode_ms_per_token(layer, x_prompt, x_steps)
        rows.append((name, p_ms, d_ms, y))
    diff = (rows[0][3].float() - rows[1][3].float()).abs().max().item()
    print(f"Llama-3-8B attention layer, batch {args.batch}, prompt {args.prompt}, {args.steps} decode "
          f"steps, {args.dtype}, isa {tileattn.info()['isa']}")
    for name, p_ms, d_ms, _ in rows:
        print(f"  {name:11s} prefill {p_ms:9.1f} ms   decode {d_ms:8.2f} ms/token")
    print(f"  decode ms/token ratio sdpa/tileattn: {rows[1][2] / rows[0][2]:.2f}   "
          f"prefill ratio: {rows[1][1] / rows[0][1]:.2f}   max |difference| of last output: {diff:.2e}")


if __name__ == "__main__":
    main()
