#!/usr/bin/env python3
"""Times other attention libraries on the grid of `tileattn bench --sweep`.

Peers, each only where installed and each labelled with what actually ran:
  torch-sdpa    PyTorch's torch.nn.functional.scaled_dot_product_attention on
                the CPU, with the backend PyTorch picked for the case
                (torch._fused_sdp_choice) and the aten operator that ran (the
                profiler's op name);
  onnxruntime   ONNX Runtime's CPU implementation of the ONNX opset-23
                Attention operator (one-node model built with the onnx package).

Every (peer, case) runs in its own process, forked from a parent that has
imported the peer and run nothing else, so peak_rss_mb is that process's own
ru_maxrss; it includes the library's import (the RSS after import is given in
`detail`). A peer that is not installed
gives rows with status "missing" and the reason; a case a peer cannot run
gives status "unsupported" with the library's own error. Rows have the columns
of `tileattn bench --sweep` (docs/benchmarks.md), so bench/report.py merges
both. Usage:

    .venv/bin/python bench/sweep_peers.py --seqs 512,1024 --dims 64 --masks none,causal \
        --passes forward --impls torch,onnxruntime --peak-gflops 150 --out peers.json
"""
import argparse
import importlib.util
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as common  # noqa: E402

IMPLS = ("torch", "onnxruntime")
ROW_IMPL = {"torch": "torch-sdpa", "onnxruntime": "onnxruntime"}
MODULE = {"torch": "torch", "onnxruntime": "onnxruntime"}
# ONNX Runtime's Attention kernel keeps the scores of every (batch, head) at
# once; above this many MiB of them a case is skipped rather than swapping a
# shared machine (--max-matrix-mb).
DEFAULT_MAX_MATRIX_MB = 4096


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def band_keep(q_len, kv_len, left, right):
    """Boolean [q_len, kv_len], True = visible: key j is visible to query i when
    i + (kv_len - q_len) - left <= j <= i + (kv_len - q_len) + right (-1: unbounded),
    the bottom-right alignment of tileattn's masks."""
    import numpy as np
    center = np.arange(q_len)[:, None] + (kv_len - q_len)
    j = np.arange(kv_len)[None, :]
    keep = np.ones((q_len, kv_len), dtype=bool)
    if left >= 0:
        keep &= j >= center - left
    if right >= 0:
        keep &= j <= center + right
    return keep


def case_band(case):
    """(left, right) of the case's mask, -1 = unbounded."""
    if case["mask"] == "causal":
        return -1, 0
    if case["mask"] == "window":
        return case["window_left"], case["window_right"]
    return -1, -1


def make_inputs(case, seed=1):
    """float32 NumPy q [B, H, Nq, D], k, v [B, HKV, N, D], d_o like q, uniform in [-1, 1)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    b, h, hkv, d = case["batch"], case["heads"], case["kv_heads"], case["dim"]
    nq, nk = common.q_len(case), case["seq"]
    q = rng.uniform(-1, 1, (b, h, nq, d)).astype(np.float32)
    k = rng.uniform(-1, 1, (b, hkv, nk, d)).astype(np.float32)
    v = rng.uniform(-1, 1, (b, hkv, nk, d)).astype(np.float32)
    d_o = rng.uniform(-1, 1, (b, h, nq, d)).astype(np.float32)
    return q, k, v, d_o


def timed(fn, reps):
    fn()  # warm-up: thread pools, allocations, lazy initialisation
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


class Unsupported(Exception):
    """The peer cannot run this case (the message says why)."""


# ---------------------------------------------------------------- PyTorch SDPA

def torch_mask_args(case, device_mask):
    """SDPA's attn_mask / is_causal for the case. PyTorch's is_causal aligns
    top-left, which equals tileattn's bottom-right only when Nq == Nk; other
    bands are passed as an explicit boolean mask (True = keep)."""
    left, right = case_band(case)
    nq, nk = common.q_len(case), case["seq"]
    if left < 0 and right < 0:
        return None, False
    if case["mask"] == "causal" and nq == nk:
        return None, True
    keep = band_keep(nq, nk, left, right)
    if keep.all():
        return None, False  # e.g. causal decode: the one query sees every key
    return device_mask(keep), False


def torch_run(case, reps, want_output=False):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    torch.set_num_threads(case["threads"])
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[case["dtype"]]
    q, k, v, d_o = (torch.from_numpy(a).to(dtype) for a in make_inputs(case))
    attn_mask, is_causal = torch_mask_args(case, lambda keep: torch.from_numpy(keep))
    gqa = case["heads"] != case["kv_heads"]
    kwargs = dict(attn_mask=attn_mask, is_causal=is_causal, enable_gqa=gqa)
    backward = case["pass"] == "backward"
    if backward:
        for t in (q, k, v):
            t.requires_grad_(True)
    try:
        choice = torch._fused_sdp_choice(q, k, v, attn_mask, 0.0, is_causal, enable_gqa=gqa)
        backend = {int(m): name for name, m in SDPBackend.__members__.items()}.get(int(choice), str(choice))
    except Exception as e:  # private API: say so rather than fail
        backend = f"unknown ({type(e).__name__})"

    def forward():
        with torch.inference_mode():
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    out = None
    if backward:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)

        def step():
            return torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True)
    else:
        step = forward
    try:
        if want_output:
            result = step()
            return [t.detach().float().numpy() for t in (result if backward else (result,))]
        ops = profiled_ops(step)
        ms = timed(step, reps)
    except RuntimeError as e:
        raise Unsupported(f"PyTorch: {first_line(e)}")
    kernel = [o for o in ops if "scaled_dot_product" in o and o != "aten::scaled_dot_product_attention"]
    label = f"PyTorch {torch.__version__.split('+')[0]} SDPA ({backend.lower()})"
    detail = f"backend {backend}; ran {', '.join(kernel) or 'no fused op (math path)'}"
    return ms, label, detail


def profiled_ops(fn):
    """Names of the aten operators `fn` runs. The profiler's own start-up lines
    on stderr are silenced."""
    from torch.profiler import profile
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            with profile() as p:
                fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return sorted({e.key for e in p.key_averages()})


# ----------------------------------------------------------- ONNX Runtime

def onnx_attention_model(case, onnx_dtype, with_mask, is_causal):
    from onnx import TensorProto, helper
    names = ["Q", "K", "V"]
    inputs = [helper.make_tensor_value_info(n, onnx_dtype, None) for n in names]
    if with_mask:
        names.append("M")
        inputs.append(helper.make_tensor_value_info("M", TensorProto.BOOL, None))
    node = helper.make_node("Attention", names, ["Y"], is_causal=int(is_causal),
                            scale=1.0 / math.sqrt(case["dim"]))
    graph = helper.make_graph([node], "attention", inputs,
                              [helper.make_tensor_value_info("Y", onnx_dtype, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10  # what ONNX Runtime 1.2x reads; onnx's default may be newer
    return model.SerializeToString()


def onnxruntime_run(case, reps, want_output=False):
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto

    if case["pass"] == "backward":
        raise Unsupported("ONNX Runtime is an inference runtime: no backward for Attention "
                          "(training needs the separate onnxruntime-training build)")
    np_dtype = {"fp32": np.float32, "fp16": np.float16}.get(case["dtype"])
    if np_dtype is None:
        try:  # NumPy has no bfloat16; onnx depends on ml_dtypes, which has one
            import ml_dtypes
            np_dtype = ml_dtypes.bfloat16
        except ImportError:
            raise Unsupported("ONNX Runtime: no bfloat16 NumPy type (ml_dtypes) to feed the session")
    onnx_dtype = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}[case["dtype"]]
    left, right = case_band(case)
    nq, nk = common.q_len(case), case["seq"]
    keep = None
    is_causal = False
    if case["mask"] == "causal" and nq == nk:
        is_causal = True  # ONNX's is_causal aligns top-left, the same when Nq == Nk
    elif left >= 0 or right >= 0:
        keep = band_keep(nq, nk, left, right)
        if keep.all():
            keep = None
    options = ort.SessionOptions()
    options.intra_op_num_threads = case["threads"]
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(onnx_attention_model(case, onnx_dtype, keep is not None, is_causal),
                                       sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise Unsupported(f"ONNX Runtime: {first_line(e)}")
    q, k, v, _ = make_inputs(case)
    feeds = {"Q": q.astype(np_dtype), "K": k.astype(np_dtype), "V": v.astype(np_dtype)}
    if keep is not None:
        feeds["M"] = keep

    def step():
        return session.run(None, feeds)[0]

    try:
        if want_output:
            return [step().astype(np.float32)]
        ms = timed(step, reps)
    except Exception as e:
        raise Unsupported(f"ONNX Runtime: {first_line(e)}")
    label = f"ONNX Runtime {ort.__version__} Attention (opset 23)"
    detail = f"CPUExecutionProvider, {case['threads']} intra-op threads"
    return ms, label, detail


RUNNERS = {"torch": torch_run, "onnxruntime": onnxruntime_run}


def first_line(error):
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


# ------------------------------------------------------------ one case

def run_one(impl, case, reps, peak):
    """Runs one (peer, case) in this process and returns its row."""
    row = common.base_row(ROW_IMPL[impl], case, reps, peak)
    start_rss = rss_mb()
    try:
        importlib.import_module(MODULE[impl])
    except Exception as e:
        row.update(status="missing", reason=f"import {MODULE[impl]} failed: {first_line(e)}",
                   label=ROW_IMPL[impl])
        row["peak_rss_mb"] = rss_mb()
        return row
    import_rss = rss_mb()
    try:
        ms, label, detail = RUNNERS[impl](case, reps)
    except Unsupported as e:
        row.update(status="unsupported", reason=str(e), label=ROW_IMPL[impl])
        row["peak_rss_mb"] = rss_mb()
        return row
    gflops = row["flops"] / (ms * 1e-3) * 1e-9
    row.update(status="ok", label=label, ms=ms, gflops=gflops,
               fraction_of_peak=gflops / peak if peak else None,
               peak_rss_mb=rss_mb(),
               detail=f"{detail}; RSS {start_rss:.0f} MB at start, {import_rss:.0f} MB after import")
    return row


def forked_row(impl, case, reps, peak):
    """Runs one (peer, case) in a new process forked from this one, which has
    imported the peer but run nothing (no thread pools yet): the child's
    ru_maxrss (from wait4) is its own peak, and includes the import, as a fresh
    interpreter's would, without paying the import (seconds for torch) per case.
    A crash becomes an error row."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        code = 0
        try:
            data = json.dumps(run_one(impl, case, reps, peak)).encode()
        except BaseException as e:  # report, never unwind into the parent's loop
            data = json.dumps({"error": f"{type(e).__name__}: {first_line(e)}"}).encode()
            code = 1
        with os.fdopen(write_end, "wb") as f:
            f.write(data)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    _, status, usage = os.wait4(pid, 0)
    try:
        row = json.loads(data)
    except ValueError:
        row = {"error": "no result"}
    if "error" in row or os.waitstatus_to_exitcode(status) != 0:
        reason = row.get("error") or f"exit status {os.waitstatus_to_exitcode(status)}"
        row = common.base_row(ROW_IMPL[impl], case, reps, peak)
        row.update(status="error", label=ROW_IMPL[impl], reason=reason)
    row["peak_rss_mb"] = usage.ru_maxrss / 1024.0  # KiB on Linux
    return row


def matrix_mb(case):
    """MiB of the scores of every (batch, head) at once, as an unfused kernel keeps them."""
    return case["batch"] * case["heads"] * common.q_len(case) * case["seq"] * 4 / 2**20


def machine_info(peak):
    info = {"python": platform.python_version(), "peak_gflops": peak}
    for impl, module in MODULE.items():
        spec = importlib.util.find_spec(module)
        info[module] = "missing" if spec is None else "installed"
    return info


def worker(impl, cases, reps, peak, max_matrix_mb):
    """Runs every case of one peer, each in a forked process, printing one JSON
    row per line as it finishes. Runs in its own interpreter (see sweep) so
    that only this peer is imported into the processes it forks."""
    import_error = None
    try:
        importlib.import_module(MODULE[impl])
    except Exception as e:
        import_error = f"import {MODULE[impl]} failed: {first_line(e)}"
    for case in cases:
        case_reps = reps or common.adaptive_reps(case["flops"])
        if import_error:
            row = common.base_row(ROW_IMPL[impl], case, case_reps, peak)
            row.update(status="missing", label=ROW_IMPL[impl], reason=import_error)
        elif impl == "onnxruntime" and case["pass"] != "backward" and matrix_mb(case) > max_matrix_mb:
            row = common.base_row(ROW_IMPL[impl], case, None, peak)
            row.update(status="skipped", label=ROW_IMPL[impl],
                       reason=f"skipped: its scores of every head would take {matrix_mb(case):.4g} MB "
                              f"(> --max-matrix-mb {max_matrix_mb:.4g})")
        else:
            row = forked_row(impl, case, case_reps, peak)
        print(json.dumps(row), flush=True)


def sweep(args):
    plan = common.plan_from_args(args)
    cases = common.cases(plan)
    peak = args.peak_gflops or None
    total = sum(common.estimated_seconds(c, plan, i) for c in cases for i in plan["impls"])
    progress = common.Progress(enabled=sys.stderr.isatty() and not args.json,
                               steps=len(cases) * len(plan["impls"]), total_work=total)
    command = " ".join(["bench/sweep_peers.py"] + sys.argv[1:])
    rows = []
    for impl in plan["impls"]:
        if importlib.util.find_spec(MODULE[impl]) is None:
            for case in cases:
                row = common.base_row(ROW_IMPL[impl], case, plan["reps"] or common.adaptive_reps(case["flops"]), peak)
                row.update(status="missing", label=ROW_IMPL[impl],
                           reason=f"Python module {MODULE[impl]} is not installed (scripts/setup.sh installs it)")
                rows.append(row)
            continue
        # A fresh interpreter per peer: torch's 300 MB must not show up in
        # ONNX Runtime's peak RSS.
        spec = {"impl": impl, "cases": cases, "reps": plan["reps"], "peak": peak,
                "max_matrix_mb": args.max_matrix_mb}
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                                 stdout=subprocess.PIPE, text=True)
        done = 0
        progress.begin(cases[0]["pass"], len(rows), common.case_name(cases[0], ROW_IMPL[impl]))
        for line in child.stdout:
            rows.append(json.loads(line))
            progress.end(common.estimated_seconds(cases[done], plan, impl))
            done += 1
            if args.out:
                common.write_rows(args.out, command, machine_info(peak), rows)
            if done < len(cases):
                progress.begin(cases[done]["pass"], len(rows), common.case_name(cases[done], ROW_IMPL[impl]))
        status = child.wait()
        for case in cases[done:]:  # the worker died: say so for what it did not run
            row = common.base_row(ROW_IMPL[impl], case, None, peak)
            row.update(status="error", label=ROW_IMPL[impl], reason=f"peer worker exited with status {status}")
            rows.append(row)
    if args.out:
        common.write_rows(args.out, command, machine_info(peak), rows)
    progress.finish()
    if args.json:
        json.dump(common.document(command, machine_info(peak), rows), sys.stdout)
        print()
    else:
        common.print_table(rows)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_sweep_arguments(parser, impls=IMPLS)
    parser.add_argument("--max-matrix-mb", type=float, default=DEFAULT_MAX_MATRIX_MB,
                        help="skip ONNX Runtime where its scores of every head would exceed this (MiB)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one peer's cases
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        worker(spec["impl"], spec["cases"], spec["reps"], spec["peak"], spec["max_matrix_mb"])
        return 0
    try:
        return sweep(args)
    except common.UsageError as e:
        print(f"sweep_peers.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
