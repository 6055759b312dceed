"""The benchmark report tooling: bench/sweep_common.py (grid, FLOPs, schema),
bench/sweep_peers.py (peers compute the same attention as tileattn; missing
and unsupported peers give rows with reasons), bench/report.py (plots and
table), bench/compare_bf16.py (paired timing; its --check bites), and
agreement with `tileattn bench --sweep` when the binary is built."""
import csv
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import report  # noqa: E402
import sweep_common as common  # noqa: E402
import sweep_peers  # noqa: E402


def tileattn_binary():
    for path in (os.environ.get("TILEATTN_CLI", ""), os.path.join(ROOT, "build/bin/tileattn")):
        if path and os.access(path, os.X_OK):
            return path
    return None


def tiny_case(**overrides):
    case = {"pass": "forward", "dim": 16, "mask": "none", "dtype": "fp32", "seq": 40, "batch": 1, "heads": 4,
            "kv_heads": 2, "window_left": 7, "window_right": 0, "threads": 1}
    case.update(overrides)
    case["flops"] = common.case_flops(case)
    return case


def reference(q, k, v, keep):
    """float64 attention; q [B, H, Nq, D], k/v [B, HKV, N, D], keep [Nq, N]."""
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k.astype(np.float64), group, axis=1)
    v = np.repeat(v.astype(np.float64), group, axis=1)
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_visible_pairs_and_flops():
    assert common.visible_pairs(4, 4, -1, -1) == 16
    assert common.visible_pairs(4, 4, -1, 0) == 10  # causal
    assert common.visible_pairs(1, 100, -1, 0) == 100  # decode: the last query sees everything
    assert common.visible_pairs(1, 100, 9, 0) == 10
    assert common.visible_pairs(6, 6, 2, 0) == 1 + 2 + 3 + 3 + 3 + 3
    case = tiny_case(mask="window", seq=20)
    left, right = 7, 0
    assert case["flops"] == 4 * 16 * 4 * common.visible_pairs(20, 20, left, right)
    assert tiny_case(**{"pass": "backward"})["flops"] == 10 * 16 * 4 * 40 * 40
    assert common.adaptive_reps(1.0) == common.MAX_ADAPTIVE_REPS
    assert common.adaptive_reps(1e13) == 1


def test_plan_checks_flags():
    import argparse
    parser = argparse.ArgumentParser()
    common.add_sweep_arguments(parser, impls=("torch", "onnxruntime"))
    plan = common.plan_from_args(parser.parse_args(["--seqs", "64,128", "--dims", "32", "--masks", "causal",
                                                    "--passes", "forward,decode"]))
    cases = common.cases(plan)
    assert [(c["pass"], c["seq"]) for c in cases] == [("forward", 64), ("forward", 128), ("decode", 64),
                                                       ("decode", 128)]
    for bad in (["--seqs", "0"], ["--seqs", "64,64"], ["--masks", "diagonal"], ["--impls", "cublas"],
                ["--heads", "6", "--kv-heads", "4"], ["--out", "r.txt"], ["--window", "5"],
                ["--dims", "513"]):
        with pytest.raises(common.UsageError):
            common.plan_from_args(parser.parse_args(bad))
    # Head dims up to V's limit, as the CLI's sweep takes them.
    assert common.plan_from_args(parser.parse_args(["--dims", "64,512"]))["dims"] == [64, 512]


@pytest.mark.parametrize("mask", ["none", "causal", "window"])
@pytest.mark.parametrize("pass_name", ["forward", "decode"])
@pytest.mark.parametrize("impl", ["torch", "onnxruntime", "openvino"])
def test_peers_compute_tileattns_attention(impl, pass_name, mask):
    pytest.importorskip(sweep_peers.MODULE[impl])
    case = tiny_case(**{"pass": pass_name, "mask": mask})
    q, k, v, _ = sweep_peers.make_inputs(case)
    left, right = sweep_peers.case_band(case)
    keep = sweep_peers.band_keep(common.q_len(case), case["seq"], left, right)
    (out,) = sweep_peers.RUNNERS[impl](case, 1, want_output=True)
    np.testing.assert_allclose(out, reference(q, k, v, keep), atol=2e-5)


def bf16_round(a):
    """float32 -> nearest bfloat16 (ties to even), back as float32."""
    bits = a.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)


@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_openvino_bf16_inputs_and_output_bits(mask):
    # NumPy has no bfloat16: the inputs go in and the output comes out as bf16
    # bit patterns through OpenVINO's float16-typed view of its bf16 tensors.
    pytest.importorskip("openvino")
    case = tiny_case(mask=mask, dtype="bf16")
    q, k, v, _ = sweep_peers.make_inputs(case)
    assert np.array_equal(sweep_peers.bf16_bits(q), (bf16_round(q).view(np.uint32) >> 16).astype(np.uint16))
    keep = sweep_peers.band_keep(40, 40, *sweep_peers.case_band(case))
    (out,) = sweep_peers.RUNNERS["openvino"](case, 1, want_output=True)
    expected = reference(bf16_round(q), bf16_round(k), bf16_round(v), keep)
    assert np.abs(out - expected).max() < 2e-2


def test_torch_backward_gradients_match_float64():
    torch = pytest.importorskip("torch")
    case = tiny_case(**{"pass": "backward", "mask": "window", "kv_heads": 4})
    q, k, v, d_o = (torch.from_numpy(a).double().requires_grad_(True) for a in sweep_peers.make_inputs(case))
    keep = torch.from_numpy(sweep_peers.band_keep(40, 40, 7, 0))
    s = (q @ k.transpose(-1, -2) / 4.0).masked_fill(~keep, float("-inf"))
    out = torch.softmax(s, -1) @ v
    expected = torch.autograd.grad(out, (q, k, v), d_o.detach())
    got = sweep_peers.RUNNERS["torch"](case, 1, want_output=True)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e.numpy(), atol=1e-4)


def test_peer_rows_missing_and_unsupported(monkeypatch, capsys):
    pytest.importorskip("torch")
    # onnxruntime pretends to be absent; torch runs; ONNX Runtime has no backward.
    monkeypatch.setitem(sweep_peers.MODULE, "onnxruntime", "no_such_module_for_tileattn_tests")
    status = sweep_peers.main(["--seqs", "32", "--dims", "16", "--masks", "causal", "--passes", "forward,backward",
                               "--heads", "2", "--threads", "1", "--reps", "1", "--peak-gflops", "10", "--json",
                               "--impls", "torch,onnxruntime"])
    assert status == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == common.SCHEMA
    rows = doc["rows"]
    assert len(rows) == 4
    for row in rows:
        assert list(row) == common.COLUMNS
        if row["impl"] == "onnxruntime":
            assert row["status"] == "missing"
            assert "not installed" in row["reason"]
        else:
            assert row["status"] == "ok", row["reason"]
            assert row["label"].startswith("PyTorch ") and "SDPA" in row["label"]
            assert "backend" in row["detail"]
            assert row["gflops"] == pytest.approx(row["flops"] / row["ms"] * 1e-6)
            assert row["fraction_of_peak"] == pytest.approx(row["gflops"] / 10)
            assert row["peak_rss_mb"] > 50  # the process holds torch


def sweep_peers_json(*args):
    """Runs bench/sweep_peers.py as a command (its worker and forked cases
    included) and returns its rows."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sweep_peers.py"), *args, "--json"],
                         check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    assert doc["schema"] == common.SCHEMA
    return doc["machine"], doc["rows"]


def test_openvino_row_fields():
    pytest.importorskip("openvino", reason="scripts/setup.sh installs openvino; CI must run this")
    machine, rows = sweep_peers_json("--impls", "openvino", "--seqs", "64", "--dims", "32", "--masks", "causal",
                                     "--dtypes", "bf16", "--heads", "4", "--kv-heads", "2", "--threads", "1",
                                     "--reps", "2", "--peak-gflops", "10")
    assert machine["openvino"] == "installed"
    (row,) = rows
    assert list(row) == common.COLUMNS
    assert row["status"] == "ok", row["reason"]
    assert row["impl"] == "openvino-sdpa" and row["reason"] is None
    assert row["label"].startswith("OpenVINO 20") and "ScaledDotProductAttention" in row["label"]
    assert (row["pass"], row["dtype"], row["mask"], row["seq"], row["q_len"], row["heads"], row["kv_heads"]) == \
        ("forward", "bf16", "causal", 64, 64, 4, 2)
    assert row["flops"] == tiny_case(dim=32, seq=64, mask="causal")["flops"]
    assert row["reps"] == 2 and row["ms"] > 0
    assert row["gflops"] == pytest.approx(row["flops"] / row["ms"] * 1e-6)
    assert row["fraction_of_peak"] == pytest.approx(row["gflops"] / 10)
    assert row["peak_rss_mb"] > 30  # the process holds OpenVINO's libraries
    detail = row["detail"]
    assert "inference precision bf16 (bf16 inputs)" in detail and "1 threads" in detail
    assert "K/V broadcast from 2 to 4 heads" in detail and "causal attribute" in detail
    assert "ran " in detail and "Subgraph[" in detail  # the compiled graph's nodes


def test_openvino_missing_and_unsupported_rows(monkeypatch, capsys):
    monkeypatch.setitem(sweep_peers.MODULE, "openvino", "no_such_module_for_tileattn_tests")
    assert sweep_peers.main(["--impls", "openvino", "--seqs", "32", "--dims", "16", "--threads", "1",
                             "--masks", "none", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert (row["impl"], row["status"]) == ("openvino-sdpa", "missing")
    assert "no_such_module_for_tileattn_tests is not installed" in row["reason"]
    with pytest.raises(sweep_peers.Unsupported, match="inference runtime"):
        sweep_peers.openvino_run(tiny_case(**{"pass": "backward"}), 1)


def test_memory_guards_say_why():
    big = tiny_case(seq=16384, mask="causal")
    assert sweep_peers.too_big("torch", big, 100) is None
    assert "scores of every head" in sweep_peers.too_big("onnxruntime", big, 100)
    assert "[Nq, Nk] fp32 mask would take 1024 MB" in sweep_peers.too_big("openvino", big, 100)
    assert sweep_peers.too_big("openvino", tiny_case(seq=16384), 100) is None  # no mask, fused: nothing N x N
    assert sweep_peers.too_big("openvino", tiny_case(**{"seq": 16384, "pass": "decode", "mask": "causal"}), 100) is None
    assert "scores of every head" in sweep_peers.too_big("openvino", tiny_case(seq=16384, dtype="fp16"), 100)
    assert sweep_peers.too_big("openvino", big, 2100) is None


def test_onnxruntime_backward_is_unsupported_with_reason():
    pytest.importorskip("onnxruntime")
    with pytest.raises(sweep_peers.Unsupported, match="inference runtime"):
        sweep_peers.onnxruntime_run(tiny_case(**{"pass": "backward"}), 1)


def synthetic_rows():
    rows = []
    for pass_name in ("forward", "decode"):
        for seq in (256, 512, 1024):
            case = tiny_case(**{"pass": pass_name, "seq": seq, "dim": 64, "kv_heads": 4})
            for impl, gflops in (("tileattn", 50.0), ("naive-openblas", 10.0), ("torch-sdpa", 30.0)):
                row = common.base_row(impl, case, 3, 100.0)
                row.update(status="ok", label=impl, ms=case["flops"] / gflops * 1e-6, gflops=gflops,
                           fraction_of_peak=gflops / 100, peak_rss_mb=10.0 + seq / 100)
                rows.append(row)
            ort = common.base_row("onnxruntime", case, None, 100.0)
            ort.update(status="missing", reason="Python module onnxruntime is not installed")
            rows.append(ort)
    rows[1].update(status="skipped", reason="skipped: too big", ms=None, gflops=None, fraction_of_peak=None)
    return rows


@pytest.mark.parametrize("ext", [".json", ".csv"])
def test_report_writes_plots_and_table(tmp_path, ext):
    pytest.importorskip("matplotlib")
    results = str(tmp_path / ("results" + ext))
    common.write_rows(results, "test", {"cpu": "Test CPU", "load_average_start": 0.5, "load_average_end": 0.7},
                      synthetic_rows())
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Title\n{report.BEGIN}\nold table\n{report.END}\ntail\n")
    img = tmp_path / "img"
    assert report.main([results, "--img-dir", str(img), "--table", str(tmp_path / "t.md"), "--doc", str(doc)]) == 0
    for name in ("bench_forward.png", "bench_decode.png", "bench_memory.png"):
        data = (img / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000, name
    table = (tmp_path / "t.md").read_text()
    assert "| D | mask | dtype | N | tileattn | naive-openblas | torch-sdpa | onnxruntime |" in table
    assert "| 64 | no mask | fp32 | 256 | 50.0 (50%) · 13 MB | skipped [1] | 30.0 (30%) · 13 MB | missing [2] |" in table
    assert "1. skipped: too big" in table and "2. Python module onnxruntime is not installed" in table
    text = doc.read_text()
    assert "old table" not in text and text.startswith("# Title\n") and text.endswith(f"{report.END}\ntail\n")
    assert table in text


def test_report_rejects_bad_input(tmp_path, capsys):
    assert report.main([str(tmp_path / "missing.json")]) == 2
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something-else", "rows": []}))
    assert report.main([str(tmp_path / "other.json")]) == 2
    assert "report.py" in capsys.readouterr().err


def test_cpp_sweep_rows_have_the_same_columns_and_flops(tmp_path):
    binary = tileattn_binary()
    if binary is None:
        pytest.skip("no built tileattn binary (scripts/build.sh builds build/bin/tileattn)")
    out = str(tmp_path / "r.csv")
    subprocess.run([binary, "bench", "--sweep", "--seqs", "40", "--dims", "16", "--masks", "none,causal,window",
                    "--window", "7,0", "--passes", "forward,backward,decode", "--heads", "4", "--kv-heads", "2",
                    "--threads", "1", "--reps", "1", "--impls", "tileattn", "--out", out], check=True,
                   capture_output=True)
    with open(out) as f:
        assert next(csv.reader(io.StringIO(f.readline()))) == common.COLUMNS
    _, rows = common.read_rows(out)
    assert len(rows) == 9
    for row in rows:
        case = tiny_case(**{"pass": row["pass"], "mask": row["mask"]})
        assert row["flops"] == case["flops"], row
        assert row["q_len"] == common.q_len(case)
        assert row["status"] == "ok"


def compare_bf16_env():
    """Environment for bench/compare_bf16.py: tileattn importable as in this process."""
    tileattn = pytest.importorskip("tileattn")
    pytest.importorskip("torch")
    pytest.importorskip("openvino", reason="scripts/setup.sh installs openvino; CI must run this")
    site = os.path.dirname(os.path.dirname(os.path.abspath(tileattn.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    return env


def test_compare_bf16_quick_check_runs(tmp_path):
    env = compare_bf16_env()
    out = tmp_path / "c.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "compare_bf16.py"), "--quick", "--check",
                        "--rounds", "2", "--json", str(out)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout
    for needle in ("CPU: ", "tileattn bf16_isa: ", "date: ", "torch ", "openvino ", "vs SDPA bf16",
                   "vs OpenVINO bf16", "vs OpenVINO fp32", "tileattn bf16 over its fp32, paired",
                   "check: every peer's output matches"):
        assert needle in text, needle
    doc = json.loads(out.read_text())
    assert doc["machine"]["bf16_isa"] and doc["check_failures"] == []
    assert len(doc["rows"]) == 2 * 6
    own = {r["shape"]: r for r in doc["tileattn_bf16_over_fp32"]}
    assert set(own) == {r["shape"] for r in doc["rows"]}
    for r in own.values():
        assert r["paired_min_max"][0] <= r["paired_median"] <= r["paired_min_max"][1]
        fp32 = next(x for x in doc["rows"] if x["shape"] == r["shape"] and x["dtype"] == "fp32")
        bf16 = next(x for x in doc["rows"] if x["shape"] == r["shape"] and x["dtype"] == "bf16")
        assert r["ratio_of_medians"] == pytest.approx(fp32["ms"]["tileattn"] / bf16["ms"]["tileattn"])
    for row in doc["rows"]:
        assert set(row["ms"]) == {"tileattn", "sdpa", "openvino"}
        for impl, ratio in row["ratio"].items():
            assert ratio == pytest.approx(row["ms"][impl] / row["ms"]["tileattn"])
            assert row["max_abs_diff"][impl] < (2e-2 if row["dtype"] == "bf16" else 1e-4)
    means = {(m["impl"], m["dtype"]): m for m in doc["geomeans"]}
    assert len(means[("sdpa", "bf16")]["shapes"]) == 4
    assert len(means[("openvino", "bf16")]["shapes"]) == 3
    assert len(means[("openvino", "fp32")]["shapes"]) == 3  # the shapes without a mask
    assert all(m["geomean"] > 0 for m in doc["geomeans"])


def test_compare_bf16_check_bites(monkeypatch, capsys):
    # A peer output read in the wrong order (keys reversed along N) must fail --check.
    compare_bf16_env()
    import torch
    import tileattn
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import compare_bf16
    real = sweep_peers.openvino_output
    monkeypatch.setattr(sweep_peers, "openvino_output", lambda t, dtype: real(t, dtype)[:, :, ::-1, :])
    threads = (torch.get_num_threads(), tileattn.get_num_threads())
    try:
        assert compare_bf16.main(["--quick", "--check", "--rounds", "1", "--shapes", "h16_n4096_d64"]) == 1
    finally:
        torch.set_num_threads(threads[0])
        tileattn.set_num_threads(threads[1])
    err = capsys.readouterr().err
    assert "check FAILED" in err and "openvino differs from tileattn" in err
