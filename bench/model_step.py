"""Attention inside a model's decode step: a q/k/v projection on PyTorch's threads, then the
attention, then the output projection, as a transformer layer runs them. Times the attention
alone, with tileattn on torch's OpenMP threads (set_thread_runtime("openmp")), tileattn on its
own pool ("pool") and PyTorch's SDPA, the three taking turns step by step in one process, and
prints the medians and their ratios (docs/python.md, "Threads"). With --train N: a training
step of the same block over N tokens (causal; projections, attention, loss.backward()), timed
whole.

    .venv/bin/python bench/model_step.py [--heads 32] [--kv-heads 8] [--cached 4096] [--dim 128]
        [--dtype bf16|fp32] [--steps 120] [--threads 0] [--train N]
"""
import argparse
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F

    import tileattn
except ModuleNotFoundError as e:
    sys.exit(f"model_step.py: {e}. Run it with the project's interpreter, .venv/bin/python.")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--cached", type=int, default=4096, help="tokens in the KV cache")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--threads", type=int, default=0, help="0: every hardware thread")
    ap.add_argument("--train", type=int, default=0, metavar="N",
                    help="time a training step over N tokens instead of a decode step")
    args = ap.parse_args()
    for flag in ("heads", "kv_heads", "cached", "dim", "steps"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')}: must be at least 1")
    if args.heads % args.kv_heads:
        ap.error(f"--kv-heads: {args.kv_heads} must divide --heads {args.heads}")
    if args.threads < 0 or args.train < 0:
        ap.error("--threads, --train: must be at least 0")
    threads = args.threads or tileattn.info()["threads"]
    torch.set_num_threads(threads)
    tileattn.set_num_threads(threads)
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        sys.exit("model_step.py: this torch build does not parallelize with OpenMP; nothing to compare")

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    if args.train:
        return train_steps(args, dtype, threads)
    gen = torch.Generator().manual_seed(0)
    hidden = args.heads * args.dim
    w_qkv = (torch.randn(hidden, (args.heads + 2 * args.kv_heads) * args.dim, generator=gen) * 0.01).to(dtype)
    w_o = (torch.randn(hidden, hidden, generator=gen) * 0.01).to(dtype)
    x = torch.randn(1, hidden, generator=gen).to(dtype)
    q = torch.randn(1, args.heads, 1, args.dim, generator=gen).to(dtype)
    k, v = (torch.randn(1, args.kv_heads, args.cached, args.dim, generator=gen).to(dtype) for _ in range(2))

    def tileattn_attention():
        return tileattn.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    def sdpa_attention():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    def decode_step(runtime):
        """The attention's milliseconds in one decode step."""
        x @ w_qkv  # the projection before: torch's threads poll after it
        start = time.perf_counter()
        o = tileattn_attention() if runtime else sdpa_attention()
        elapsed = time.perf_counter() - start
        o.reshape(1, -1)[:, :hidden] @ w_o
        return elapsed * 1e3

    with torch.inference_mode():
        medians = take_turns(decode_step, args.steps)
    report(f"decode step: {args.heads} heads / {args.kv_heads} KV heads, D {args.dim}, {args.cached} cached tokens, "
           f"{args.dtype}, {threads} threads, {args.steps} steps (attention alone; medians)", medians, "ms", 3)


# name: tileattn's thread runtime, or None for SDPA
CONTENDERS = {"tileattn openmp": "openmp", "tileattn pool": "pool", "torch sdpa": None}


def take_turns(step, steps):
    """Runs step(runtime) for every contender, steps + 1 rounds (the first warms every path
    up), the contenders' order rotating round by round; returns each one's median of the
    milliseconds step() returned."""
    names = list(CONTENDERS)
    times = {name: [] for name in names}
    for i in range(steps + 1):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            if CONTENDERS[name]:
                tileattn.set_thread_runtime(CONTENDERS[name])
            ms = step(CONTENDERS[name])
            if i > 0:
                times[name].append(ms)
    tileattn.set_thread_runtime("auto")
    return {name: statistics.median(t) for name, t in times.items()}


def report(title, medians, unit, digits):
    print(title)
    for name, ms in medians.items():
        print(f"  {name:16s} {ms:8.{digits}f} {unit}")
    print(f"  pool / openmp: {medians['tileattn pool'] / medians['tileattn openmp']:.2f}   "
          f"sdpa / tileattn openmp: {medians['torch sdpa'] / medians['tileattn openmp']:.2f}")


def train_steps(args, dtype, threads):
    """Training steps of one attention block over args.train tokens, the three contenders
    taking turns; prints the medians of the whole steps."""
    gen = torch.Generator().manual_seed(0)
    h, hkv, d, n = args.heads, args.kv_heads, args.dim, args.train
    hidden = h * d
    x = torch.randn(1, n, hidden, generator=gen).to(dtype)
    w_qkv = (torch.randn(hidden, (h + 2 * hkv) * d, generator=gen) * 0.02).to(dtype).requires_grad_()
    w_o = (torch.randn(hidden, hidden, generator=gen) * 0.02).to(dtype).requires_grad_()

    def step(runtime):
        q, k, v = (x @ w_qkv).split([h * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(1, n, h, d), k.view(1, n, hkv, d), v.view(1, n, hkv, d)
        if runtime:
            o = tileattn.flash_attention(q, k, v, is_causal=True, layout="bshd")
        else:
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True).transpose(1, 2)
        (o.reshape(1, n, hidden) @ w_o).float().square().mean().backward()

    def timed_step(runtime):
        start = time.perf_counter()
        step(runtime)
        return (time.perf_counter() - start) * 1e3

    medians = take_turns(timed_step, args.steps)
    report(f"training step: {h} heads / {hkv} KV heads, D {d}, {n} tokens causal, {args.dtype}, {threads} threads, "
           f"{args.steps} steps (projections, attention, backward; medians)", medians, "ms", 2)


if __name__ == "__main__":
    main()
