#include "cli/sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <set>

#include "cli/progress.hpp"
#include "cli/report.hpp"
#include "cli/sweep_child.hpp"
#include "cli/sweep_rows.hpp"
#include "core/band.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::cli {

namespace {

constexpr int64_t kMaxSeq = int64_t{1} << 24;
// Timed runs per case: about 1.5e11 FLOPs of them (a second or two), at most
// 100. The cap was 10: a 2 ms case then took its median over 20 ms, which a
// transient (another process starting, a vCPU waking) skews whole (Intel
// Xeon model 207, H4 N512 D128: 189 GFLOP/s in a 10-rep report row, 231-268
// in repeated and interleaved runs); 100 runs of it span 0.2 s.
constexpr double kAdaptiveFlops = 1.5e11;
constexpr int kMaxAdaptiveReps = 100;

std::vector<std::string> checked_words(const Args& args, const std::string& flag,
                                       const std::vector<std::string>& fallback,
                                       const std::set<std::string>& allowed) {
  const std::vector<std::string> words = args.text_list(flag, fallback);
  std::set<std::string> seen;
  for (const std::string& w : words) {
    if (!allowed.count(w)) {
      std::string list;
      for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw UsageError(flag + ": unknown entry '" + w + "' (expected " + list + ")");
    }
    if (!seen.insert(w).second) throw UsageError(flag + ": '" + w + "' given twice");
  }
  return words;
}

std::vector<int64_t> checked_numbers(const Args& args, const std::string& flag, const std::vector<int64_t>& fallback,
                                     int64_t min, int64_t max) {
  const std::vector<int64_t> values = args.integer_list(flag, fallback, min, max);
  std::set<int64_t> seen;
  for (int64_t v : values)
    if (!seen.insert(v).second) throw UsageError(flag + ": " + std::to_string(v) + " given twice");
  return values;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string load_average() {
  double load[1] = {NAN};
  if (getloadavg(load, 1) < 1) return "null";
  return json_number(load[0]);
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string case_name(const SweepCase& c, const std::string& impl) {
  return "D=" + std::to_string(c.dim) + " " + c.mask + " N=" + std::to_string(c.seq) + " " + c.dtype + " " + impl;
}

// The `tileattn bench` command line of one (implementation, case).
std::vector<std::string> child_command(const std::string& exe, const SweepPlan& plan, const SweepCase& c,
                                       const std::string& impl, int reps, double peak) {
  std::vector<std::string> a = {exe, "bench", "--json", "--impl", impl,
                                "--batch", std::to_string(plan.batch), "--heads", std::to_string(plan.heads),
                                "--kv-heads", std::to_string(plan.kv_heads),
                                c.pass == "decode" ? "--kv-seq" : "--seq", std::to_string(c.seq),
                                "--dim", std::to_string(c.dim), "--dtype", c.dtype,
                                "--threads", std::to_string(plan.threads), "--reps", std::to_string(reps),
                                "--peak-gflops", json_number(peak)};
  if (c.mask == "causal") a.push_back("--causal");
  if (c.mask == "window")
    a.insert(a.end(), {"--window", std::to_string(plan.window_left) + "," + std::to_string(plan.window_right)});
  if (c.pass == "backward") a.push_back("--backward");
  if (c.pass == "decode") a.push_back("--decode");
  return a;
}

SweepRow case_row(const SweepPlan& plan, const SweepCase& c, const std::string& impl, int reps, double peak) {
  SweepRow row;
  row.text("impl", impl == "openblas" ? "naive-openblas" : impl);
  row.text("label", impl == "openblas" ? "naive GEMM+softmax+GEMM (OpenBLAS)" : "tileattn");
  row.text("pass", c.pass);
  row.number("seq", double(c.seq));
  row.number("q_len", double(c.q_len()));
  row.number("kv_len", double(c.seq));
  row.number("dim", double(c.dim));
  row.text("mask", c.mask);
  row.number("window_left", c.mask == "window" ? double(plan.window_left) : -1);
  row.number("window_right", c.mask == "window" ? double(plan.window_right) : c.mask == "causal" ? 0 : -1);
  row.text("dtype", c.dtype);
  row.number("batch", double(plan.batch));
  row.number("heads", double(plan.heads));
  row.number("kv_heads", double(plan.kv_heads));
  row.number("threads", plan.threads);
  row.number("reps", reps);
  row.number("peak_gflops", peak);
  row.number("flops", case_flops(plan, c));
  return row;
}

double field_number(const std::map<std::string, std::string>& fields, const std::string& key) {
  auto it = fields.find(key);
  if (it == fields.end() || it->second == "null") return NAN;
  return std::strtod(it->second.c_str(), nullptr);
}

std::string field_text(const std::map<std::string, std::string>& fields, const std::string& key) {
  auto it = fields.find(key);
  return it == fields.end() ? "" : it->second;
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const std::size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// Runs one (implementation, case) and fills the measured columns of `row`.
void measure(SweepRow& row, const std::vector<std::string>& command, const std::string& impl) {
  const ChildResult r = run_child(command);
  row.number("peak_rss_mb", r.peak_rss_mb);
  if (r.status != 0) {
    row.text("status", "error");
    row.text("reason", "exit status " + std::to_string(r.status) + ": " + last_line(r.err));
    return;
  }
  std::map<std::string, std::string> fields;
  try {
    fields = parse_flat_json(r.out);
  } catch (const Error& e) {
    row.text("status", "error");
    row.text("reason", e.what());
    return;
  }
  const double peak = field_number(fields, "peak_gflops");
  if (impl == "tileattn") {
    row.text("label", "tileattn (" + field_text(fields, "isa") + ")");
    row.number("ms", field_number(fields, "ms"));
    row.number("gflops", field_number(fields, "gflops"));
    row.number("fraction_of_peak", field_number(fields, "fraction_of_peak"));
    row.text("detail", "tiles " + field_text(fields, "block_q") + "x" + field_text(fields, "block_kv") + " (" +
                           field_text(fields, "tile_reason") + ")");
    row.text("status", "ok");
    return;
  }
  if (!field_text(fields, "baseline_error").empty() && field_text(fields, "baseline_error") != "null") {
    row.text("status", "missing");
    row.text("reason", "OpenBLAS not loadable: " + field_text(fields, "baseline_error"));
    return;
  }
  const double gflops = field_number(fields, "baseline_gflops");
  row.number("ms", field_number(fields, "baseline_ms"));
  row.number("gflops", gflops);
  row.number("fraction_of_peak", gflops / peak);
  row.number("reps", field_number(fields, "baseline_reps"));
  row.text("detail", "OpenBLAS core " + field_text(fields, "baseline_core") + "; computes in fp32");
  row.text("status", "ok");
}

// A rough cost of one step for the time-left estimate: process start-up
// plus the timed runs at an assumed share of the peak.
double estimated_seconds(const std::string& impl, double flops, int reps, double peak) {
  const double share = impl == "tileattn" ? 0.4 : 0.15;
  return 0.3 + double(reps + 1) * flops / (share * peak * 1e9);
}

void print_table(const std::vector<SweepRow>& rows) {
  std::printf("%-15s %-8s %4s %-7s %-5s %6s %-8s %10s %9s %6s %9s\n", "impl", "pass", "D", "mask", "dtype", "N",
              "status", "ms", "GFLOP/s", "%peak", "RSS MB");
  for (const SweepRow& r : rows) {
    const std::string frac = r.get("fraction_of_peak");
    char percent[16] = "";
    if (!frac.empty()) std::snprintf(percent, sizeof percent, "%.1f", 100 * std::strtod(frac.c_str(), nullptr));
    auto num = [&](const std::string& column, const char* format) {
      const std::string v = r.get(column);
      if (v.empty()) return std::string("-");
      char buf[32];
      std::snprintf(buf, sizeof buf, format, std::strtod(v.c_str(), nullptr));
      return std::string(buf);
    };
    std::printf("%-15s %-8s %4s %-7s %-5s %6s %-8s %10s %9s %6s %9s%s%s\n", r.get("impl").c_str(),
                r.get("pass").c_str(), r.get("dim").c_str(), r.get("mask").c_str(), r.get("dtype").c_str(),
                r.get("seq").c_str(), r.get("status").c_str(), num("ms", "%.3f").c_str(),
                num("gflops", "%.1f").c_str(), percent[0] ? percent : "-", num("peak_rss_mb", "%.0f").c_str(),
                r.get("reason").empty() ? "" : "  ", r.get("reason").c_str());
  }
}

}  // namespace

SweepPlan parse_sweep_plan(const Args& args) {
  for (const char* flag : {"--seq", "--kv-seq", "--dim", "--dtype", "--causal", "--backward", "--decode", "--impl",
                           "--no-baseline"})
    if (args.has(flag))
      throw UsageError(std::string(flag) + ": not with --sweep (use --seqs, --dims, --dtypes, --masks, --passes, --impls)");
  // One-case options that the sweep's cases, rows and FLOP counts do not carry.
  for (const char* flag : {"--softcap", "--alibi", "--sinks", "--bf16-probabilities", "--dim-v", "--bf16-peak-gflops"})
    if (args.has(flag))
      throw UsageError(std::string(flag) + ": not with --sweep (its cases run without it; time it with a one-case bench)");
  SweepPlan p;
  p.seqs = checked_numbers(args, "--seqs", p.seqs, 1, kMaxSeq);
  // Each case's V has Q/K's head dim, so D stops at V's limit (512), below Q/K's (576).
  p.dims = checked_numbers(args, "--dims", p.dims, 1, INT64_MAX);
  for (int64_t d : p.dims)
    if (d > kMaxValueHeadDim)
      throw UsageError("--dims: must be in 1.." + std::to_string(kMaxValueHeadDim) +
                       " in a sweep (its cases give V Q/K's head dim; bench --dim D --dim-v DV times D up to " +
                       std::to_string(kMaxHeadDim) + "), got " + std::to_string(d));
  p.masks = checked_words(args, "--masks", p.masks, {"none", "causal", "window"});
  p.dtypes = checked_words(args, "--dtypes", p.dtypes, {"fp32", "fp16", "bf16"});
  p.passes = checked_words(args, "--passes", p.passes, {"forward", "backward", "decode"});
  p.impls = checked_words(args, "--impls", p.impls, {"tileattn", "openblas"});
  p.batch = args.integer("--batch", p.batch, 1, int64_t{1} << 20);
  p.heads = args.integer("--heads", p.heads, 1, int64_t{1} << 20);
  p.kv_heads = args.integer("--kv-heads", p.heads, 1, int64_t{1} << 20);
  if (p.heads % p.kv_heads != 0)
    throw UsageError("--kv-heads: " + std::to_string(p.kv_heads) + " must divide --heads " + std::to_string(p.heads));
  if (args.has("--window")) std::tie(p.window_left, p.window_right) = args.window("--window");
  p.threads = int(args.integer("--threads", hardware_threads(), 1, 4096));
  p.reps = int(args.integer("--reps", 0, 1, 1000));
  p.peak_gflops = args.number("--peak-gflops", 0, 1e-3, 1e9);
  p.max_naive_mb = args.number("--max-naive-mb", p.max_naive_mb, 0, 1e9);
  p.json = args.has("--json");
  p.out = args.text("--out", "");
  if (!p.out.empty()) {
    if (!ends_with(p.out, ".json") && !ends_with(p.out, ".csv"))
      throw UsageError("--out: expected a .json or .csv file name, got '" + p.out + "'");
    const std::size_t slash = p.out.rfind('/');
    const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : p.out.substr(0, slash);
    if (access(folder.c_str(), W_OK) != 0)
      throw UsageError("--out: folder '" + folder + "' does not exist or is not writable");
  }
  return p;
}

std::vector<SweepCase> sweep_cases(const SweepPlan& plan) {
  std::vector<SweepCase> cases;
  for (const std::string& pass : plan.passes)
    for (int64_t dim : plan.dims)
      for (const std::string& mask : plan.masks)
        for (const std::string& dtype : plan.dtypes)
          for (int64_t seq : plan.seqs) cases.push_back({pass, mask, dtype, seq, dim});
  return cases;
}

double case_flops(const SweepPlan& plan, const SweepCase& c) {
  const detail::Band band = detail::make_band(c.mask == "causal", c.mask == "window" ? plan.window_left : -1,
                                              c.mask == "window" ? plan.window_right : -1);
  const double per_pair = (c.pass == "backward" ? 10.0 : 4.0) * double(c.dim);
  return per_pair * double(detail::band_pairs(band, c.q_len(), c.seq)) * double(plan.batch * plan.heads);
}

int adaptive_reps(double flops) {
  return int(std::clamp(std::floor(kAdaptiveFlops / std::max(flops, 1.0)), 1.0, double(kMaxAdaptiveReps)));
}

double naive_matrix_mb(const SweepCase& c) {
  const double matrices = c.pass == "backward" ? 2 : 1;  // P (and dP) for the backward
  return matrices * double(c.q_len()) * double(c.seq) * 4.0 / (1024.0 * 1024.0);
}

int run_sweep(const SweepPlan& plan, int argc, char** argv) {
  std::string command = "tileattn";
  for (int i = 0; i < argc; ++i) command += std::string(" ") + argv[i];
  const Isa isa = resolve_isa(Isa::automatic);
  const bool measured_peak = plan.peak_gflops <= 0;
  const double peak = measured_peak ? measure_fma_peak_gflops(plan.threads, isa) : plan.peak_gflops;
  const std::string exe = self_executable();
  const std::string machine_head = "{\"cpu\": " + json_quote(cpu_features().brand) + ", \"isa\": " +
                                   json_quote(isa_name(isa)) + ", \"hardware_threads\": " +
                                   std::to_string(hardware_threads()) + ", \"threads\": " +
                                   std::to_string(plan.threads) + ", \"peak_gflops\": " + json_number(peak) +
                                   ", \"peak_measured\": " + (measured_peak ? "true" : "false") +
                                   ", \"started\": " + json_quote(now_utc()) +
                                   ", \"load_average_start\": " + load_average();
  auto machine = [&] { return machine_head + ", \"load_average_end\": " + load_average() + "}"; };

  const std::vector<SweepCase> cases = sweep_cases(plan);
  struct Step {
    const SweepCase* c;
    std::string impl;
    int reps;
    double seconds;
  };
  std::vector<Step> steps;
  double total_seconds = 0;
  for (const SweepCase& c : cases)
    for (const std::string& impl : plan.impls) {
      const double flops = case_flops(plan, c);
      const int reps = plan.reps > 0 ? plan.reps : adaptive_reps(flops);
      const bool skipped = impl == "openblas" && naive_matrix_mb(c) > plan.max_naive_mb;
      const double seconds = skipped ? 0 : estimated_seconds(impl, flops, impl == "openblas" ? std::min(reps, 3) : reps, peak);
      steps.push_back({&c, impl, reps, seconds});
      total_seconds += seconds;
    }

  Progress progress(Progress::stderr_is_terminal() && !plan.json, int(steps.size()), total_seconds);
  std::vector<SweepRow> rows;
  int failed = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    progress.begin(s.c->pass, int(i), case_name(*s.c, s.impl));
    SweepRow row = case_row(plan, *s.c, s.impl, s.reps, peak);
    if (s.impl == "openblas" && naive_matrix_mb(*s.c) > plan.max_naive_mb) {
      char reason[160];
      std::snprintf(reason, sizeof reason, "skipped: its N x N matrices would take %.4g MB (> --max-naive-mb %.4g)",
                    naive_matrix_mb(*s.c), plan.max_naive_mb);
      row.text("status", "skipped");
      row.number("reps", NAN);
      row.text("reason", reason);
    } else {
      measure(row, child_command(exe, plan, *s.c, s.impl, s.reps, peak), s.impl);
    }
    failed += row.get("status") == "error";
    rows.push_back(row);
    if (!plan.out.empty()) write_sweep_file(plan.out, command, machine(), rows);
    progress.end(s.seconds);
  }
  progress.finish();
  if (plan.json) {
    const std::string doc = sweep_document(command, machine(), rows);
    std::fwrite(doc.data(), 1, doc.size(), stdout);
  } else {
    print_table(rows);
    if (!plan.out.empty()) std::printf("wrote %zu rows to %s\n", rows.size(), plan.out.c_str());
  }
  std::fflush(stdout);
  if (failed) std::fprintf(stderr, "tileattn: bench --sweep: %d case(s) failed (status \"error\" in the rows)\n", failed);
  return failed ? 1 : 0;
}

}  // namespace tileattn::cli
