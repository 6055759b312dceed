"""Python call overhead of tileattn.flash_attention: what a call costs beyond the C++ kernel.

Two measures, both in the calling thread's CPU time (time.thread_time), so that waiting for a
core on a shared, loaded machine does not count; the kernel runs on the calling thread
(threads = 1):

  overhead = call - kernel: the binding times attention_forward inside the very calls being
      measured (_tileattn.time_kernel), so the kernel's own cost and its variation under load
      cancel out. This is the number that matters for decode-sized calls, where the kernel
      takes milliseconds and a difference of two separate measurements is all noise.
  call - binding: the older measure, the call minus the raw-address binding _tileattn.forward
      on arguments prepared once (what any caller must at least pay), measured separately.

Each number is the median of 5 runs of ~0.5 s.

    .venv/bin/python python/benchmarks/call_overhead.py
"""
import time

import numpy as np
import torch

import tileattn
from tileattn import _arrays, _kernel
from tileattn import _tileattn as _C
from tileattn._problem import to_kernel_order


def per_call_us(fn, seconds=0.5):
    """(thread CPU us per call, of which us in attention_forward)."""
    for _ in range(20):
        fn()
    _C.time_kernel(True)
    n, start = 0, time.thread_time()
    while time.thread_time() - start < seconds:
        for _ in range(50):
            fn()
        n += 50
    total = time.thread_time() - start
    kernel = _C.time_kernel(False)
    return total / n * 1e6, kernel / n * 1e6


def medians(fn, repeats=5):
    runs = [per_call_us(fn) for _ in range(repeats)]
    return (float(np.median([t for t, _ in runs])), float(np.median([k for _, k in runs])),
            float(np.median([t - k for t, k in runs])))


def raw_call(q, k, v, o, lse):
    """The raw-address binding alone, arguments prepared once."""
    addr, es = _arrays.address, _arrays.element_strides
    b, h, nq, d = q.shape
    args = (_kernel.dtype_code(q), (b, h, k.shape[1], nq, k.shape[2], d),
            addr(q), to_kernel_order(es("q", q), 0), addr(k), to_kernel_order(es("k", k), 0),
            addr(v), to_kernel_order(es("v", v), 0), addr(o), to_kernel_order(es("o", o), 0),
            addr(lse), es("lse", lse), 0, 0, (0, 0, 0, 1), True, -1, -1, d ** -0.5, 0.0, 0, 1)
    return lambda: _C.forward(*args)


def main():
    tileattn.set_num_threads(1)
    torch.set_num_threads(1)
    print(f"{'case':44s} {'call us':>9s} {'kernel us':>10s} {'overhead us':>12s} "
          f"{'binding us':>11s} {'call-binding':>13s}")
    for label, (h, hk, nk) in (("decode B=1 H=32/8 Nq=1 Nk=1024 D=128", (32, 8, 1024)),
                               ("tiny B=1 H=1 Nq=1 Nk=1 D=128", (1, 1, 1))):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, h, 1, 128, generator=g)
        k = torch.randn(1, hk, nk, 128, generator=g)
        v = torch.randn(1, hk, nk, 128, generator=g)
        o, lse = torch.empty_like(q), torch.empty(1, h, 1)
        raw, _, _ = medians(raw_call(q, k, v, o, lse))
        for fw, (qq, kk, vv) in (("torch", (q, k, v)), ("numpy", (q.numpy(), k.numpy(), v.numpy()))):
            call, kernel, overhead = medians(lambda: tileattn.flash_attention(qq, kk, vv, is_causal=True))
            print(f"{label + ' ' + fw:44s} {call:9.1f} {kernel:10.1f} {overhead:12.1f} "
                  f"{raw:11.1f} {call - raw:13.1f}")
        sdpa, _, _ = medians(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        print(f"{label + ' torch SDPA':44s} {sdpa:9.1f}")


if __name__ == "__main__":
    main()
