"""A Llama-3-8B-shaped attention layer (hidden 4096, 32 heads, 8 kv heads, head_dim 128):
prefill, then token-by-token decode, timed with tileattn and with PyTorch's
scaled_dot_product_attention in the same run (the same layer, weights and inputs).

    .venv/bin/python examples/llama_layer.py [--prompt 512] [--steps 32] [--batch 1] [--dtype fp32|bf16]
        [--threads 0] [--kv-heads 8] [--checkpoint PATH --layer 0]

Random weights unless --checkpoint names a Llama-style safetensors file or folder (read
locally with tileattn.load_huggingface_weights). Prints ms per decoded token for the whole
layer (projections included) with each attention, and their ratio. The two layers run
interleaved, call by call, and each ratio is the median of per-pair ratios: on a shared
machine the load of other processes moves a step's time by more than the difference.
"""
import argparse
import sys
import time

try:
    import torch

    import tileattn
except ModuleNotFoundError as e:
    sys.exit(f"llama_layer.py: {e}. Run it with the project's interpreter, .venv/bin/python "
             "(scripts/setup.sh installs torch there, scripts/test_python.sh installs tileattn).")


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if len(values) % 2 else 0.5 * (values[len(values) // 2 - 1] + values[len(values) // 2])


def timed_ms(fn):
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1e3, out


def interleaved(layers, step, count):
    """Runs step(layer, i) for i < count on every layer, the layers taking turns call by call
    (the order rotating with i), so that the load of other processes falls on all of them
    alike. Returns per layer the list of times (ms) and the last output."""
    times = [[] for _ in layers]
    outs = [None] * len(layers)
    for i in range(count):
        for k in range(len(layers)):
            j = (i + k) % len(layers)
            ms, outs[j] = timed_ms(lambda: step(layers[j], i))
            times[j].append(ms)
    return times, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (prefill)")
    ap.add_argument("--steps", type=int, default=32, help="decoded tokens")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=0, help="0: every hardware thread")
    ap.add_argument("--checkpoint", help="Llama-style safetensors file or folder")
    ap.add_argument("--layer", type=int, default=0, help="decoder layer to load from --checkpoint")
    ap.add_argument("--kv-heads", type=int, default=8, choices=[1, 2, 4, 8, 16, 32],
                    help="KV heads of the 32 query heads (32: a Llama-2-7B-like MHA layer)")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
        tileattn.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    config = tileattn.AttentionConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=args.kv_heads,
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
    layers = (ours, theirs)
    with torch.no_grad():
        for layer in layers:
            layer(x_prompt[:, :16])  # warm up
        # Prefill 3 times each, then decode token by token, the two layers taking turns; the
        # ratios are medians of per-pair ratios (one machine state per pair).
        prefill, _ = interleaved(layers, lambda layer, i: layer(x_prompt), 3)
        for layer in layers:
            layer(x_prompt)  # the caches hold the prompt
        decode, outs = interleaved(layers, lambda layer, i: layer.incremental_forward(x_steps[:, i:i + 1]),
                                   args.steps)
    diff = (outs[0].float() - outs[1].float()).abs().max().item()
    print(f"Llama-3-8B attention layer, batch {args.batch}, prompt {args.prompt}, {args.steps} decode "
          f"steps, {args.dtype}, isa {tileattn.info()['isa']} (whole layer: projections included)")
    for name, p_ms, d_ms in zip(("tileattn", "torch sdpa"), prefill, decode):
        print(f"  {name:11s} prefill {median(p_ms):9.1f} ms   decode {median(d_ms):8.2f} ms/token (medians)")
    decode_ratio = median([b / a for a, b in zip(decode[0], decode[1])])
    prefill_ratio = median([b / a for a, b in zip(prefill[0], prefill[1])])
    print(f"  decode ms/token ratio sdpa/tileattn: {decode_ratio:.2f}   prefill ratio: {prefill_ratio:.2f}   "
          f"(medians of paired steps)   max |difference| of last output: {diff:.2e}")


if __name__ == "__main__":
    main()
