"""The benchmark report tooling: bench/sweep_common.py (grid, FLOPs, schema),
bench/sweep_peers.py (peers compute the same attention as tileattn; missing
and unsupported peers give rows with reasons), bench/report.py (plots and
table), and agreement with `tileattn bench --sweep` when the binary is built."""
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
                ["--heads", "6", "--kv-heads", "4"], ["--out", "r.txt"], ["--window", "5"]):
        with pytest.raises(common.UsageError):
            common.plan_from_args(parser.parse_args(bad))


@pytest.mark.parametrize("mask", ["none", "causal", "window"])
@pytest.mark.parametrize("pass_name", ["forward", "decode"])
@pytest.mark.parametrize("impl", ["torch", "onnxruntime"])
def test_peers_compute_tileattns_attention(impl, pass_name, mask):
    pytest.importorskip(sweep_peers.MODULE[impl])
    case = tiny_case(**{"pass": pass_name, "mask": mask})
    q, k, v, _ = sweep_peers.make_inputs(case)
    left, right = sweep_peers.case_band(case)
    keep = sweep_peers.band_keep(common.q_len(case), case["seq"], left, right)
    (out,) = sweep_peers.RUNNERS[impl](case, 1, want_output=True)
    np.testing.assert_allclose(out, reference(q, k, v, keep), atol=2e-5)


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
                               "--heads", "2", "--threads", "1", "--reps", "1", "--peak-gflops", "10", "--json"])
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
