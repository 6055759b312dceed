#!/usr/bin/env python3
"""Times other attention libraries on the grid of `tileattn bench --sweep`.

Peers, each only where installed and each labelled with what actually ran:
  torch-sdpa    PyTorch's torch.nn.functional.scaled_dot_product_attention on
                the CPU, with the backend PyTorch picked for the case
                (torch._fused_sdp_choice) and the aten operator that ran (the
                profiler's op name);
  onnxruntime   ONNX Runtime's CPU implementation of the ONNX opset-23
                Attention operator (one-node model built with the onnx package);
  openvino-sdpa OpenVINO's CPU plugin running a one-node model of its opset-13
                ScaledDotProductAttention (built with the openvino Python API),
                compiled with NUM_STREAMS 1, INFERENCE_NUM_THREADS = the case's
                threads and INFERENCE_PRECISION_HINT = the case's dtype; `detail`
                names the nodes of the compiled (runtime) graph that ran.

Every (peer, case) runs in its own process, forked from a parent that has
imported the peer and run nothing else, so peak_rss_mb is that process's own
ru_maxrss; it includes the library's import (the RSS after import is given in
`detail`). A peer that is not installed
gives rows with status "missing" and the reason; a case a peer cannot run
gives status "unsupported" with the library's own error. Rows have the columns
of `tileattn bench --sweep` (docs/benchmarks.md), so bench/report.py merges
both. Usage:

    .venv/bin/python bench/sweep_peers.py --seqs 512,1024 --dims 64 --masks none,causal \
        --passes forward --impls torch,onnxruntime,openvino --peak-gflops 150 --out peers.json
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

IMPLS = ("torch", "onnxruntime", "openvino")
ROW_IMPL = {"torch": "torch-sdpa", "onnxruntime": "onnxruntime", "openvino": "openvino-sdpa"}
MODULE = {"torch": "torch", "onnxruntime": "onnxruntime", "openvino": "openvino"}
# ONNX Runtime's Attention kernel keeps the scores of every (batch, head) at
# once, and so does OpenVINO's unfused fp16 path; OpenVINO's fused path keeps
# one [Nq, Nk] mask (the causal one is a constant of the compiled graph).
# Above this many MiB of them a case is skipped rather than swapping a shared
# machine (--max-matrix-mb).
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


# --------------------------------------------------------------- OpenVINO

OV_PRECISION = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


def openvino_mask(case):
    """(keep, causal) for OpenVINO's ScaledDotProductAttention: its `causal`
    attribute aligns top-left (like PyTorch's is_causal), the same as
    tileattn's bottom-right only when Nq == Nk; other bands become a boolean
    [Nq, Nk] mask input (True = take part), None where every key is visible."""
    left, right = case_band(case)
    nq, nk = common.q_len(case), case["seq"]
    if left < 0 and right < 0:
        return None, False
    if case["mask"] == "causal" and nq == nk:
        return None, True
    keep = band_keep(nq, nk, left, right)
    return (None if keep.all() else keep), False


def openvino_model(case, keep, causal):
    """One-node model: Q [B, H, Nq, D], K/V [B, HKV, N, D] parameters in the
    case's dtype (bf16 parameters for bf16: the runtime gets bf16 inputs, as
    tileattn and SDPA do), M [Nq, N] boolean when `keep` is given. The op
    wants K/V with the query's head count (its shape check rejects HKV < H),
    so GQA repeats each K/V head H/HKV times inside the graph
    (Unsqueeze -> Broadcast -> Reshape, the repeat_kv of Llama-style models),
    which runs on every call and is timed. The scale is the op's default,
    1/sqrt(D) (an explicit scale constant would have to be in the inputs'
    dtype, and 1/sqrt(128) is not exact in bf16)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    ov_type = {"fp32": ov.Type.f32, "fp16": ov.Type.f16, "bf16": ov.Type.bf16}[case["dtype"]]
    b, h, hkv, d = case["batch"], case["heads"], case["kv_heads"], case["dim"]
    nq, nk = common.q_len(case), case["seq"]
    q = ops.parameter([b, h, nq, d], ov_type, name="Q")
    k = ops.parameter([b, hkv, nk, d], ov_type, name="K")
    v = ops.parameter([b, hkv, nk, d], ov_type, name="V")
    params = [q, k, v]
    key, value = k, v
    if h != hkv:
        def repeat_kv(x):
            x = ops.unsqueeze(x, ops.constant(np.array([2], np.int64)))
            x = ops.broadcast(x, ops.constant(np.array([b, hkv, h // hkv, nk, d], np.int64)))
            return ops.reshape(x, ops.constant(np.array([b, h, nk, d], np.int64)), special_zero=False)
        key, value = repeat_kv(k), repeat_kv(v)
    if keep is not None:
        m = ops.parameter([nq, nk], ov.Type.boolean, name="M")
        params.append(m)
        node = ops.scaled_dot_product_attention(q, key, value, m, causal=False)
    else:
        node = ops.scaled_dot_product_attention(q, key, value, causal=causal)
    return ov.Model([node], params, "tileattn_peer_sdpa")


def openvino_tensor(array, dtype):
    """An ov.Tensor of `array` (float32 NumPy) in the case's dtype. NumPy has
    no bfloat16: OpenVINO's Python API shows a bf16 tensor's data as a
    float16 array of the same bits, so the bits are copied through uint16."""
    import numpy as np
    import openvino as ov
    if dtype == "fp32":
        return ov.Tensor(np.ascontiguousarray(array, dtype=np.float32))
    if dtype == "fp16":
        return ov.Tensor(np.ascontiguousarray(array, dtype=np.float16))
    tensor = ov.Tensor(ov.Type.bf16, list(array.shape))
    tensor.data.view(np.uint16)[...] = bf16_bits(array)
    return tensor


def bf16_bits(array):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even, as
    torch's .to(torch.bfloat16) does (inputs here are finite)."""
    import numpy as np
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def openvino_output(tensor, dtype):
    """float32 NumPy copy of an output ov.Tensor (bf16 bits read as such)."""
    import numpy as np
    data = tensor.data
    if dtype == "bf16":
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float32)


def openvino_runtime_graph(compiled):
    """The compiled graph's nodes that do work, in execution order, as
    'layerType[primitiveType]', a fused node followed by the original
    operations it runs (e.g. 'Subgraph[jit_avx512_bf16: Multiply, Add, Softmax,
    ScaledDotProductAttention]': the plugin decomposed the op and its Snippets
    compiler fused it back into one kernel). Reshapes (views) are left out."""
    import re
    out = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layer = info["layerType"].astype(str)
        if layer in ("Input", "Output", "Const", "Reshape"):
            continue
        entry = f"{layer}[{info['primitiveType'].astype(str)}"
        if layer == "Subgraph":
            names = [re.sub(r"_\d+$", "", n) for n in info["originalLayersNames"].astype(str).split(",") if n]
            entry += ": " + ", ".join(dict.fromkeys(names))
        out.append(entry + "]")
    return ", ".join(out)


def openvino_compile(case, keep, causal):
    """(compiled model, config) for the CPU plugin; Unsupported with OpenVINO's error."""
    import openvino as ov
    config = {"NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": case["threads"],
              "INFERENCE_PRECISION_HINT": OV_PRECISION[case["dtype"]]}
    try:
        return ov.Core().compile_model(openvino_model(case, keep, causal), "CPU", config), config
    except Exception as e:
        raise Unsupported(f"OpenVINO: {first_line(e)}")


def openvino_run(case, reps, want_output=False):
    import openvino as ov

    if case["pass"] == "backward":
        raise Unsupported("OpenVINO is an inference runtime: no backward for ScaledDotProductAttention")
    keep, causal = openvino_mask(case)
    compiled, config = openvino_compile(case, keep, causal)
    request = compiled.create_infer_request()
    q, k, v, _ = make_inputs(case)
    for name, array in (("Q", q), ("K", k), ("V", v)):
        request.set_tensor(name, openvino_tensor(array, case["dtype"]))
    if keep is not None:
        request.set_tensor("M", ov.Tensor(keep))

    def step():
        request.infer()  # inputs bound once above: no copies in the timed call
        return request.get_output_tensor(0)

    try:
        if want_output:
            return [openvino_output(step(), case["dtype"])]
        ms = timed(step, reps)
    except Exception as e:
        raise Unsupported(f"OpenVINO: {first_line(e)}")
    version = ov.get_version().split("-")[0]
    label = f"OpenVINO {version} ScaledDotProductAttention (opset13, CPU plugin)"
    nq, nk = common.q_len(case), case["seq"]
    parts = [f"{config['NUM_STREAMS']} stream, {case['threads']} threads, "
             f"inference precision {config['INFERENCE_PRECISION_HINT']} ({case['dtype']} inputs)"]
    if case["heads"] != case["kv_heads"]:
        parts.append(f"GQA: K/V broadcast from {case['kv_heads']} to {case['heads']} heads in the graph, per call")
    if causal:
        parts.append("causal attribute (top-left; Nq == Nk)")
    elif keep is not None:
        parts.append(f"boolean mask input [{nq}, {nk}]")
    parts.append(f"ran {openvino_runtime_graph(compiled)}")
    return ms, label, "; ".join(parts)


RUNNERS = {"torch": torch_run, "onnxruntime": onnxruntime_run, "openvino": openvino_run}


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


def any_key_hidden(case):
    """Whether the case's band hides some (query, key) pair (so a mask is built)."""
    left, right = case_band(case)
    nq, nk = common.q_len(case), case["seq"]
    return common.visible_pairs(nq, nk, left, right) < nq * nk


def too_big(impl, case, max_matrix_mb):
    """The reason to skip (impl, case) for memory, or None. ONNX Runtime keeps
    the scores of every head; OpenVINO's CPU plugin runs fp16 unfused
    (MatMul, Softmax, MatMul: the same), and otherwise a fused kernel that
    holds one [Nq, Nk] mask as fp32 where the case has one."""
    if case["pass"] == "backward":
        return None  # neither has a backward: the row says unsupported
    if impl == "onnxruntime" or (impl == "openvino" and case["dtype"] == "fp16"):
        mb, what = matrix_mb(case), "its scores of every head"
    elif impl == "openvino" and any_key_hidden(case):
        mb, what = common.q_len(case) * case["seq"] * 4 / 2**20, "its [Nq, Nk] fp32 mask"
    else:
        return None
    if mb <= max_matrix_mb:
        return None
    return f"skipped: {what} would take {mb:.4g} MB (> --max-matrix-mb {max_matrix_mb:.4g})"


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
        elif too_big(impl, case, max_matrix_mb):
            row = common.base_row(ROW_IMPL[impl], case, None, peak)
            row.update(status="skipped", label=ROW_IMPL[impl], reason=too_big(impl, case, max_matrix_mb))
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
        # ONNX Runtime's or OpenVINO's peak RSS.
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
                        help="skip ONNX Runtime (and OpenVINO) where the scores of every head "
                             "(OpenVINO: its mask) would exceed this (MiB)")
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
