// `tileattn bench`: times attention_forward (a warm-up run, then the median of
// --reps runs) and a naive OpenBLAS attention on the same inputs, and reports
// both as ratios: to the FMA peak measured in the same run, and to each other.
// --impl times only one of the two (a sweep runs each in its own process so
// that each one's peak memory is its own); --decode times one new query token
// against a KV cache; --sweep runs a grid of cases (sweep.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/memory_check.hpp"
#include "cli/naive_baseline.hpp"
#include "cli/openblas.hpp"
#include "cli/report.hpp"
#include "cli/sweep.hpp"
#include "cli/timing.hpp"
#include "core/band.hpp"
#include "core/problem.hpp"
#include "core/thread_pool.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/machine.hpp"


namespace tileattn::cli {

namespace {

const char* const kHelp =
    "usage: tileattn bench [--batch B] [--heads H] [--kv-heads HKV] [--seq N] [--kv-seq M]\n"
    "                      [--dim D] [--dim-v DV] [--dtype fp32|fp16|bf16] [--causal] [--window L,R]\n"
    "                      [--softcap C] [--alibi] [--sinks S.npy] [--bf16-probabilities]\n"
    "                      [--threads T] [--reps R] [--backward | --decode] [--no-baseline]\n"
    "                      [--impl both|tileattn|openblas] [--peak-gflops G] [--bf16-peak-gflops G]\n"
    "                      [--json]\n"
    "       tileattn bench --sweep [--seqs N,..] [--dims D,..] [--masks none,causal,window]\n"
    "                      [--dtypes fp32,..] [--passes forward,backward,decode]\n"
    "                      [--impls tileattn,openblas] [--max-naive-mb MB] [--out FILE.json|.csv]\n"
    "                      [--batch B] [--heads H] [--kv-heads HKV] [--window L,R] [--threads T]\n"
    "                      [--reps R] [--peak-gflops G] [--json]\n"
    "Defaults: B=1 H=8 HKV=H N=M=1024 D=128 DV=D fp32, every hardware thread, R=5.\n"
    "D (Q/K's head dim) is 1..576, DV (V's and O's) 1..512 (MLA: 192/128, 576/512).\n"
    "Reports ms (median of R after a warm-up), gflops (2*(D+DV) flops per visible (query, key)\n"
    "pair: 4*D when DV = D), fraction_of_peak (of the FMA peak measured now with the same threads;\n"
    "bf16 inputs on the amx / avx512bf16 rungs also give bf16_peak_gflops and\n"
    "fraction_of_bf16_peak, of the AMX or vdpbf16ps peak, except --decode with at most 8\n"
    "query heads per KV head, which takes the few-rows products, not the packed ones),\n"
    "peak_rss_mb (before the baseline runs), and for the naive OpenBLAS baseline (S = Q K^T\n"
    "materialized, softmax, P V; fp32) baseline_ms and speedup_vs_baseline.\n"
    "--backward times attention_backward instead (6*D+4*DV flops per visible pair; the baseline\n"
    "is the same sgemm formulation of dQ, dK, dV).\n"
    "--decode times one new query token per (batch, head) against a KV cache holding M keys\n"
    "(attention_with_kvcache; the baseline is the naive attention of that one row); --kv-seq\n"
    "sets M (default 1024) and --seq is refused. block_q, block_kv and tile_reason are the step's.\n"
    "--impl tileattn (same as --no-baseline) or openblas times only that one.\n"
    "--peak-gflops uses G as the FMA peak instead of measuring it (a sweep measures once);\n"
    "--bf16-peak-gflops G likewise for the AMX / vdpbf16ps peak of bf16 inputs.\n"
    "--softcap C caps the scores (C * tanh(x / C)) and --alibi adds the ALiBi bias (standard\n"
    "slopes) in tileattn; the baseline has neither. --sinks S.npy (float32 [H]) adds attention\n"
    "sinks in tileattn (the backward also computes their gradient); the baseline has none.\n"
    "--bf16-probabilities (--dtype bf16) rounds P (and the backward's dS) to bf16 for their\n"
    "products on the amx / avx512bf16 rungs (ForwardArgs::bf16_probabilities: faster, within a\n"
    "stated bound instead of the accuracy rule); with --decode, where the step's products do\n"
    "(KvCacheArgs::bf16_probabilities: the packed ones, and on avx512bf16 with VBMI the\n"
    "few-rows ones).\n"
    "\n"
    "--sweep runs every combination of the listed values, each (implementation, case) in a\n"
    "fresh process so that peak_rss_mb is that case's own, and writes one row per\n"
    "(implementation, case) to --out (JSON or CSV by extension; columns in docs/benchmarks.md).\n"
    "Sweep head dims are 1..512 (each case's V has Q/K's head dim); --softcap, --alibi, --sinks,\n"
    "--bf16-probabilities, --dim-v and --bf16-peak-gflops are one-case options, refused with --sweep.\n"
    "Sweep defaults: seqs 512,1024,2048,4096,8192,16384, dims 64,128, masks none,causal,window,\n"
    "dtypes fp32, passes forward, impls tileattn,openblas, H=4, window 256,0, R adaptive\n"
    "(fewer at large N), naive baseline skipped where its N x N matrices exceed 4096 MB.\n"
    "A progress bar (stage, case i/n, elapsed, time left) is drawn on stderr when it is a\n"
    "terminal and --json is not given; --json prints the result document on stdout.\n";

constexpr int64_t kMaxSize = int64_t{1} << 31;

enum class Impl { both, tileattn, openblas };

Impl parse_impl(const Args& args) {
  const std::string text = args.text("--impl", "both");
  Impl impl;
  if (text == "both") impl = Impl::both;
  else if (text == "tileattn") impl = Impl::tileattn;
  else if (text == "openblas") impl = Impl::openblas;
  else throw UsageError("--impl: expected both, tileattn or openblas, got '" + text + "'");
  if (args.has("--no-baseline")) {
    if (impl == Impl::openblas) throw UsageError("--no-baseline: contradicts --impl openblas");
    impl = Impl::tileattn;
  }
  return impl;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args args(argc, argv,
            {{"--batch", true}, {"--heads", true}, {"--kv-heads", true}, {"--seq", true},
             {"--kv-seq", true}, {"--dim", true}, {"--dtype", true}, {"--causal", false},
             {"--window", true}, {"--softcap", true}, {"--alibi", false}, {"--sinks", true},
             {"--bf16-probabilities", false}, {"--threads", true}, {"--reps", true}, {"--backward", false},
             {"--decode", false}, {"--no-baseline", false}, {"--impl", true}, {"--peak-gflops", true},
             {"--bf16-peak-gflops", true}, {"--json", false}, {"--sweep", false}, {"--seqs", true}, {"--dims", true}, {"--masks", true},
             {"--dtypes", true}, {"--passes", true}, {"--impls", true}, {"--max-naive-mb", true},
             {"--out", true}, {"--dim-v", true}});
  if (args.has("--help")) return std::fputs(kHelp, stdout), 0;
  if (args.has("--sweep")) return run_sweep(parse_sweep_plan(args), argc, argv);
  for (const char* flag : {"--seqs", "--dims", "--masks", "--dtypes", "--passes", "--impls", "--max-naive-mb", "--out"})
    if (args.has(flag)) throw UsageError(std::string(flag) + ": only with --sweep");
  const bool json = args.has("--json");
  const Impl impl = parse_impl(args);
  const bool backward = args.has("--backward");
  const bool decode = args.has("--decode");
  if (backward && decode) throw UsageError("--decode: cannot be combined with --backward");
  if (decode && args.has("--seq"))
    throw UsageError("--seq: not with --decode (a decode step has one query token; --kv-seq sets the cached keys)");
  const bool bf16_probabilities = args.has("--bf16-probabilities");
  const int64_t batch = args.integer("--batch", 1, 1, kMaxSize);
  const int64_t heads = args.integer("--heads", 8, 1, kMaxSize);
  const int64_t kv_heads = args.integer("--kv-heads", heads, 1, kMaxSize);
  // Decode: one new query token per sequence, attending to a cache of kv_seq keys.
  const int64_t seq = decode ? 1 : args.integer("--seq", 1024, 1, kMaxSize);
  const int64_t kv_seq = args.integer("--kv-seq", decode ? 1024 : seq, 1, kMaxSize);
  const int64_t dim = args.integer("--dim", 128, 1, kMaxHeadDim);
  const int64_t dim_v = args.integer("--dim-v", dim, 1, kMaxValueHeadDim);
  if (dim_v > kMaxValueHeadDim)
    throw UsageError("--dim-v: V's head dim defaults to --dim (" + std::to_string(dim) + ") and must be in 1.." +
                     std::to_string(kMaxValueHeadDim) + "; give --dim-v");
  const DType dtype = args.dtype("--dtype", "fp32");
  if (bf16_probabilities && dtype != DType::bf16) throw UsageError("--bf16-probabilities: only with --dtype bf16");
  const bool causal = args.has("--causal");
  const auto [window_left, window_right] = args.window("--window");
  const float softcap = args.fp32_number("--softcap", 0.0, 0.0, 1e30);
  const int threads = int(args.integer("--threads", hardware_threads(), 1, 4096));
  const int reps = int(args.integer("--reps", 5, 1, 1000));
  const double given_peak = args.number("--peak-gflops", 0, 1e-3, 1e9);
  const double given_bf16_peak = args.number("--bf16-peak-gflops", 0, 1e-3, 1e9);
  if (heads % kv_heads != 0)
    throw UsageError("--kv-heads: " + std::to_string(kv_heads) + " must divide --heads " + std::to_string(heads));
  int64_t q_elems = 0, k_elems = 0, v_elems = 0, o_elems = 0;
  if (__builtin_mul_overflow(batch * heads, seq * dim, &q_elems) ||
      __builtin_mul_overflow(batch * kv_heads, kv_seq * dim, &k_elems) ||
      __builtin_mul_overflow(batch * kv_heads, kv_seq * dim_v, &v_elems) ||
      __builtin_mul_overflow(batch * heads, seq * dim_v, &o_elems))
    throw UsageError("bench: shape is too large");
  // The buffers this run allocates (q, k, v, o; with --backward dO, dQ, dK,
  // dV and the LSE too) must fit in the machine's memory: a shape beyond it
  // is a usage error naming the flags, before anything is allocated.
  const double esize = double(dtype_size(dtype));
  double buffer_bytes = double(q_elems + k_elems + v_elems + o_elems) * esize;
  if (backward) buffer_bytes += double(q_elems + k_elems + v_elems + o_elems) * esize + double(batch * heads * seq) * 4;
  char flags[200];
  std::snprintf(flags, sizeof flags, "bench: --batch %lld --heads %lld --kv-heads %lld %s %lld --dim %lld",
                static_cast<long long>(batch), static_cast<long long>(heads), static_cast<long long>(kv_heads),
                decode ? "--kv-seq" : "--seq", static_cast<long long>(decode ? kv_seq : seq),
                static_cast<long long>(dim));
  require_memory(buffer_bytes, flags);

  // Only q, k, v and o are allocated for our kernel (the memory target).
  const TypedBuffer q = random_buffer(dtype, q_elems, 1);
  const TypedBuffer k = random_buffer(dtype, k_elems, 2);
  const TypedBuffer v = random_buffer(dtype, v_elems, 3);
  TypedBuffer o = zeros(dtype, o_elems);
  ForwardArgs fa;
  fa.shape = {batch, heads, kv_heads, seq, kv_seq, dim, dim_v};
  fa.dtype = dtype;
  fa.q = {q.data(), dense_strides(Layout::bhsd, batch, heads, seq, dim)};
  fa.k = {k.data(), dense_strides(Layout::bhsd, batch, kv_heads, kv_seq, dim)};
  fa.v = {v.data(), dense_strides(Layout::bhsd, batch, kv_heads, kv_seq, dim_v)};
  fa.o = {o.data(), dense_strides(Layout::bhsd, batch, heads, seq, dim_v)};
  fa.mask.causal = causal;
  fa.mask.window_left = window_left;
  fa.mask.window_right = window_right;
  fa.softcap = softcap;
  fa.bf16_probabilities = bf16_probabilities;
  const std::vector<float> alibi = args.has("--alibi") ? standard_alibi_slopes(heads) : std::vector<float>{};
  if (!alibi.empty()) fa.alibi_slopes = alibi.data();
  const std::vector<float> sinks =
      args.has("--sinks") ? load_sinks(args.text("--sinks"), heads) : std::vector<float>{};
  if (!sinks.empty()) fa.sinks = sinks.data();
  fa.threads = threads;
  validate(fa);
  // The backward also needs the forward's LSE, dO and the three gradients.
  std::vector<float> lse;
  TypedBuffer d_o, dq, dk, dv;
  std::vector<float> d_sinks(sinks.size());
  BackwardArgs ba;
  if (backward) {
    lse.assign(size_t(batch * heads * seq), 0.0f);
    fa.lse = lse.data();
    fa.lse_stride = {heads * seq, seq, 1};
    d_o = random_buffer(dtype, o_elems, 4);
    dq = zeros(dtype, q_elems);
    dk = zeros(dtype, k_elems);
    dv = zeros(dtype, v_elems);
    ba.forward = fa;
    ba.o = {o.data(), fa.o.stride};
    ba.d_o = {d_o.data(), fa.o.stride};
    ba.lse = lse.data();
    ba.lse_stride = fa.lse_stride;
    ba.dq = {dq.data(), fa.q.stride};
    ba.dk = {dk.data(), fa.k.stride};
    ba.dv = {dv.data(), fa.v.stride};
    if (!sinks.empty()) ba.d_sinks = d_sinks.data();
  }
  // Decode: k and v are a full contiguous cache [B, HKV, M, D]; nothing is
  // appended, so every rep attends the same cache.
  KvCacheArgs ca;
  std::vector<int32_t> cache_seqlens;
  if (decode) {
    if (kv_seq > INT32_MAX) throw UsageError("--kv-seq: a KV cache holds at most 2^31-1 tokens");
    cache_seqlens.assign(size_t(batch), int32_t(kv_seq));
    ca.batch = batch;
    ca.heads = heads;
    ca.kv_heads = kv_heads;
    ca.head_dim = dim;
    ca.v_head_dim = dim_v;
    ca.dtype = dtype;
    ca.seqlen_q = 1;
    ca.q = fa.q;
    ca.o = fa.o;
    ca.k_cache = {const_cast<void*>(k.data()), fa.k.stride};
    ca.v_cache = {const_cast<void*>(v.data()), fa.v.stride};
    ca.capacity = kv_seq;
    ca.cache_seqlens = cache_seqlens.data();
    ca.causal = causal;
    ca.window_left = window_left;
    ca.window_right = window_right;
    ca.softcap = softcap;
    ca.alibi_slopes = fa.alibi_slopes;
    ca.sinks = fa.sinks;
    ca.threads = threads;
    ca.bf16_probabilities = bf16_probabilities;
  }

  const detail::Band band = detail::make_band(causal, window_left, window_right);
  // Q K^T and P V: 2 D + 2 DV per pair (4 D when DV = D). The backward's five
  // products: S = Q K^T, dQ, dK (2 D each), dP = dO V^T and dV (2 DV each): 10 D when DV = D.
  const double flops_per_pair = backward ? 6.0 * double(dim) + 4.0 * double(dim_v) : 2.0 * double(dim + dim_v);
  const double flops = flops_per_pair * double(detail::band_pairs(band, seq, kv_seq)) * double(batch * heads);
  const Isa isa = resolve_isa(Isa::automatic);
  // The tiles the timed call plans: the decode step's (one query row, its key
  // tile) for --decode, the backward's own for --backward.
  const TileShape tiles = decode     ? forward_tiles(kvcache_forward_args(ca, cache_seqlens.data()))
                          : backward ? backward_tiles(ba)
                                     : forward_tiles(fa);
  // The peak is measured right before and right after the timed work, and the
  // larger taken: a neighbour that loads the machine during one of them
  // otherwise gives a fraction of peak above 1.
  const double peak_before = given_peak > 0 ? given_peak : measure_fma_peak_gflops(threads, isa);
  double peak = peak_before;
  auto measure_peak_after = [&] {
    if (given_peak > 0) return;
    peak = std::max(peak_before, measure_fma_peak_gflops(threads, isa));
  };

  Report rep;
  rep.integer("batch", batch);
  rep.integer("heads", heads);
  rep.integer("kv_heads", kv_heads);
  rep.integer("seq", seq);
  rep.integer("kv_seq", kv_seq);
  rep.integer("dim", dim);
  rep.integer("dim_v", dim_v);
  rep.text("dtype", dtype_name(dtype));
  rep.boolean("causal", causal);
  rep.integer("window_left", window_left);
  rep.integer("window_right", window_right);
  rep.number("softcap", softcap);
  rep.boolean("alibi", !alibi.empty());
  rep.boolean("sinks", !sinks.empty());
  rep.boolean("bf16_probabilities", bf16_probabilities);
  rep.boolean("backward", backward);
  rep.boolean("decode", decode);
  rep.text("impl", impl == Impl::both ? "both" : impl == Impl::tileattn ? "tileattn" : "openblas");
  rep.text("isa", isa_name(isa));
  rep.integer("threads", threads);

  double ms = NAN;
  if (impl == Impl::openblas) {  // the kernel is not timed: its fields are null
    for (const char* key : {"block_q", "block_kv", "tile_reason", "tune_file", "reps", "rep_ms"}) rep.null(key);
    rep.number("flops", flops);
    rep.null("ms");
    rep.null("gflops");
    rep.number("peak_gflops", peak);
    for (const char* key : {"fraction_of_peak", "bf16_peak_gflops", "fraction_of_bf16_peak", "peak_rss_mb"})
      rep.null(key);
  } else {
    auto run_kernel = [&] {
      if (decode) attention_with_kvcache(ca);
      else if (backward) attention_backward(ba);
      else attention_forward(fa);
    };
    // Warm-up: page in the buffers, start the thread pool (and O, LSE for the backward).
    if (backward) attention_forward(fa);
    run_kernel();
    std::vector<double> rep_ms;
    for (int r = 0; r < reps; ++r) rep_ms.push_back(time_ms(run_kernel));
    ms = median(rep_ms);
    measure_peak_after();
    const double gflops = flops / (ms * 1e-3) * 1e-9;
    rep.integer("block_q", tiles.block_q);
    rep.integer("block_kv", tiles.block_kv);
    rep.text("tile_reason", tiles.reason);
    // Tiles from `tileattn tune`'s file change every later run: name the file.
    if (tiles.reason.rfind("tune file", 0) == 0)
      rep.raw("tune_file", json_quote(tune_file_path()),
              tune_file_path() + " (written by `tileattn tune`; delete it to undo)");
    else
      rep.null("tune_file");
    rep.integer("reps", reps);
    std::string reps_human;
    for (double t : rep_ms) {
      if (!reps_human.empty()) reps_human += ' ';
      reps_human += json_number(t);
    }
    rep.raw("rep_ms", json_number_array(rep_ms), reps_human);
    rep.number("flops", flops);
    rep.number("ms", ms);
    rep.number("gflops", gflops);
    rep.number("peak_gflops", peak);
    rep.number("fraction_of_peak", gflops / peak);
    // bf16 inputs on a bf16 rung multiply on the matrix hardware (forward,
    // backward, and a decode step that stacks more query rows of a KV group
    // than the few-rows FMA products take: MLA's 128): the yardstick of that
    // unit too. A rate above the peak of the unit that did the products is
    // impossible and warned about; bf16 products may well pass the FMA peak.
    const bool packed_products = !decode || heads / kv_heads > detail::kFewRowsMax;
    if (packed_products && detail::tile_product(isa, dtype) == detail::TileProduct::bf16_dot) {
      const double unit_peak = given_bf16_peak > 0 ? given_bf16_peak
                               : isa == Isa::amx   ? measure_amx_bf16_peak_gflops(threads)
                                                   : measure_bf16_dot_peak_gflops(threads);
      rep.number("bf16_peak_gflops", unit_peak);
      rep.number("fraction_of_bf16_peak", gflops / unit_peak);
      if (gflops > unit_peak)
        std::fprintf(stderr,
                     "tileattn: warning: %.1f GFLOP/s is above the bf16 peak %.1f GFLOP/s (%s): "
                     "fraction_of_bf16_peak is not meaningful\n",
                     gflops, unit_peak,
                     given_bf16_peak > 0 ? "given by --bf16-peak-gflops" : "the machine's load changed while measuring");
    } else {
      rep.null("bf16_peak_gflops");
      rep.null("fraction_of_bf16_peak");
      if (gflops > peak && given_peak > 0)
        std::fprintf(stderr,
                     "tileattn: warning: %.1f GFLOP/s is above the peak %.1f GFLOP/s given by --peak-gflops: "
                     "fraction_of_peak is not meaningful\n",
                     gflops, peak);
      else if (gflops > peak)
        std::fprintf(stderr,
                     "tileattn: warning: %.1f GFLOP/s is above the peak %.1f GFLOP/s (%.1f before the run): "
                     "the machine's load changed while measuring; fraction_of_peak is not meaningful\n",
                     gflops, peak, peak_before);
    }
    rep.number("peak_rss_mb", peak_rss_mb());
  }

  // Without the baseline (not asked for, or OpenBLAS missing) its fields are
  // null, so that a script reads the same keys from every run.
  auto print_without_baseline = [&](const std::string& error) {
    for (const char* key : {"baseline_ms", "baseline_gflops", "speedup_vs_baseline", "baseline_core",
                            "baseline_peak_rss_mb", "baseline_reps"})
      rep.null(key);
    if (error.empty()) rep.null("baseline_error");
    else rep.text("baseline_error", error);
    rep.boolean("baseline", false);
    rep.print(json);
    return 0;
  };
  if (impl == Impl::tileattn) return print_without_baseline("");
  const OpenBlas& blas = load_openblas();
  if (!blas.loaded) return print_without_baseline(blas.error);
  blas.set_num_threads(threads);
  const std::vector<float> q32 = to_f32(q), k32 = to_f32(k), v32 = to_f32(v);
  std::vector<float> o32(static_cast<size_t>(o_elems));
  const BaselineShape shape{batch, heads, kv_heads, seq, kv_seq, dim, dim_v};
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
    std::vector<float> dq32(q32.size()), dk32(k32.size()), dv32(v32.size());
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
  if (impl == Impl::both) rep.number("speedup_vs_baseline", baseline_ms / ms);
  else rep.null("speedup_vs_baseline");
  rep.text("baseline_core", blas.core);
  rep.number("baseline_peak_rss_mb", peak_rss_mb());
  rep.integer("baseline_reps", baseline_reps);
  rep.null("baseline_error");
  rep.boolean("baseline", true);
  rep.print(json);
  return 0;
}

}  // namespace tileattn::cli
