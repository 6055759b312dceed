"""Python call overhead of tileattn's functions: what a call costs beyond the C++ kernel.

Every number is wall time from CLOCK_MONOTONIC (time.perf_counter_ns in Python, the same
clock inside the binding), read in user space for ~25 ns; threads = 1 (the kernel runs on the
calling thread), and the medians drop the calls a busy machine preempted. (Until 2026-11-30
this was the thread's CPU clock: a system call, whose cost right after a decode-sized kernel,
2-8 us for the two reads inside the binding, was counted as call overhead.) Each repetition makes, in alternating order, one pair of calls of the
same problem:

  call:   the public function (tileattn.flash_attention / tileattn.attention_with_kvcache),
          timed from Python around the call (minus the cost of reading the clock);
  direct: the raw-address binding with every argument prepared once, i.e. what a C++ caller
          pays: only the library call, timed inside the binding.

The binding also times the library call inside the public call (_tileattn.time_kernel), so
two differences are formed per pair and their medians reported:

  outside = call - kernel time in that same call: the time the calling thread spends outside
            the library call (Python, argument reading, allocation, and everything those run
            slower because the kernel just evicted them from the caches);
  vs C++  = call - direct: the same against a separate C++ call of the same problem; it also
            counts any slowdown of the kernel itself caused by the Python work around it.

Each case repeats its own call, as a decode loop does (with --interleave the cases of one
shape take turns pair by pair instead, so that they all see the same machine, at the price of
evicting each other's code). Medians over many pairs ignore the preemptions and cache storms
other processes cause; a run is repeated `--rounds` times and the median [min-max] over the
rounds' medians is printed. The first row of each shape, the raw binding timed against itself,
is the floor: what any Python call of the library costs (argument conversion, the GIL release,
reading the clock after the kernel).

    .venv/bin/python python/benchmarks/call_overhead.py [--rounds 5] [--pairs 200] [--only decode|scan]
    .venv/bin/python python/benchmarks/call_overhead.py --dropins   # drop-in vs native, per call
"""
import argparse
import time

import numpy as np
import torch

import tileattn
from tileattn import _arrays
from tileattn._module import rope_tables
from tileattn import _tileattn as _C

_clock = time.perf_counter_ns


def clock_cost_ns(n=2000):
    """What reading the clock twice adds to a measured interval."""
    return float(np.median([-_clock() + _clock() for _ in range(n)]))


def pair(call, direct, first, clock_ns):
    """One pair, the direct call first or second: (call ns, kernel ns inside the call, direct ns)."""
    _C.time_kernel(True)
    if first:
        direct()
        direct_ns = _C.time_kernel(True) * 1e9
    t0 = _clock()
    call()
    t1 = _clock()
    kernel_ns = _C.time_kernel(True) * 1e9
    if not first:
        direct()
        direct_ns = _C.time_kernel(True) * 1e9
    return t1 - t0 - clock_ns, kernel_ns, direct_ns


def rounds_of(group, n, rounds, clock_ns):
    """Per case of the group: a list with one (n, 3) array per round. The cases of a group take
    turns pair by pair, so that all of them see the same machine (load, other processes'
    cache traffic): on this shared machine the kernel's own time moves by 2x within minutes."""
    for _, _, call, direct in group:
        for _ in range(10):
            call()
            direct()
    out = [[] for _ in group]
    for _ in range(rounds):
        samples = np.empty((len(group), n, 3))
        for i in range(n):
            for c, (_, _, call, direct) in enumerate(group):
                samples[c, i] = pair(call, direct, i % 2 == 1, clock_ns)
        for c in range(len(group)):
            out[c].append(samples[c] / 1e3)
    _C.time_kernel(False)
    return out


def strides(x):
    return _arrays.element_strides("x", x)


def forward_direct(q, k, v, o, lse):
    """_C.forward (attention_forward on raw addresses) with arguments prepared once."""
    addr = _arrays.address
    b, h, nq, d = q.shape
    args = (_arrays.F32, (b, h, k.shape[1], nq, k.shape[2], d), addr(q), strides(q), addr(k),
            strides(k), addr(v), strides(v), addr(o), strides(o), addr(lse), strides(lse),
            0, 0, (0, 0, 0, 1), True, -1, -1, d ** -0.5, 0.0, 0, 1)
    keep = (q, k, v, o, lse)  # the addresses are only valid while these live
    return lambda: _C.forward(*args) if keep else None


def kvcache_direct(q, k_cache, v_cache, k, v, cos, sin, seqlen, o, lse):
    """_C.attention_with_kvcache on raw addresses with arguments prepared once; the cache
    lengths (which the kernel advances) are reset outside the timed library call."""
    addr = _arrays.address
    b, h, nq, d = q.shape
    seqlens = np.full(b, seqlen, np.int32)
    args = (_arrays.F32, (b, h, k_cache.shape[1], d, nq, k.shape[2]), addr(q), strides(q),
            addr(o), strides(o), addr(lse), strides(lse), addr(k_cache), strides(k_cache),
            addr(v_cache), strides(v_cache), (k_cache.shape[2], 0, 0, 0), addr(seqlens), 0,
            addr(k), strides(k), addr(v), strides(v), addr(cos), addr(sin),
            (2 * cos.shape[1], cos.shape[0]), False, d ** -0.5, True, -1, -1, 1)

    keep = (q, k_cache, v_cache, k, v, cos, sin, o, lse)  # the addresses are only valid while these live

    def run():
        seqlens[:] = seqlen
        _C.attention_with_kvcache(*args)
        return keep
    return run


def cases(only):
    """(group, label, call, direct) for every case; a group is one problem shape."""
    g = torch.Generator().manual_seed(0)
    out = []
    shapes = [("decode H=32/8 Nk=1024", (32, 8, 1024)), ("tiny H=1 Nk=1", (1, 1, 1))]
    if only == "scan":  # the overhead against the KV length (how much the kernel evicts)
        shapes = [(f"decode H=32/8 Nk={n}", (32, 8, n)) for n in (16, 128, 512, 1024, 4096)]
        only = ""
    for name, (h, hk, nk) in shapes:
        if only and only not in name:
            continue
        q = torch.randn(1, h, 1, 128, generator=g)
        k = torch.randn(1, hk, nk, 128, generator=g)
        v = torch.randn(1, hk, nk, 128, generator=g)
        o, lse = torch.empty_like(q), torch.empty(1, h, 1)
        direct = forward_direct(q, k, v, o, lse)
        # The floor: the raw-address binding called from Python with its arguments prepared
        # once (nanobind's argument conversion, the GIL release, nothing else).
        out.append((name, f"raw binding _C.forward {name} (floor)", direct, direct))
        for fw, (qq, kk, vv) in (("torch", (q, k, v)), ("numpy", (q.numpy(), k.numpy(), v.numpy()))):
            out.append((name, f"flash_attention {name} {fw}",
                        lambda qq=qq, kk=kk, vv=vv: tileattn.flash_attention(qq, kk, vv, is_causal=True),
                        direct))
            # The same call writing an output the loop reuses (out=): no allocation.
            buf = torch.empty_like(q) if fw == "torch" else np.empty(q.shape, np.float32)
            out.append((name, f"flash_attention {name} {fw} out=",
                        lambda qq=qq, kk=kk, vv=vv, buf=buf: tileattn.flash_attention(
                            qq, kk, vv, is_causal=True, out=buf),
                        direct))
        if nk > 1:
            # A decode step of a Llama-style layer (what tileattn.FlashAttention's
            # incremental_forward calls): append one token at position nk - 1 of a cache of
            # capacity 2 * nk with RoPE applied in the kernel, attend to the nk tokens.
            k_cache = torch.randn(1, hk, 2 * nk, 128, generator=g)
            v_cache = torch.randn(1, hk, 2 * nk, 128, generator=g)
            k1, v1 = k[:, :, :1].clone(), v[:, :, :1].clone()
            cos, sin = (t.contiguous() for t in rope_tables(500000.0, 2 * nk, 128))
            seqlen = nk - 1
            direct = kvcache_direct(q, k_cache, v_cache, k1, v1, cos, sin, seqlen, o, lse)
            arrays = (q, k_cache, v_cache, k1, v1, cos, sin)
            for fw, a in (("torch", arrays), ("numpy", tuple(x.numpy() for x in arrays))):
                out.append((name, f"attention_with_kvcache {name} RoPE {fw}",
                            lambda a=a, n=seqlen: tileattn.attention_with_kvcache(
                                a[0], a[1], a[2], a[3], a[4], cache_seqlens=n,
                                rotary_cos=a[5], rotary_sin=a[6]),
                            direct))
                buf = torch.empty_like(q) if fw == "torch" else np.empty(q.shape, np.float32)
                out.append((name, f"attention_with_kvcache {name} RoPE {fw} out=",
                            lambda a=a, n=seqlen, buf=buf: tileattn.attention_with_kvcache(
                                a[0], a[1], a[2], a[3], a[4], cache_seqlens=n,
                                rotary_cos=a[5], rotary_sin=a[6], out=buf),
                            direct))
        if not only or "SDPA" in only:
            out.append((name, f"torch SDPA {name} (whole call)",
                        lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, enable_gqa=True),
                        lambda: None))
    return out


def outside_ns(call, clock_ns):
    """One call: its wall time minus the library time inside it (ns)."""
    _C.time_kernel(True)
    t0 = _clock()
    call()
    t1 = _clock()
    return t1 - t0 - clock_ns - _C.time_kernel(True) * 1e9


def dropin_cases():
    """(label, native call, drop-in call) on the same tensors, for --dropins: each drop-in
    against the native entry it wraps, called with the same arrays in the same layout, so the
    difference is the drop-in's own Python layer."""
    g = torch.Generator().manual_seed(0)
    out = []
    for name, (h, hk, nq, nk) in (("tiny H=1 Nk=1", (1, 1, 1, 1)), ("decode H=32/8 Nk=1024", (32, 8, 1, 1024))):
        q = torch.randn(1, h, nq, 128, generator=g)
        k = torch.randn(1, hk, nk, 128, generator=g)
        v = torch.randn(1, hk, nk, 128, generator=g)
        out.append((f"scaled_dot_product_attention {name} torch", lambda q=q, k=k, v=v: tileattn.flash_attention(q, k, v),
                    lambda q=q, k=k, v=v: tileattn.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
        qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # FA2's [B, N, H, D]
        out.append((f"flash_attn_func {name} torch",
                    lambda qb=qb, kb=kb, vb=vb: tileattn.flash_attention(qb, kb, vb, is_causal=True, layout="bshd"),
                    lambda qb=qb, kb=kb, vb=vb: tileattn.flash_attn_func(qb, kb, vb, causal=True)))
        qp, kp, vp = qb[0], kb[0], vb[0]  # packed [total, H, D], one sequence
        cq, ck = torch.tensor([0, nq], dtype=torch.int32), torch.tensor([0, nk], dtype=torch.int32)
        out.append((f"flash_attn_varlen_func {name} torch",
                    lambda qp=qp, kp=kp, vp=vp, cq=cq, ck=ck: tileattn.flash_attention(
                        qp, kp, vp, is_causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=nq, max_seqlen_k=nk),
                    lambda qp=qp, kp=kp, vp=vp, cq=cq, ck=ck, nq=nq, nk=nk: tileattn.flash_attn_varlen_func(
                        qp, kp, vp, cq, ck, nq, nk, causal=True)))
        if nk > 1:
            # FA2's cache [B, S, Hkv, D]: one token appended at nk - 1 with RoPE (GPT-J pairs, FA2's default).
            kc = torch.randn(1, 2 * nk, hk, 128, generator=g)
            vc = torch.randn(1, 2 * nk, hk, 128, generator=g)
            k1, v1 = kb[:, :1].clone(), vb[:, :1].clone()
            cos, sin = (t.contiguous() for t in rope_tables(500000.0, 2 * nk, 128))
            tr = lambda t: t.transpose(1, 2)  # noqa: E731
            out.append((f"flash_attn_with_kvcache {name} RoPE torch",
                        lambda qb=qb, kc=kc, vc=vc, k1=k1, v1=v1, cos=cos, sin=sin, n=nk - 1: tileattn.attention_with_kvcache(
                            tr(qb), tr(kc), tr(vc), tr(k1), tr(v1), cache_seqlens=n, rotary_cos=cos, rotary_sin=sin,
                            rotary_interleaved=True),
                        lambda qb=qb, kc=kc, vc=vc, k1=k1, v1=v1, cos=cos, sin=sin, n=nk - 1: tileattn.flash_attn_with_kvcache(
                            qb, kc, vc, k1, v1, cos, sin, cache_seqlens=n, causal=True)))
    return out


def run_dropins(rounds, pairs, clock_ns):
    """Prints, per drop-in, the time outside the kernel of the native call and of the drop-in
    (medians over `pairs` alternating pairs) and their difference, per round."""
    print(f"{'drop-in vs the native entry it wraps':52s} {'native':>16s} {'drop-in':>16s} {'added':>16s}")

    def fmt(values):
        return f"{np.median(values):6.2f} [{min(values):.2f}-{max(values):.2f}]"

    for label, native, dropin in dropin_cases():
        for _ in range(20):
            native()
            dropin()
        n = pairs * (10 if "tiny" in label else 1)
        per_round = []
        for _ in range(rounds):
            samples = np.empty((n, 2))
            for i in range(n):
                order = (0, 1) if i % 2 else (1, 0)
                for j in order:
                    samples[i, j] = outside_ns((native, dropin)[j], clock_ns) / 1e3
            per_round.append((float(np.median(samples[:, 0])), float(np.median(samples[:, 1])),
                              float(np.median(samples[:, 1] - samples[:, 0]))))
        cols = list(zip(*per_round))
        print(f"{label:52s} {fmt(cols[0]):>16s} {fmt(cols[1]):>16s} {fmt(cols[2]):>16s}")
    _C.time_kernel(False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=200, help="pairs per round (x10 for tiny cases)")
    parser.add_argument("--only", default="", help="run the cases whose label contains this "
                        "('scan': decode shapes with Nk = 16 .. 4096)")
    parser.add_argument("--interleave", action="store_true",
                        help="the cases of one shape take turns pair by pair")
    parser.add_argument("--dropins", action="store_true",
                        help="only the drop-ins (scaled_dot_product_attention, flash_attn_*) against the "
                        "native entries they wrap: time outside the kernel of each and the difference")
    args = parser.parse_args()
    tileattn.set_num_threads(1)
    torch.set_num_threads(1)
    clock_ns = clock_cost_ns()
    if args.dropins:
        print(f"clock read: {clock_ns:.0f} ns per pair of reads (subtracted); outside the kernel, median "
              f"[min-max] over {args.rounds} rounds of the per-pair medians, us")
        run_dropins(args.rounds, args.pairs, clock_ns)
        return
    print(f"clock read: {clock_ns:.0f} ns per pair of reads (subtracted); "
          f"median [min-max] over {args.rounds} rounds, us")
    print(f"{'case':52s} {'call':>18s} {'kernel':>18s} {'outside':>16s} {'vs C++':>16s}")

    def fmt(values):
        return f"{np.median(values):6.1f} [{min(values):.1f}-{max(values):.1f}]"

    groups = {}
    for case in cases(args.only):
        groups.setdefault(case[0] if args.interleave else case[1], []).append(case)
    for group in groups.values():
        n = args.pairs * (10 if "tiny" in group[0][0] else 1)
        for (_, label, _, _), rounds in zip(group, rounds_of(group, n, args.rounds, clock_ns)):
            med = lambda f: [float(np.median(f(r))) for r in rounds]  # noqa: E731
            call_us = med(lambda r: r[:, 0])
            if "SDPA" in label:
                print(f"{label:52s} {fmt(call_us):>18s}")
                continue
            print(f"{label:52s} {fmt(call_us):>18s} {fmt(med(lambda r: r[:, 1])):>18s} "
                  f"{fmt(med(lambda r: r[:, 0] - r[:, 1])):>16s} "
                  f"{fmt(med(lambda r: r[:, 0] - r[:, 2])):>16s}")

if __name__ == "__main__":
    main()
