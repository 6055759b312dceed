// `tileattn info`: what tileattn sees on this machine and what it picks.
#include <cstdio>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/openblas.hpp"
#include "cli/report.hpp"
#include "core/problem.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::cli {

namespace {

const char* const kHelp =
    "usage: tileattn info [--json]\n"
    "ISA path chosen, CPU features, cache sizes, threads, tile shapes per head_dim and dtype\n"
    "(with how each was chosen), per-thread scratch, the measured FP32 FMA peak\n"
    "(peak_gflops: all threads; peak_gflops_1thread), the rung bf16 inputs take (bf16_isa:\n"
    "amx, avx512bf16, or the FMA path of fp32), the measured vdpbf16ps peak\n"
    "(bf16_dot_peak_gflops, 0 without AVX512-BF16), the measured AMX-BF16 peak where the CPU\n"
    "and the OS give AMX (amx_bf16_usable; amx_bf16_peak_gflops, 0 otherwise) and the\n"
    "OpenBLAS core of the baseline.\n";

// Per-thread scratch of the forward main loop for one query head per work
// item (detail::forward_scratch_floats in src/core/scheduler.cpp).
int64_t scratch_bytes(int64_t head_dim, const TileShape& tiles) {
  ForwardArgs args;
  args.shape = {1, 1, 1, tiles.block_q, tiles.block_kv, head_dim};
  detail::Problem p = detail::describe(args);
  p.block_q = tiles.block_q;
  p.block_kv = tiles.block_kv;
  p.heads_per_item = 1;
  return detail::forward_scratch_floats(p) * 4;
}

std::string feature_list(const CpuFeatures& f) {
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vl, "avx512vl");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_vbmi, "avx512_vbmi");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_fp16, "avx512_fp16");
  add(f.amx_bf16, "amx_bf16");
  add(f.amx_int8, "amx_int8");
  return out;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  Args args(argc, argv, {{"--json", false}});
  if (args.has("--help")) return std::fputs(kHelp, stdout), 0;
  const bool json = args.has("--json");
  const Isa isa = resolve_isa(Isa::automatic);
  const CpuFeatures& f = cpu_features();
  const CacheSizes& caches = cache_sizes();
  const int threads = hardware_threads();

  Report r;
  r.text("isa", isa_name(isa));
  r.text("cpu_vendor", f.vendor);
  r.text("cpu_brand", f.brand);
  r.integer("cpu_family", f.family);
  r.integer("cpu_model", f.model);
  std::string features_json = "[";
  const std::string features = feature_list(f);
  for (std::size_t start = 0; start < features.size();) {
    std::size_t end = features.find(' ', start);
    if (end == std::string::npos) end = features.size();
    features_json += (start ? ", " : "") + json_quote(features.substr(start, end - start));
    start = end + 1;
  }
  r.raw("cpu_features", features_json + "]", features);
  std::string available_json = "[", available;
  for (Isa i : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    if (isa_available(i)) {
      available_json += std::string(available.empty() ? "" : ", ") + json_quote(isa_name(i));
      available += std::string(available.empty() ? "" : " ") + isa_name(i);
    }
  r.raw("isa_available", available_json + "]", available);
  r.integer("l1d_bytes", caches.l1d);
  r.integer("l2_bytes", caches.l2);
  r.integer("l3_bytes", caches.l3);
  r.text("cache_source", caches.source);
  r.integer("threads", threads);

  std::string tiles_json = "[", tiles_human;
  int64_t tuned_tiles = 0;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (int64_t d : {64, 80, 96, 128, 256}) {
      const TileShape t = choose_tiles(isa, d, dtype);
      const int64_t scratch = scratch_bytes(d, t);
      tiles_json += std::string(tiles_json.size() > 1 ? ", " : "") + "{\"head_dim\": " + std::to_string(d) +
                    ", \"dtype\": " + json_quote(dtype_name(dtype)) +
                    ", \"block_q\": " + std::to_string(t.block_q) +
                    ", \"block_kv\": " + std::to_string(t.block_kv) +
                    ", \"scratch_per_thread_bytes\": " + std::to_string(scratch) +
                    ", \"reason\": " + json_quote(t.reason) + "}";
      char line[160];
      std::snprintf(line, sizeof line, "\n  d=%-3lld %-4s %3dx%-3d scratch %6lld B  ", (long long)d,
                    dtype_name(dtype), t.block_q, t.block_kv, (long long)scratch);
      tiles_human += line + t.reason;
      tuned_tiles += t.reason.rfind("tune file", 0) == 0;
    }
  r.raw("tiles", tiles_json + "]", "(head_dim dtype block_q x block_kv)" + tiles_human);
  r.text("scratch_formula",
         "4 bytes x (2*BQ*Dp [q tile, accumulator] + 2*BQ [row max, row sum] + 2*BKVp*Dp "
         "[K^T, V tiles] + BQ*BKVp [scores] + 4*BKVp [row pointers]), Dp and BKVp = head_dim and "
         "block_kv rounded up to 16, each piece 64-byte aligned; the Q, accumulator and row pieces "
         "scale with the query heads per work item (1 in scratch_per_thread_bytes)");
  r.text("tune_file", tune_file_path());
  r.integer("tune_entries", int64_t(read_tune_file(tune_file_path()).size()));
  // `tileattn tune` writes this file and every later run reads it: say when
  // it changed the tiles above, and how to undo it.
  r.raw("tune_tiles_applied", std::to_string(tuned_tiles),
        tuned_tiles == 0 ? std::string("0")
                         : std::to_string(tuned_tiles) + " of the tiles above come from " + tune_file_path() +
                               " (written by `tileattn tune`; delete it, or point TILEATTN_TUNE_FILE elsewhere, "
                               "to undo)");

  const double peak = measure_fma_peak_gflops(threads, isa);
  const double peak1 = measure_fma_peak_gflops(1, isa);
  r.number("peak_gflops", peak);
  r.number("peak_gflops_1thread", peak1);
  r.text("peak_isa", isa_name(isa));
  r.text("bf16_isa", isa_name(bf16_isa()));
  const double dot = measure_bf16_dot_peak_gflops(threads);
  char dot_human[128];
  std::snprintf(dot_human, sizeof dot_human, "%.1f%s", dot,
                dot > 0 ? " (vdpbf16ps, bf16 pairs into fp32)" : " (no AVX512-BF16 rung)");
  r.raw("bf16_dot_peak_gflops", json_number(dot), dot_human);
  r.boolean("amx_bf16_usable", amx_bf16_usable());
  const double amx = measure_amx_bf16_peak_gflops(threads);
  char amx_human[128];
  std::snprintf(amx_human, sizeof amx_human, "%.1f%s", amx,
                amx > 0 ? " (bf16 tile multiply-adds)" : " (no usable AMX-BF16)");
  r.raw("amx_bf16_peak_gflops", json_number(amx), amx_human);

  const OpenBlas& blas = load_openblas();
  if (blas.loaded) {
    r.text("openblas_core", blas.core);
    r.null("openblas_error");
  } else {
    r.null("openblas_core");
    r.text("openblas_error", blas.error);
  }
  r.print(json);
  return 0;
}

}  // namespace tileattn::cli
