#!/usr/bin/env python3
"""Turns benchmark sweep results into plots and a Markdown table.

Reads one or more result files of `tileattn bench --sweep` and
bench/sweep_peers.py (JSON documents or CSV, same columns), and writes
  <img-dir>/bench_<pass>.png   GFLOP/s against sequence length, one panel per
                               (head dim, mask), a line per implementation and
                               dtype, the machine's FMA peak as a dashed line;
  <img-dir>/bench_memory.png   peak resident set against sequence length;
  <table>                      a Markdown table of every row, with the reason
                               for each missing, skipped or unsupported one.
Usage:
    .venv/bin/python bench/report.py bench/results/results.json \\
        --img-dir docs/img --table bench/results/report.md [--doc docs/benchmarks.md]
With --doc, the table replaces what is between <!-- bench-report:begin --> and
<!-- bench-report:end --> in that file.
"""
import argparse
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as common  # noqa: E402

BEGIN, END = "<!-- bench-report:begin -->", "<!-- bench-report:end -->"
# Fixed colours so a library looks the same in every plot.
COLORS = {"tileattn": "tab:blue", "naive-openblas": "tab:red", "torch-sdpa": "tab:orange",
          "onnxruntime": "tab:green", "openvino-sdpa": "tab:purple"}
NAMES = {"tileattn": "tileattn", "naive-openblas": "naive GEMM+softmax+GEMM (OpenBLAS)",
         "torch-sdpa": "PyTorch SDPA", "onnxruntime": "ONNX Runtime Attention",
         "openvino-sdpa": "OpenVINO SDPA"}
DTYPE_STYLE = {"fp32": "-", "bf16": "--", "fp16": ":"}
PASS_TITLE = {"forward": "Forward", "backward": "Backward (dQ, dK, dV)", "decode": "Decode (1 query token, N cached keys)"}


def load(paths):
    machine, rows = {}, []
    for path in paths:
        m, r = common.read_rows(path)
        for key, value in m.items():
            machine.setdefault(key, value)
        rows.extend(r)
    return machine, rows


def peak_of(rows):
    peaks = sorted(r["peak_gflops"] for r in rows if r.get("peak_gflops"))
    return peaks[len(peaks) // 2] if peaks else None


def impl_order(rows):
    seen = list(OrderedDict.fromkeys(r["impl"] for r in rows))
    known = [i for i in COLORS if i in seen]
    return known + [i for i in seen if i not in known]


def configs(rows, pass_name):
    """(dim, mask) panels of one pass, in the order they appear."""
    return list(OrderedDict.fromkeys((int(r["dim"]), r["mask"]) for r in rows if r["pass"] == pass_name))


def mask_title(mask, rows):
    if mask != "window":
        return {"none": "no mask", "causal": "causal"}.get(mask, mask)
    w = next((r for r in rows if r["mask"] == "window"), None)
    return f"window ({int(w['window_left'])}, {int(w['window_right'])})" if w else "window"


def not_ok_note(rows):
    """'impl: reason' for implementations with no plotted point in `rows`."""
    notes = []
    for impl in impl_order(rows):
        mine = [r for r in rows if r["impl"] == impl]
        if mine and not any(r["status"] == "ok" for r in mine):
            notes.append(f"{NAMES.get(impl, impl)}: {mine[0]['status']}")
    return notes


def finish_figure(fig, axes, title, path):
    """One legend for the whole figure, below the panels, so it hides no data."""
    handles = OrderedDict()
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.suptitle(title, fontsize=10)
    rows_of_legend = (len(handles) + 2) // 3
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.035 * rows_of_legend + 0.02, 1, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")  # keep titles and legends of narrow figures


def sequence_axis(ax, panel, pass_name):
    seqs = sorted({int(r["seq"]) for r in panel})
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs)
    ax.set_xticklabels([str(n) for n in seqs], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("sequence length N" if pass_name != "decode" else "cached keys N")


def plot_pass(plt, rows, pass_name, path, machine_line):
    panels = configs(rows, pass_name)
    if not panels:
        return None
    cols = min(3, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.9 * nrows), squeeze=False)
    # Decode is bound by reading the cache, far below the FMA peak: its plot
    # shows the time of one step instead (lower is better).
    metric = "ms" if pass_name == "decode" else "gflops"
    peak = peak_of(rows) if metric == "gflops" else None
    for ax, (dim, mask) in zip(axes.flat, panels):
        panel = [r for r in rows if r["pass"] == pass_name and int(r["dim"]) == dim and r["mask"] == mask]
        for impl in impl_order(panel):
            for dtype in OrderedDict.fromkeys(r["dtype"] for r in panel):
                pts = sorted((r["seq"], r[metric]) for r in panel
                             if r["impl"] == impl and r["dtype"] == dtype and r["status"] == "ok" and r[metric])
                if not pts:
                    continue
                ax.plot([p[0] for p in pts], [p[1] for p in pts], DTYPE_STYLE.get(dtype, "-"), marker="o",
                        markersize=4, color=COLORS.get(impl), label=f"{NAMES.get(impl, impl)} {dtype}")
        if peak:
            ax.axhline(peak, color="black", linestyle="--", linewidth=1, label=f"FMA peak ({peak:.0f} GFLOP/s)")
        sequence_axis(ax, panel, pass_name)
        ax.set_ylabel("GFLOP/s" if metric == "gflops" else "ms per step (1 token per head)")
        ax.set_title(f"D={dim}, {mask_title(mask, panel)}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if metric == "gflops":  # head room above the peak line for the notes in the top-left corner
            ax.set_ylim(0, max([peak or 0] + [r["gflops"] or 0 for r in panel if r["status"] == "ok"]) * 1.2 or 1)
        else:
            ax.set_yscale("log")
        notes = not_ok_note(panel)
        if notes:
            ax.text(0.02, 0.98, "\n".join(notes), transform=ax.transAxes, fontsize=7, va="top")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    what = ("time per decode step, lower is better" if metric == "ms" else
            f"useful GFLOP/s ({'10' if pass_name == 'backward' else '4'}·D FLOPs per visible (query, key) pair)")
    finish_figure(fig, list(axes.flat)[:len(panels)], f"{PASS_TITLE.get(pass_name, pass_name)}: {what}\n{machine_line}",
                  path)
    plt.close(fig)
    return path


def plot_memory(plt, rows, path, machine_line):
    """Peak RSS against N, one panel per pass, at its largest head dim and first mask."""
    panels = []
    for pass_name in OrderedDict.fromkeys(r["pass"] for r in rows):
        cfg = configs(rows, pass_name)
        dim = max(d for d, _ in cfg)
        mask = next(m for d, m in cfg if d == dim)
        panels.append((pass_name, dim, mask))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0), squeeze=False)
    for ax, (pass_name, dim, mask) in zip(axes.flat, panels):
        panel = [r for r in rows if r["pass"] == pass_name and int(r["dim"]) == dim and r["mask"] == mask]
        dtype = "fp32" if any(r["dtype"] == "fp32" for r in panel) else panel[0]["dtype"]
        panel = [r for r in panel if r["dtype"] == dtype]
        for impl in impl_order(panel):
            pts = sorted((r["seq"], r["peak_rss_mb"]) for r in panel
                         if r["impl"] == impl and r["status"] == "ok" and r["peak_rss_mb"])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=4,
                        color=COLORS.get(impl), label=NAMES.get(impl, impl))
        sequence_axis(ax, panel, pass_name)
        ax.set_yscale("log")
        ax.set_ylabel("peak resident set, MB")
        ax.set_title(f"{pass_name}: D={dim}, {mask_title(mask, panel)}, {dtype}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        notes = not_ok_note(panel)
        if notes:
            ax.text(0.02, 0.98, "\n".join(notes), transform=ax.transAxes, fontsize=7, va="top")
    finish_figure(fig, list(axes.flat),
                  "Peak resident set of the whole process, one process per (implementation, case)\n" + machine_line,
                  path)
    plt.close(fig)
    return path


def machine_summary(machine, rows):
    peak = peak_of(rows)
    threads = next((int(r["threads"]) for r in rows if r.get("threads")), None)
    parts = [machine.get("cpu") or "CPU", f"{threads} threads" if threads else None,
             machine.get("isa") and f"tileattn ISA {machine['isa']}",
             peak and f"FMA peak {peak:.0f} GFLOP/s"]
    return ", ".join(p for p in parts if p)


def cell(row):
    if row["status"] != "ok":
        return row["status"]
    frac = f" ({100 * row['fraction_of_peak']:.0f}%)" if row.get("fraction_of_peak") is not None else ""
    rss = f" · {row['peak_rss_mb']:.0f} MB" if row.get("peak_rss_mb") else ""
    return f"{row['gflops']:.1f}{frac}{rss}"


def markdown(machine, rows, commands=None):
    impls = impl_order(rows)
    out = []
    out.append(f"Machine: {machine_summary(machine, rows)}.")
    load_start, load_end = machine.get("load_average_start"), machine.get("load_average_end")
    if load_start is not None:
        out.append(f"Load average during the run: {load_start:.2f} at the start, {load_end:.2f} at the end "
                   "(other work on the machine makes every number slower).")
    if machine.get("report_seconds"):
        out.append(f"Measuring everything below took {common.duration(machine['report_seconds'])}.")
    if commands:
        out.append("Commands: " + "; ".join(f"`{c}`" for c in commands) + ".")
    out.append("")
    out.append("Each cell: GFLOP/s (fraction of the FMA peak) · peak resident set of the process. "
               "FLOPs are counted the same way for every implementation: 4·D per visible (query, key) "
               "pair, 10·D for the backward.")
    out.append("")
    out.append("Implementations:")
    labels = OrderedDict()  # (impl, label) -> details seen (e.g. the SDPA backend per case)
    for r in rows:
        if r["status"] == "ok":
            detail = (r.get("detail") or "").split("; RSS")[0]
            labels.setdefault((r["impl"], r["label"]), OrderedDict())[detail] = None
    for impl in impls:
        shown = [k for k in labels if k[0] == impl]
        if not shown:
            reasons = OrderedDict.fromkeys(r["reason"] for r in rows if r["impl"] == impl and r.get("reason"))
            out.append(f"- **{impl}**: not measured here: {'; '.join(reasons)}")
        for key in shown:
            details = [d for d in labels[key] if d]
            more = f" (and {len(details) - 2} more)" if len(details) > 2 else ""
            out.append(f"- **{impl}**: {key[1]}" + (f" — {' / '.join(details[:2])}{more}" if details else ""))
    reasons = OrderedDict()
    for pass_name in OrderedDict.fromkeys(r["pass"] for r in rows):
        out.append("")
        out.append(f"### {PASS_TITLE.get(pass_name, pass_name)}")
        out.append("")
        out.append("| D | mask | dtype | N | " + " | ".join(impls) + " |")
        out.append("|---|---|---|---:|" + "---:|" * len(impls))
        cases = OrderedDict()
        for r in rows:
            if r["pass"] == pass_name:
                cases.setdefault((int(r["dim"]), r["mask"], r["dtype"], int(r["seq"])), {})[r["impl"]] = r
        for (dim, mask, dtype, seq), by_impl in cases.items():
            cells = []
            for impl in impls:
                r = by_impl.get(impl)
                if r is None:
                    cells.append("")
                    continue
                text = cell(r)
                if r["status"] != "ok" and r.get("reason"):
                    note = reasons.setdefault(r["reason"], len(reasons) + 1)
                    text += f" [{note}]"
                cells.append(text)
            out.append(f"| {dim} | {mask_title(mask, rows)} | {dtype} | {seq} | " + " | ".join(cells) + " |")
    if reasons:
        out.append("")
        out.append("Notes:")
        for reason, note in reasons.items():
            out.append(f"{note}. {reason}")
    return "\n".join(out) + "\n"


def splice(doc_path, table):
    with open(doc_path) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"report.py: {doc_path} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(doc_path, "w") as f:
        f.write(head + BEGIN + "\n" + table + END + tail)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="result files (.json or .csv)")
    parser.add_argument("--img-dir", default="docs/img")
    parser.add_argument("--table", default="", help="write the Markdown table here")
    parser.add_argument("--doc", default="", help="splice the table into this Markdown file between markers")
    parser.add_argument("--command", action="append", default=[], help="command to cite (repeatable)")
    args = parser.parse_args(argv)
    for path in args.results:
        if not os.path.isfile(path):
            print(f"report.py: no such result file: {path}", file=sys.stderr)
            return 2
    try:
        machine, rows = load(args.results)
    except (ValueError, KeyError) as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("report.py: the result files hold no rows", file=sys.stderr)
        return 2
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.img_dir, exist_ok=True)
    line = machine_summary(machine, rows)
    written = []
    for pass_name in OrderedDict.fromkeys(r["pass"] for r in rows):
        p = plot_pass(plt, rows, pass_name, os.path.join(args.img_dir, f"bench_{pass_name}.png"), line)
        if p:
            written.append(p)
    written.append(plot_memory(plt, rows, os.path.join(args.img_dir, "bench_memory.png"), line))
    table = markdown(machine, rows, args.command)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)
        written.append(args.table)
    if args.doc:
        splice(args.doc, table)
        written.append(args.doc)
    for p in written:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
