#!/usr/bin/env python3
"""Paired timing of tileattn against PyTorch SDPA and OpenVINO SDPA, bf16 and fp32.

Everything runs in ONE process on the same tensors, interleaved call by call:
for each shape, every round times one call of each (implementation, dtype),
in an order that rotates from round to round, so that load from other work on
the machine falls on all of them alike; the result is the median over rounds.
Before each timed call the process sleeps --gap-ms (20 ms): the three thread
pools in it (tileattn's, PyTorch's OpenMP, OpenVINO's TBB) each poll for a
while after their work, and a pool still polling would take a core from the
next library's call.
A machine that is busy still slows every number, but the ratios of one run
stay comparable.

  tileattn   tileattn.flash_attention: torch bf16 tensors for bf16, NumPy
             float32 arrays for fp32 ([B, H, N, D]; GQA native);
  sdpa       torch.nn.functional.scaled_dot_product_attention (bf16, fp32;
             GQA with enable_gqa=True, causal with is_causal);
  openvino   a one-node OpenVINO model of opset-13 ScaledDotProductAttention,
             compiled for "CPU" with NUM_STREAMS 1, INFERENCE_NUM_THREADS =
             --threads and INFERENCE_PRECISION_HINT bf16 (bf16 parameters) or
             f32 (the model bench/sweep_peers.py times; GQA repeats K/V in the
             graph, see there).

Ratios are peer_ms / tileattn_ms: above 1, tileattn is faster. Each shape also
gives tileattn's bf16 speedup over its own fp32: the fp32 median over the bf16
median, and the median over rounds of the two calls' ratio within a round
(paired: the two ran seconds apart, so slow drifts in the machine's load
cancel). The geometric
means are the ones issue 21 asks for:
  vs SDPA bf16      over H32 N2048 D128, causal GQA 32/8 at N=2048 and 4096,
                    H16 N4096 D64;
  vs OpenVINO bf16  over H32 N2048 D128, H16 N4096 D64, H8 N4096 D128 causal;
  vs OpenVINO fp32  over the shapes without a mask.
Usage:

    PYTHONPATH=<tileattn package> .venv/bin/python bench/compare_bf16.py [--rounds 7]
        [--threads 2] [--gap-ms 20] [--shapes KEY,...] [--json out.json] [--quick] [--check]
        [--bf16-probabilities]

--bf16-probabilities times tileattn's bf16 calls with P rounded to bf16 for P V
(tileattn.set_bf16_probabilities(True)), as FlashAttention-2, SDPA and OpenVINO
round it; outside tileattn's accuracy promise (docs/accuracy.md).
--quick runs small shapes (seconds; for tests); --check first asserts that
every peer's output matches tileattn's (max abs difference below 2e-2 for bf16,
1e-4 for fp32; inputs uniform in [-1, 1]) and exits 1 if one does not.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_peers  # noqa: E402  (the OpenVINO model and its bf16 tensors)

# (key, label, heads, kv_heads, N, D, causal). Batch 1.
SHAPES = [
    ("h32_n2048_d128", "H32 N2048 D128", 32, 32, 2048, 128, False),
    ("gqa_n2048", "causal GQA 32/8 N2048 D128", 32, 8, 2048, 128, True),
    ("gqa_n4096", "causal GQA 32/8 N4096 D128", 32, 8, 4096, 128, True),
    ("h16_n4096_d64", "H16 N4096 D64", 16, 16, 4096, 64, False),
    ("h8_n4096_d128_causal", "H8 N4096 D128 causal", 8, 8, 4096, 128, True),
    ("h8_n4096_d128", "H8 N4096 D128", 8, 8, 4096, 128, False),
]
# The same roles, small enough for a test: the geometric means keep their meaning.
QUICK_SHAPES = [
    ("h32_n2048_d128", "H4 N128 D64", 4, 4, 128, 64, False),
    ("gqa_n2048", "causal GQA 4/2 N128 D64", 4, 2, 128, 64, True),
    ("gqa_n4096", "causal GQA 4/2 N256 D64", 4, 2, 256, 64, True),
    ("h16_n4096_d64", "H2 N256 D32", 2, 2, 256, 32, False),
    ("h8_n4096_d128_causal", "H2 N256 D64 causal", 2, 2, 256, 64, True),
    ("h8_n4096_d128", "H2 N256 D64", 2, 2, 256, 64, False),
]
# tileattn's own bf16 speedup over its fp32 (issue 21: >= 4x on AMX CPUs, >= 1.7x
# on AVX512-BF16 ones, B1 H8 N4096 D128 without a mask and causal).
OWN_SPEEDUP_SHAPES = ["h8_n4096_d128", "h8_n4096_d128_causal"]
GEOMEANS = [
    ("sdpa", "bf16", ["h32_n2048_d128", "gqa_n2048", "gqa_n4096", "h16_n4096_d64"],
     "vs SDPA bf16 (H32 N2048 D128; causal GQA 32/8 N2048, N4096; H16 N4096 D64)"),
    ("openvino", "bf16", ["h32_n2048_d128", "h16_n4096_d64", "h8_n4096_d128_causal"],
     "vs OpenVINO bf16 (H32 N2048 D128; H16 N4096 D64; H8 N4096 D128 causal)"),
    ("openvino", "fp32", None, "vs OpenVINO fp32 (shapes without a mask)"),
]
IMPLS = ("tileattn", "sdpa", "openvino")
DTYPES = ("bf16", "fp32")
TOLERANCE = {"bf16": 2e-2, "fp32": 1e-4}


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def case_of(shape, dtype, threads):
    """The shape as a bench/sweep_peers.py case (for its OpenVINO model)."""
    _, _, h, hkv, n, d, causal = shape
    return {"pass": "forward", "dim": d, "mask": "causal" if causal else "none", "dtype": dtype, "seq": n,
            "batch": 1, "heads": h, "kv_heads": hkv, "window_left": -1, "window_right": 0 if causal else -1,
            "threads": threads}


class Runner:
    """One (implementation, dtype) on one shape: `call()` runs it once and
    returns the output (any type); `output(o)` makes it float32 NumPy."""

    def __init__(self, call, output, detail=""):
        self.call, self.output, self.detail = call, output, detail


def make_runners(shape, threads, have_openvino, bf16_probabilities=False):
    import torch
    import torch.nn.functional as F
    import tileattn

    _, _, h, hkv, n, d, causal = shape
    q, k, v, _ = sweep_peers.make_inputs(case_of(shape, "fp32", threads))  # uniform [-1, 1), [B, H, N, D]
    runners = {}
    for dtype in DTYPES:
        tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        tq, tk, tv = (torch.from_numpy(a).to(tdtype) for a in (q, k, v))
        if dtype == "bf16":
            def ta(tq=tq, tk=tk, tv=tv):
                tileattn.set_bf16_probabilities(bf16_probabilities)
                try:
                    return tileattn.flash_attention(tq, tk, tv, is_causal=causal)
                finally:
                    tileattn.set_bf16_probabilities(False)
            ta_out = lambda o: o.float().numpy()  # noqa: E731
            ta_detail = "torch bf16 tensors" + (", P rounded to bf16" if bf16_probabilities else "")
        else:
            def ta():
                return tileattn.flash_attention(q, k, v, is_causal=causal)
            ta_out = lambda o: o  # noqa: E731
            ta_detail = "NumPy float32"
        runners[("tileattn", dtype)] = Runner(ta, ta_out, ta_detail)

        def sdpa(tq=tq, tk=tk, tv=tv):
            with torch.inference_mode():
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=hkv != h)
        runners[("sdpa", dtype)] = Runner(sdpa, lambda o: o.float().numpy())

        if have_openvino:
            case = case_of(shape, dtype, threads)
            compiled, _ = sweep_peers.openvino_compile(case, None, causal)
            request = compiled.create_infer_request()
            for name, array in (("Q", q), ("K", k), ("V", v)):
                request.set_tensor(name, sweep_peers.openvino_tensor(array, dtype))

            def ov_call(request=request):
                request.infer()
                return request.get_output_tensor(0)
            runners[("openvino", dtype)] = Runner(
                ov_call, lambda o, dtype=dtype: sweep_peers.openvino_output(o, dtype).copy(),
                sweep_peers.openvino_runtime_graph(compiled))
    return runners


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed calls of each (impl, dtype) per shape")
    parser.add_argument("--bf16-probabilities", action="store_true",
                        help="tileattn's bf16 calls round P to bf16 (tileattn.set_bf16_probabilities), as "
                             "its peers do; outside tileattn's accuracy promise")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gap-ms", type=float, default=20.0,
                        help="sleep before each timed call, so the previous library's threads stop polling")
    parser.add_argument("--quick", action="store_true", help="small shapes (seconds)")
    parser.add_argument("--check", action="store_true",
                        help="assert that every peer's output matches tileattn's before timing")
    parser.add_argument("--shapes", default="", help="comma-separated shape keys to run (default all): "
                        + ", ".join(s[0] for s in SHAPES))
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threads < 1 or args.gap_ms < 0:
        parser.error("--rounds and --threads must be at least 1, --gap-ms at least 0")
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        wanted = args.shapes.split(",")
        unknown = [w for w in wanted if w not in {s[0] for s in shapes}]
        if unknown:
            parser.error(f"--shapes: unknown {', '.join(unknown)} (expected {', '.join(s[0] for s in shapes)})")
        shapes = [s for s in shapes if s[0] in wanted]

    import torch
    import tileattn
    try:
        import openvino
        ov_version = openvino.get_version().split("-")[0]
    except ImportError as e:
        openvino, ov_version = None, f"missing ({e})"
    torch.set_num_threads(args.threads)
    tileattn.set_num_threads(args.threads)
    info = tileattn.info()
    header = {
        "cpu": cpu_model(), "bf16_isa": info.get("bf16_isa"), "isa": info.get("isa"),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "torch": torch.__version__, "openvino": ov_version, "threads": args.threads, "rounds": args.rounds,
        "gap_ms": args.gap_ms, "bf16_probabilities": args.bf16_probabilities,
        "load_average_start": round(os.getloadavg()[0], 2), "quick": args.quick,
    }
    print(f"CPU: {header['cpu']}")
    print(f"tileattn bf16_isa: {header['bf16_isa']} (isa: {header['isa']}); threads {args.threads}; "
          f"{args.rounds} rounds, median; {args.gap_ms:g} ms idle before each call"
          + ("; tileattn bf16: P rounded to bf16 (set_bf16_probabilities)" if args.bf16_probabilities else ""))
    print(f"date: {header['date']}; torch {header['torch']}; openvino {ov_version}; "
          f"load average {header['load_average_start']}")
    print("ratio = peer ms / tileattn ms (> 1: tileattn faster)")

    results, failures, own_speedups = [], [], []
    for shape in shapes:
        key, label = shape[0], shape[1]
        runners = make_runners(shape, args.threads, openvino is not None, args.bf16_probabilities)
        order = list(runners)
        outputs = {name: r.call() for name, r in runners.items()}  # warm-up (pools, lazy init)
        checks = {}
        for (impl, dtype), out in outputs.items():
            if impl == "tileattn":
                continue
            ref = runners[("tileattn", dtype)].output(outputs[("tileattn", dtype)])
            got = runners[(impl, dtype)].output(out)
            diff = float(abs(got.astype("float64") - ref).max()) if got.shape == ref.shape else float("inf")
            checks[(impl, dtype)] = diff
            if args.check and not diff < TOLERANCE[dtype]:
                failures.append(f"{label} {dtype}: {impl} differs from tileattn by {diff:.3g} "
                                f"(shape {got.shape} vs {ref.shape}; tolerance {TOLERANCE[dtype]})")
        del outputs
        times = {name: [] for name in order}
        for r in range(args.rounds):
            shift = r % len(order)
            for name in order[shift:] + order[:shift]:
                time.sleep(args.gap_ms * 1e-3)
                start = time.perf_counter()
                runners[name].call()
                times[name].append((time.perf_counter() - start) * 1e3)
        tileattn_ms = {}  # dtype -> tileattn's median, for its bf16 speedup over fp32 below
        for dtype in DTYPES:
            ms = {impl: statistics.median(times[(impl, dtype)]) for impl in IMPLS if (impl, dtype) in times}
            tileattn_ms[dtype] = ms["tileattn"]
            row = {"shape": key, "label": label, "dtype": dtype, "heads": shape[2], "kv_heads": shape[3],
                   "seq": shape[4], "dim": shape[5], "causal": shape[6], "ms": ms,
                   "ratio": {impl: ms[impl] / ms["tileattn"] for impl in ms if impl != "tileattn"},
                   "max_abs_diff": {impl: checks[(impl, dtype)] for impl in ms if impl != "tileattn"},
                   "spread_ms": {impl: [min(times[(impl, dtype)]), max(times[(impl, dtype)])] for impl in ms},
                   "detail": {impl: runners[(impl, dtype)].detail for impl in ms if runners[(impl, dtype)].detail}}
            results.append(row)
            peers = "  ".join(f"{impl} {ms[impl]:8.2f} ms ({row['ratio'][impl]:.2f}x, "
                              f"diff {row['max_abs_diff'][impl]:.1e})" for impl in ms if impl != "tileattn")
            print(f"{label:28} {dtype:4}  tileattn {ms['tileattn']:8.2f} ms  {peers}", flush=True)
        own = [f / b for f, b in zip(times[("tileattn", "fp32")], times[("tileattn", "bf16")])]
        speedup = {"shape": key, "label": label,
                   "ratio_of_medians": tileattn_ms["fp32"] / tileattn_ms["bf16"],
                   "paired_median": statistics.median(own), "paired_min_max": [min(own), max(own)]}
        own_speedups.append(speedup)
        print(f"{label:28} tileattn bf16 over fp32: {speedup['paired_median']:.2f}x paired "
              f"({min(own):.2f}-{max(own):.2f}), {speedup['ratio_of_medians']:.2f}x of the medians", flush=True)
        del runners

    print("geometric means of the ratios (> 1: tileattn faster):")
    means = []
    for impl, dtype, keys, what in GEOMEANS:
        rows = [r for r in results if r["dtype"] == dtype and impl in r["ratio"]
                and (r["shape"] in keys if keys else not r["causal"])]
        value = geomean([r["ratio"][impl] for r in rows])
        means.append({"impl": impl, "dtype": dtype, "what": what, "shapes": [r["label"] for r in rows],
                      "geomean": value})
        missing = "n/a (openvino missing)" if impl == "openvino" and openvino is None else "n/a (none of its shapes ran)"
        print(f"  {what}: " + (f"{value:.2f}x" if value else missing) +
              (f"  [{', '.join(r['label'] for r in rows)}]" if args.quick else ""))
    own_rows = [r for r in own_speedups if r["shape"] in OWN_SPEEDUP_SHAPES]
    print("  tileattn bf16 over its fp32, paired (issue 21: >= 4x on AMX, >= 1.7x on AVX512-BF16): " +
          (", ".join(f"{r['label']} {r['paired_median']:.2f}x" for r in own_rows) or "n/a (none of its shapes ran)"))
    header["load_average_end"] = round(os.getloadavg()[0], 2)
    print(f"load average at the end: {header['load_average_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "tileattn-compare-bf16/1", "command": " ".join(["bench/compare_bf16.py"] + (sys.argv[1:] if argv is None else list(argv))),
                       "machine": header, "rows": results, "geomeans": means,
                       "tileattn_bf16_over_fp32": own_speedups,
                       "check_failures": failures}, f, indent=1)
            f.write("\n")
    if failures:
        print("check FAILED:", file=sys.stderr)
        for line in failures:
            print("  " + line, file=sys.stderr)
        return 1
    if args.check:
        print("check: every peer's output matches tileattn's (bf16 < 2e-2, fp32 < 1e-4 max abs difference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
