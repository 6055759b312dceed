// `tileattn bench`: times attention_forward (a warm-up run, then the median of
// --reps runs) and a naive OpenBLAS attention on the same inputs, and reports
// both as ratios: to the FMA peak measured in the same run, and to each other.
#include <cmath>
#include <cstdio>
#include <string>

#include "cli/args.hpp"
#include "cli/band.hpp"
#include "cli/commands.hpp"
#include "cli/naive_baseline.hpp"
#include "cli/openblas.hpp"
#include "cli/report.hpp"
#include "cli/timing.hpp"
#include "core/thread_pool.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::cli {

namespace {

const char* const kHelp =
    "usage: tileattn bench [--batch B] [--heads H] [--kv-heads HKV] [--seq N] [--kv-seq M]\n"
    "                      [--dim D] [--dtype fp32|fp16|bf16] [--causal] [--window L,R]\n"
    "                      [--threads T] [--reps R] [--backward] [--no-baseline] [--json]\n"
    "Defaults: B=1 H=8 HKV=H N=M=1024 D=128 fp32, every hardware thread, R=5.\n"
    "Reports ms (median of R after a warm-up), gflops (4*D flops per visible (query, key)\n"
    "pair), fraction_of_peak (of the FMA peak measured now with the same threads),\n"
    "peak_rss_mb (before the baseline runs), and for the naive OpenBLAS baseline (S = Q K^T\n"
    "materialized, softmax, P V; fp32) baseline_ms and speedup_vs_baseline.\n"
    "--backward times attention_backward instead (10*D flops per visible pair; the baseline\n"
    "is the same sgemm formulation of dQ, dK, dV).\n";

constexpr int64_t kMaxSize = int64_t{1} << 31;

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args args(argc, argv,
            {{"--batch", true}, {"--heads", true}, {"--kv-heads", true}, {"--seq", true},
             {"--kv-seq", true}, {"--dim", true}, {"--dtype", true}, {"--causal", false},
             {"--window", true}, {"--threads", true}, {"--reps", true}, {"--backward", false},
             {"--no-baseline", false}, {"--json", false}});
  if (args.has("--help")) return std::fputs(kHelp, stdout), 0;
  const bool json = args.has("--json");
  const int64_t batch = args.integer("--batch", 1, 1, kMaxSize);
  const int64_t heads = args.integer("--heads", 8, 1, kMaxSize);
  const int64_t kv_heads = args.integer("--kv-heads", heads, 1, kMaxSize);
  const int64_t seq = args.integer("--seq", 1024, 1, kMaxSize);
  const int64_t kv_seq = args.integer("--kv-seq", seq, 1, kMaxSize);
  const int64_t dim = args.integer("--dim", 128, 1, 256);
  const DType dtype = parse_dtype(args.text("--dtype", "fp32"));
  const bool causal = args.has("--causal");
  const auto [window_left, window_right] = args.window("--window");
  const int threads = int(args.integer("--threads", hardware_threads(), 1, 4096));
  const int reps = int(args.integer("--reps", 5, 1, 1000));
  const bool backward = args.has("--backward");
  if (heads % kv_heads != 0)
    throw UsageError("--kv-heads: " + std::to_string(kv_heads) + " must divide --heads " + std::to_string(heads));
  int64_t q_elems = 0, k_elems = 0;
  if (__builtin_mul_overflow(batch * heads, seq * dim, &q_elems) ||
      __builtin_mul_overflow(batch * kv_heads, kv_seq * dim, &k_elems))
    throw UsageError("bench: shape is too large");

  // Only q, k, v and o are allocated for our kernel (the memory target).
  const TypedBuffer q = random_buffer(dtype, q_elems, 1);
  const TypedBuffer k = random_buffer(dtype, k_elems, 2);
  const TypedBuffer v = random_buffer(dtype, k_elems, 3);
  TypedBuffer o = zeros(dtype, q_elems);
  ForwardArgs fa;
  fa.shape = {batch, heads, kv_heads, seq, kv_seq, dim};
  fa.dtype = dtype;
  fa.q = {q.data(), dense_strides(Layout::bhsd, batch, heads, seq, dim)};
  fa.k = {k.data(), dense_strides(Layout::bhsd, batch, kv_heads, kv_seq, dim)};
  fa.v = {v.data(), fa.k.stride};
  fa.o = {o.data(), fa.q.stride};
  fa.mask.causal = causal;
  fa.mask.window_left = window_left;
  fa.mask.window_right = window_right;
  fa.threads = threads;
  validate(fa);
  // The backward also needs the forward's LSE, dO and the three gradients.
  std::vector<float> lse;
  TypedBuffer d_o, dq, dk, dv;
  BackwardArgs ba;
  if (backward) {
    lse.assign(size_t(batch * heads * seq), 0.0f);
    fa.lse = lse.data();
    fa.lse_stride = {heads * seq, seq, 1};
    d_o = random_buffer(dtype, q_elems, 4);
    dq = zeros(dtype, q_elems);
    dk = zeros(dtype, k_elems);
    dv = zeros(dtype, k_elems);
    ba.forward = fa;
    ba.o = {o.data(), fa.o.stride};
    ba.d_o = {d_o.data(), fa.q.stride};
    ba.lse = lse.data();
    ba.lse_stride = fa.lse_stride;
    ba.dq = {dq.data(), fa.q.stride};
    ba.dk = {dk.data(), fa.k.stride};
    ba.dv = {dv.data(), fa.k.stride};
  }

  const BandMask band = BandMask::from(causal, window_left, window_right);
  const double flops_per_pair = (backward ? 10.0 : 4.0) * double(dim);
  const double flops = flops_per_pair * double(band.pairs(seq, kv_seq)) * double(batch * heads);
  const Isa isa = resolve_isa(Isa::automatic);
  const TileShape tiles = choose_tiles(isa, dim, dtype);
  const double peak = measure_fma_peak_gflops(threads, isa);

  // Warm-up: page in the buffers, start the thread pool (and O, LSE for the backward).
  attention_forward(fa);
  if (backward) attention_backward(ba);
  std::vector<double> rep_ms;
  for (int r = 0; r < reps; ++r)
    rep_ms.push_back(time_ms([&] { backward ? attention_backward(ba) : attention_forward(fa); }));
  const double ms = median(rep_ms);
  const double gflops = flops / (ms * 1e-3) * 1e-9;
  const double rss = peak_rss_mb();

  Report rep;
  rep.integer("batch", batch);
  rep.integer("heads", heads);
  rep.integer("kv_heads", kv_heads);
  rep.integer("seq", seq);
  rep.integer("kv_seq", kv_seq);
  rep.integer("dim", dim);
  rep.text("dtype", dtype_name(dtype));
  rep.boolean("causal", causal);
  rep.integer("window_left", window_left);
  rep.integer("window_right", window_right);
  rep.boolean("backward", backward);
  rep.text("isa", isa_name(isa));
  rep.integer("threads", threads);
  rep.integer("block_q", tiles.block_q);
  rep.integer("block_kv", tiles.block_kv);
  rep.text("tile_reason", tiles.reason);
  rep.integer("reps", reps);
  std::string reps_human;
  for (double t : rep_ms) reps_human += (reps_human.empty() ? "" : " ") + json_number(t);
  rep.raw("rep_ms", json_number_array(rep_ms), reps_human);
  rep.number("flops", flops);
  rep.number("ms", ms);
  rep.number("gflops", gflops);
  rep.number("peak_gflops", peak);
  rep.number("fraction_of_peak", gflops / peak);
  rep.number("peak_rss_mb", rss);

  if (args.has("--no-baseline")) {
    rep.boolean("baseline", false);
    rep.print(json);
    return 0;
  }
  const OpenBlas& blas = load_openblas();
  if (!blas.loaded) {
    for (const char* key : {"baseline_ms", "baseline_gflops", "speedup_vs_baseline", "baseline_core",
                            "baseline_peak_rss_mb"})
      rep.null(key);
    rep.text("baseline_error", blas.error);
    rep.print(json);
    return 0;
  }
  blas.set_num_threads(threads);
  const std::vector<float> q32 = to_f32(q), k32 = to_f32(k), v32 = to_f32(v);
  std::vector<float> o32(static_cast<size_t>(q_elems));
  const BaselineShape shape{batch, heads, kv_heads, seq, kv_seq, dim};
  const float scale = float(1.0 / std::sqrt(double(dim)));
  // The baseline is slow at long sequences: at most 3 timed runs, no warm-up
  // beyond the median discarding a cold first run.
  const int baseline_reps = std::min(reps, 3);
  std::vector<double> baseline_rep_ms;
  if (!backward) {
    for (int r = 0; r < baseline_reps; ++r)
      baseline_rep_ms.push_back(time_ms([&] {
        naive_attention(blas, shape, band, scale, threads, q32.data(), k32.data(), v32.data(), o32.data());
      }));
  } else {
    naive_attention(blas, shape, band, scale, threads, q32.data(), k32.data(), v32.data(), o32.data());
    const std::vector<float> do32 = to_f32(d_o);
    std::vector<float> dq32(o32.size()), dk32(k32.size()), dv32(k32.size());
    for (int r = 0; r < baseline_reps; ++r) {
      std::fill(dk32.begin(), dk32.end(), 0.0f);  // accumulated over each KV group
      std::fill(dv32.begin(), dv32.end(), 0.0f);
      baseline_rep_ms.push_back(time_ms([&] {
        naive_attention_backward(blas, shape, band, scale, threads, q32.data(), k32.data(), v32.data(),
                                 o32.data(), do32.data(), dq32.data(), dk32.data(), dv32.data());
      }));
    }
  }
  const double baseline_ms = median(baseline_rep_ms);
  rep.number("baseline_ms", baseline_ms);
  rep.number("baseline_gflops", flops / (baseline_ms * 1e-3) * 1e-9);
  rep.number("speedup_vs_baseline", baseline_ms / ms);
  rep.text("baseline_core", blas.core);
  rep.number("baseline_peak_rss_mb", peak_rss_mb());
  rep.integer("baseline_reps", baseline_reps);
  rep.print(json);
  return 0;
}

}  // namespace tileattn::cli
