#!/usr/bin/env python3
"""Regenerates the benchmark report from scratch: measured runs -> plots + table.

Runs `tileattn bench --sweep` (tileattn and the naive OpenBLAS baseline) and
bench/sweep_peers.py (PyTorch SDPA, ONNX Runtime, OpenVINO SDPA; each only
where installed, a 'missing' row with the reason otherwise)
over the grid below, with one FMA peak measured at the start for every row,
merges the rows into bench/results/results.json and .csv, and runs
bench/report.py: docs/img/bench_*.png, bench/results/report.md and the table
in docs/benchmarks.md. Sized to finish in under 15 minutes on a 2-core
desktop CPU that nothing else is using. Usage:

    python3 bench/run_report.py [--binary build/bin/tileattn] [--python .venv/bin/python]
                                [--quick] [--out-dir bench/results] [--img-dir docs/img]

--quick runs a tiny grid (seconds) into build/report-quick, to check the
tooling; scripts/bench_report.sh builds first and then runs this.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import sweep_common as common  # noqa: E402

SEQS = "512,1024,2048,4096,8192,16384"
# (what, grid flags shared by both drivers). Batch 1, 4 heads, every thread.
# The naive baseline stops where its N x N scores pass 1100 MB (N = 16384
# forward is 1024 MB; the backward keeps two matrices); ONNX Runtime keeps the
# scores of all heads at once and stops at 2100 MB (N = 8192 with 4 heads);
# OpenVINO stops where its one [Nq, Nk] fp32 mask would pass the same 2100 MB
# (never in this grid). bf16 (tileattn on AMX / AVX512-BF16, SDPA, OpenVINO;
# ONNX Runtime has no bf16 CPU kernel) covers no mask and causal: the causal
# half added about 25 s to the report on a 2-core Xeon (see docs/benchmarks.md).
GRID = [
    ("forward", ["--passes", "forward", "--dims", "128", "--masks", "none,causal", "--seqs", SEQS]),
    ("forward, D=64", ["--passes", "forward", "--dims", "64", "--masks", "none,causal",
                       "--seqs", "512,1024,2048,4096,8192"]),
    ("forward, sliding window", ["--passes", "forward", "--dims", "128", "--masks", "window",
                                 "--seqs", "512,1024,2048,4096,8192"]),
    ("forward, bf16", ["--passes", "forward", "--dims", "128", "--masks", "none,causal", "--dtypes", "bf16",
                       "--seqs", "512,1024,2048,4096"]),
    ("backward", ["--passes", "backward", "--dims", "128", "--masks", "none,causal",
                  "--seqs", "512,1024,2048,4096"]),
    ("decode", ["--passes", "decode", "--dims", "128", "--masks", "none", "--seqs", SEQS]),
]
QUICK_GRID = [
    ("quick", ["--passes", "forward,backward,decode", "--dims", "32", "--masks", "none,causal",
               "--seqs", "128,256", "--reps", "2"]),
    ("quick, bf16", ["--passes", "forward", "--dims", "32", "--masks", "none,causal", "--dtypes", "bf16",
                     "--seqs", "128", "--reps", "2"]),
]
COMMON = ["--batch", "1", "--heads", "4", "--window", "256,0"]
MAX_NAIVE_MB = "1100"
MAX_ORT_MB = "2100"


def run(command, quiet_stdout=True):
    print("+ " + " ".join(command), file=sys.stderr)
    r = subprocess.run(command, stdout=subprocess.DEVNULL if quiet_stdout else None)
    return r.returncode


def measured_peak(binary):
    out = subprocess.run([binary, "info", "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["peak_gflops"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(ROOT, "build/bin/tileattn"))
    parser.add_argument("--python", default=os.path.join(ROOT, ".venv/bin/python"),
                        help="interpreter with torch / onnxruntime / openvino (missing ones become 'missing' rows)")
    parser.add_argument("--quick", action="store_true", help="tiny grid into build/report-quick")
    parser.add_argument("--out-dir", default=None, help="results folder (default bench/results)")
    parser.add_argument("--img-dir", default=None, help="plots folder (default docs/img)")
    parser.add_argument("--doc", default=None, help="Markdown file whose table is replaced (default docs/benchmarks.md)")
    args = parser.parse_args(argv)
    if not os.access(args.binary, os.X_OK):
        print(f"run_report.py: no tileattn binary at {args.binary} (scripts/build.sh builds it)", file=sys.stderr)
        return 2
    python = args.python if os.access(args.python, os.X_OK) else sys.executable
    # Per-sweep JSON files go to a temporary folder, removed at the end however
    # the run ends; --quick writes its results under build/report-quick.
    quick_dir = os.path.join(ROOT, "build", "report-quick")
    out_dir = args.out_dir or (quick_dir if args.quick else os.path.join(ROOT, "bench/results"))
    img_dir = args.img_dir or (quick_dir if args.quick else os.path.join(ROOT, "docs/img"))
    doc = args.doc if args.doc is not None else ("" if args.quick else os.path.join(ROOT, "docs/benchmarks.md"))
    os.makedirs(out_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="tileattn_report_")
    try:
        return run_grid(args, python, scratch, out_dir, img_dir, doc)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_grid(args, python, scratch, out_dir, img_dir, doc):

    start = time.monotonic()
    load_start = os.getloadavg()[0]
    peak = measured_peak(args.binary)
    print(f"run_report: FMA peak {peak:.1f} GFLOP/s, load average {load_start:.2f}", file=sys.stderr)
    machine, rows, failures = {}, [], 0
    for index, (what, flags) in enumerate(QUICK_GRID if args.quick else GRID):
        print(f"run_report: {what}", file=sys.stderr)
        cpp_out = os.path.join(scratch, f"tileattn_{index}.json")
        peers_out = os.path.join(scratch, f"peers_{index}.json")
        grid = flags + COMMON + ["--peak-gflops", str(peak)]
        failures += run([args.binary, "bench", "--sweep", *grid, "--max-naive-mb", MAX_NAIVE_MB, "--out", cpp_out]) != 0
        failures += run([python, os.path.join(HERE, "sweep_peers.py"), *grid, "--max-matrix-mb", MAX_ORT_MB,
                         "--out", peers_out]) != 0
        for path in (cpp_out, peers_out):
            if os.path.exists(path):
                m, r = common.read_rows(path)
                for key, value in m.items():
                    machine.setdefault(key, value)
                rows.extend(r)
    elapsed = time.monotonic() - start
    machine["load_average_start"] = load_start
    machine["load_average_end"] = os.getloadavg()[0]
    machine["peak_gflops"] = peak
    machine["report_seconds"] = round(elapsed, 1)
    command = "python3 bench/run_report.py" + (" --quick" if args.quick else "")
    results = os.path.join(out_dir, "results.json")
    common.write_rows(results, command, machine, rows)
    common.write_rows(os.path.join(out_dir, "results.csv"), command, machine, rows)
    report_args = [results, "--img-dir", img_dir, "--table", os.path.join(out_dir, "report.md"),
                   "--command", command]
    if doc:
        report_args += ["--doc", doc]
    # report.py runs under the interpreter that has matplotlib (.venv).
    status = subprocess.run([python, os.path.join(HERE, "report.py"), *report_args]).returncode
    print(f"run_report: {len(rows)} rows in {common.duration(elapsed)} "
          f"(load average {load_start:.2f} -> {machine['load_average_end']:.2f}); results in {out_dir}",
          file=sys.stderr)
    if failures:
        print(f"run_report: {failures} sweep(s) reported failed cases (status 'error' rows)", file=sys.stderr)
    return status or (1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
