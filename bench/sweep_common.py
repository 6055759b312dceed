"""What bench/sweep_peers.py, bench/run_report.py and bench/report.py share
with `tileattn bench --sweep` (src/cli/sweep.cpp): the grid flags and their
defaults, the FLOP count, the adaptive repetitions, the row columns, the
result files (JSON document or CSV) and the progress bar. Keep it in step with
the C++ side; tests/python/test_report.py checks that they agree."""
import csv
import io
import json
import math
import os
import sys
import time

SCHEMA = "tileattn-bench-sweep/1"
# The row columns, in order (src/cli/sweep_rows.cpp; docs/benchmarks.md).
COLUMNS = ["impl", "label", "status", "reason", "pass", "seq", "q_len", "kv_len", "dim", "mask",
           "window_left", "window_right", "dtype", "batch", "heads", "kv_heads", "threads", "reps",
           "ms", "gflops", "fraction_of_peak", "peak_gflops", "peak_rss_mb", "flops", "detail"]
NUMERIC = {"seq", "q_len", "kv_len", "dim", "window_left", "window_right", "batch", "heads", "kv_heads",
           "threads", "reps", "ms", "gflops", "fraction_of_peak", "peak_gflops", "peak_rss_mb", "flops"}
STATUSES = ("ok", "missing", "skipped", "unsupported", "error")

DEFAULT_SEQS = [512, 1024, 2048, 4096, 8192, 16384]
DEFAULT_DIMS = [64, 128]
MASKS = ("none", "causal", "window")
DTYPES = ("fp32", "fp16", "bf16")
PASSES = ("forward", "backward", "decode")
ADAPTIVE_FLOPS = 1.5e11  # about a second or two of timed runs per case
MAX_ADAPTIVE_REPS = 100  # as src/cli/sweep.cpp (which says why not 10)


class UsageError(Exception):
    pass


def hardware_threads():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _ints(flag, text, low, high):
    values = []
    for part in text.split(","):
        try:
            v = int(part)
        except ValueError:
            raise UsageError(f"{flag}: expected a whole number, got '{part}'")
        if not low <= v <= high:
            raise UsageError(f"{flag}: must be in {low}..{high}, got {v}")
        if v in values:
            raise UsageError(f"{flag}: {v} given twice")
        values.append(v)
    return values


def _words(flag, text, allowed):
    words = text.split(",")
    for w in words:
        if w not in allowed:
            raise UsageError(f"{flag}: unknown entry '{w}' (expected {', '.join(sorted(allowed))})")
    if len(set(words)) != len(words):
        raise UsageError(f"{flag}: an entry is given twice")
    return words


def add_sweep_arguments(parser, impls):
    """The grid flags of `tileattn bench --sweep`, with its defaults."""
    parser.add_argument("--seqs", default=",".join(map(str, DEFAULT_SEQS)))
    parser.add_argument("--dims", default=",".join(map(str, DEFAULT_DIMS)))
    parser.add_argument("--masks", default=",".join(MASKS))
    parser.add_argument("--dtypes", default="fp32")
    parser.add_argument("--passes", default="forward")
    parser.add_argument("--impls", default=",".join(impls))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--window", default="256,0", help="L,R of the 'window' mask (-1: unbounded)")
    parser.add_argument("--threads", type=int, default=hardware_threads())
    parser.add_argument("--reps", type=int, default=0, help="timed runs per case (0: adaptive)")
    parser.add_argument("--peak-gflops", type=float, default=0.0,
                        help="FMA peak for fraction_of_peak (tileattn info --json: peak_gflops)")
    parser.add_argument("--out", default="", help="result file, .json or .csv")
    parser.add_argument("--json", action="store_true", help="print the result document on stdout")
    parser.set_defaults(all_impls=tuple(impls))


def plan_from_args(args):
    """Checks the grid flags; returns the plan as a dict."""
    window = _ints_pair(args.window)
    for flag, value in (("--batch", args.batch), ("--heads", args.heads), ("--threads", args.threads)):
        if value < 1:
            raise UsageError(f"{flag}: must be at least 1, got {value}")
    kv_heads = args.kv_heads or args.heads
    if kv_heads < 1 or args.heads % kv_heads:
        raise UsageError(f"--kv-heads: {kv_heads} must divide --heads {args.heads}")
    if args.reps < 0:
        raise UsageError(f"--reps: must be at least 0, got {args.reps}")
    if args.out and not args.out.endswith((".json", ".csv")):
        raise UsageError(f"--out: expected a .json or .csv file name, got '{args.out}'")
    return {
        "seqs": _ints("--seqs", args.seqs, 1, 1 << 24),
        # As `tileattn bench --sweep`: each case gives V Q/K's head dim, so D stops at V's 512.
        "dims": _ints("--dims", args.dims, 1, 512),
        "masks": _words("--masks", args.masks, set(MASKS)),
        "dtypes": _words("--dtypes", args.dtypes, set(DTYPES)),
        "passes": _words("--passes", args.passes, set(PASSES)),
        "impls": _words("--impls", args.impls, set(args.all_impls)),
        "batch": args.batch, "heads": args.heads, "kv_heads": kv_heads,
        "window_left": window[0], "window_right": window[1],
        "threads": args.threads, "reps": args.reps,
    }


def _ints_pair(text):
    parts = text.split(",")
    if len(parts) != 2:
        raise UsageError(f"--window: expected L,R (e.g. 256,0; -1 = unbounded), got '{text}'")
    left, right = _ints("--window", parts[0], -1, 1 << 40)[0], _ints("--window", parts[1], -1, 1 << 40)[0]
    return left, right


def q_len(case):
    return 1 if case["pass"] == "decode" else case["seq"]


def visible_pairs(nq, nk, left, right):
    """(query, key) pairs a band leaves visible (src/core/band.hpp), bottom-right aligned."""
    total = 0
    for i in range(nq):
        center = i + nk - nq
        first = 0 if left < 0 else max(0, center - left)
        last = nk if right < 0 else min(nk, center + right + 1)
        total += max(0, last - first)
    return total


def band_of(mask, window_left, window_right):
    if mask == "causal":
        return -1, 0
    if mask == "window":
        return window_left, window_right
    return -1, -1


def case_flops(case):
    left, right = band_of(case["mask"], case["window_left"], case["window_right"])
    per_pair = (10.0 if case["pass"] == "backward" else 4.0) * case["dim"]
    return per_pair * visible_pairs(q_len(case), case["seq"], left, right) * case["batch"] * case["heads"]


def adaptive_reps(flops):
    return int(min(max(math.floor(ADAPTIVE_FLOPS / max(flops, 1.0)), 1), MAX_ADAPTIVE_REPS))


def cases(plan):
    """Every combination, in the order of `tileattn bench --sweep`: pass, dim, mask, dtype, seq."""
    out = []
    for p in plan["passes"]:
        for d in plan["dims"]:
            for m in plan["masks"]:
                for t in plan["dtypes"]:
                    for n in plan["seqs"]:
                        case = {"pass": p, "dim": d, "mask": m, "dtype": t, "seq": n,
                                "batch": plan["batch"], "heads": plan["heads"], "kv_heads": plan["kv_heads"],
                                "window_left": plan["window_left"], "window_right": plan["window_right"],
                                "threads": plan["threads"]}
                        case["flops"] = case_flops(case)
                        out.append(case)
    return out


def base_row(impl, case, reps, peak):
    """A row with the case's columns filled and the measured ones empty."""
    left, right = band_of(case["mask"], case["window_left"], case["window_right"])
    row = dict.fromkeys(COLUMNS)
    row.update({"impl": impl, "label": impl, "pass": case["pass"], "seq": case["seq"], "q_len": q_len(case),
                "kv_len": case["seq"], "dim": case["dim"], "mask": case["mask"], "window_left": left,
                "window_right": right, "dtype": case["dtype"], "batch": case["batch"], "heads": case["heads"],
                "kv_heads": case["kv_heads"], "threads": case["threads"], "reps": reps, "peak_gflops": peak,
                "flops": case["flops"]})
    return row


def case_name(case, impl):
    return f"D={case['dim']} {case['mask']} N={case['seq']} {case['dtype']} {impl}"


def estimated_seconds(case, plan, impl):
    """Rough cost for the time-left estimate: interpreter start and import,
    plus warm-up and timed runs at an assumed 20 GFLOP/s."""
    reps = plan["reps"] or adaptive_reps(case["flops"])
    return 2.0 + (reps + 1) * case["flops"] / 20e9


# --------------------------------------------------------------- files

def document(command, machine, rows):
    return {"schema": SCHEMA, "command": command, "machine": machine, "rows": rows}


def write_rows(path, command, machine, rows):
    """JSON document or CSV (by extension), written whole then renamed into place."""
    partial = path + ".partial"
    with open(partial, "w", newline="") as f:
        if path.endswith(".csv"):
            f.write(rows_to_csv(rows))
        else:
            json.dump(document(command, machine, rows), f, indent=1)
            f.write("\n")
    os.replace(partial, path)


def rows_to_csv(rows):
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else _csv_value(row[c]) for c in COLUMNS])
    return out.getvalue()


def _csv_value(value):
    if isinstance(value, float):
        return format(value, ".9g")
    return value


def read_rows(path):
    """(machine, rows) from a JSON document or a CSV file; CSV numbers become floats."""
    with open(path) as f:
        if path.endswith(".csv"):
            rows = []
            for raw in csv.DictReader(f):
                row = {}
                for c in COLUMNS:
                    v = raw.get(c, "")
                    row[c] = None if v == "" else float(v) if c in NUMERIC else v
                rows.append(row)
            return {}, rows
        doc = json.load(f)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} document")
    return doc.get("machine", {}), doc["rows"]


def print_table(rows, file=None):
    file = file or sys.stdout
    print(f"{'impl':15} {'pass':8} {'D':>4} {'mask':7} {'dtype':5} {'N':>6} {'status':11} {'ms':>10} "
          f"{'GFLOP/s':>9} {'%peak':>6} {'RSS MB':>8}", file=file)
    for r in rows:
        def num(c, spec):
            return "-" if r.get(c) is None else format(r[c], spec)
        frac = "-" if r.get("fraction_of_peak") is None else f"{100 * r['fraction_of_peak']:.1f}"
        reason = f"  {r['reason']}" if r.get("reason") else ""
        print(f"{r['impl']:15} {r['pass']:8} {r['dim']:>4} {r['mask']:7} {r['dtype']:5} {r['seq']:>6} "
              f"{r['status']:11} {num('ms', '.3f'):>10} {num('gflops', '.1f'):>9} {frac:>6} "
              f"{num('peak_rss_mb', '.0f'):>8}{reason}", file=file)


# --------------------------------------------------------------- progress

def duration(seconds):
    s = int(max(0.0, seconds) + 0.5)
    if s >= 3600:
        return f"{s // 3600}h{(s // 60) % 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """The one-line bar of src/cli/progress.cpp: stage, case i/n, elapsed, time
    left (the elapsed time scaled by the estimated work still to do). Draws only
    when enabled (stderr a terminal, no --json)."""
    BAR = 20
    WIDTH = 118

    def __init__(self, enabled, steps, total_work):
        self.enabled, self.steps, self.total = enabled, steps, max(total_work, 1e-30)
        self.done, self.start, self.drawn = 0.0, time.monotonic(), False
        self.stage, self.index, self.what = "", 0, ""

    def begin(self, stage, index, what):
        self.stage, self.index, self.what = stage, index, what
        self._draw()

    def end(self, work):
        self.done += work
        self._draw()

    def _draw(self):
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        filled = int(min(1.0, self.done / self.total) * self.BAR + 0.5)
        line = (f"[{self.stage}] case {self.index + 1}/{self.steps} {'#' * filled}{'.' * (self.BAR - filled)}"
                f"  {self.what}  elapsed {duration(elapsed)}")
        if self.done > 0:
            line += f"  left ~{duration(elapsed * (self.total - self.done) / self.done)}"
        sys.stderr.write("\r" + line[:self.WIDTH] + "\033[K")
        sys.stderr.flush()
        self.drawn = True

    def finish(self):
        if self.drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.drawn = False
