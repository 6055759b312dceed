"""A causal (and a left-padded causal) mask given as a boolean tensor against is_causal, in one
process: what boolean_mask_tile (src/core/mask_row.hpp) saves. B1 H8 N2048 D128, 2 threads,
medians of 7 calls, two rounds; with --backward each call is the forward and its backward
through autograd.

    .venv/bin/python bench/mask_tiles.py [fp32|bf16] [--backward]
"""
import sys
import time

import torch

import tileattn


def median_ms(f):
    f()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[3] * 1e3


def main():
    torch.set_num_threads(2)
    b, h, n, d = 1, 8, 2048, 128
    dtype = torch.bfloat16 if "bf16" in sys.argv[1:] else torch.float32
    backward = "--backward" in sys.argv[1:]
    q, k, v = (torch.randn(b, h, n, d).to(dtype).requires_grad_(backward) for _ in range(3))
    grad = torch.randn(b, h, n, d).to(dtype)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    padded = causal.clone()
    padded[:, :512] = False  # 512 left-padding keys

    def call(**options):
        o = tileattn.flash_attention(q, k, v, **options)
        if backward:
            o.backward(grad)

    for _ in range(2):
        flag = median_ms(lambda: call(is_causal=True))
        mask = median_ms(lambda: call(attn_mask=causal))
        pad = median_ms(lambda: call(attn_mask=padded))
        none = median_ms(lambda: call())
        print(f"{dtype}{' forward + backward' if backward else ''}: is_causal {flag:.1f} ms, boolean causal mask {mask:.1f} ({mask / flag:.2f}x), "
              f"with 512 padding keys {pad:.1f} ({pad / flag:.2f}x), no mask {none:.1f}")


if __name__ == "__main__":
    main()
