// `tileattn tune`: times every candidate tile shape per (head_dim, dtype) on
// this machine and writes the winners to the tune file that choose_tiles()
// reads (STYLE.md: cache-level tile sizes are data, found by measurement).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/report.hpp"
#include "cli/timing.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::cli {

namespace {

const char* const kHelp =
    "usage: tileattn tune [--dims 64,128] [--dtypes fp32] [--threads T] [--out PATH] [--json]\n"
    "Times block_q in {32,64,96,128,192,256} x block_kv in {32,64,128,256} for each head_dim\n"
    "(1..512, V's equal to Q/K's) and\n"
    "dtype (B=1, H=4, N=2048, no mask, median of 3 after a warm-up) on the automatic ISA path and\n"
    "writes the fastest to the tune file (default: TILEATTN_TUNE_FILE or\n"
    "~/.cache/tileattn/tune.conf), keeping its entries for other shapes.\n"
    "Every later run in this account (CLI, C, C++ and Python) reads that file and uses its tiles;\n"
    "`tileattn info` and `tileattn bench` name it when it applies. To undo: delete the file.\n";

constexpr int kBlockQ[] = {32, 64, 96, 128, 192, 256};
constexpr int kBlockKv[] = {32, 64, 128, 256};
constexpr int64_t kHeads = 4, kSeq = 2048;
constexpr int kReps = 3;

// mkdir -p of the directory part of `path`.
void make_parent_dirs(const std::string& path) {
  for (std::size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1))
    ::mkdir(path.substr(0, slash).c_str(), 0755);  // existing directories are fine
}

}  // namespace

int cmd_tune(int argc, char** argv) {
  Args args(argc, argv, {{"--dims", true}, {"--dtypes", true}, {"--threads", true}, {"--out", true}, {"--json", false}});
  if (args.has("--help")) return std::fputs(kHelp, stdout), 0;
  const bool json = args.has("--json");
  // A key listed twice would be timed twice and written as two entries.
  // Tuned calls have V's head dim equal to Q/K's (the entries apply to
  // such calls only), so V's limit bounds them.
  const std::vector<int64_t> dims = args.integer_list("--dims", {64, 128}, 1, kMaxValueHeadDim);
  for (std::size_t i = 0; i < dims.size(); ++i)
    if (std::find(dims.begin(), dims.begin() + i, dims[i]) != dims.begin() + i)
      throw UsageError("--dims: " + std::to_string(dims[i]) + " given twice");
  std::vector<DType> dtypes;
  for (const std::string& name : args.text_list("--dtypes", {"fp32"})) {
    const DType dtype = parse_dtype_flag("--dtypes", name);
    if (std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end())
      throw UsageError(std::string("--dtypes: ") + dtype_name(dtype) + " given twice");
    dtypes.push_back(dtype);
  }
  const int threads = int(args.integer("--threads", hardware_threads(), 1, 4096));
  const std::string out = args.text("--out", tune_file_path());
  // The common reasons the file cannot go there are said before minutes of
  // timing (a directory, a directory that cannot be made or written); others
  // (a full disk) only at the write.
  if (struct stat st; !out.empty() && (out.back() == '/' || (::stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))))
    throw UsageError("--out: '" + out + "' is a directory");
  {
    const std::size_t slash = out.rfind('/');
    const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : out.substr(0, slash);
    make_parent_dirs(out);
    struct stat dir;
    if (::stat(parent.c_str(), &dir) != 0 || !S_ISDIR(dir.st_mode))
      throw UsageError("--out: cannot create the directory '" + parent + "'");
    if (::access(parent.c_str(), W_OK) != 0)
      throw UsageError("--out: the directory '" + parent + "' is not writable");
  }
  const Isa isa = resolve_isa(Isa::automatic);

  std::vector<TuneEntry> winners;
  std::string results_json = "[";
  for (DType dtype : dtypes)
    for (int64_t dim : dims) {
      const int64_t elements = kHeads * kSeq * dim;
      const TypedBuffer q = random_buffer(dtype, elements, 1), k = random_buffer(dtype, elements, 2),
                        v = random_buffer(dtype, elements, 3);
      TypedBuffer o = zeros(dtype, elements);
      ForwardArgs fa;
      fa.shape = {1, kHeads, kHeads, kSeq, kSeq, dim};
      fa.dtype = dtype;
      fa.q = {q.data(), dense_strides(Layout::bhsd, 1, kHeads, kSeq, dim)};
      fa.k = {k.data(), fa.q.stride};
      fa.v = {v.data(), fa.q.stride};
      fa.o = {o.data(), fa.q.stride};
      fa.threads = threads;
      fa.isa = isa;
      const double flops = 4.0 * double(dim) * double(kSeq) * double(kSeq) * double(kHeads);
      TuneEntry best{isa_name(kernel_isa(isa, dtype)), dim, dtype_name(dtype), 0, 0};
      double best_ms = 0;
      for (int bq : kBlockQ)
        for (int bkv : kBlockKv) {
          fa.block_q = bq;
          fa.block_kv = bkv;
          attention_forward(fa);  // warm-up
          std::vector<double> reps;
          for (int r = 0; r < kReps; ++r) reps.push_back(time_ms([&] { attention_forward(fa); }));
          const double ms = median(reps);
          const double gflops = flops / (ms * 1e-3) * 1e-9;
          if (best.block_q == 0 || ms < best_ms) {
            best.block_q = bq;
            best.block_kv = bkv;
            best_ms = ms;
          }
          if (json) {
            results_json += std::string(results_json.size() > 1 ? ", " : "") + "{\"head_dim\": " +
                            std::to_string(dim) + ", \"dtype\": " + json_quote(dtype_name(dtype)) +
                            ", \"block_q\": " + std::to_string(bq) + ", \"block_kv\": " + std::to_string(bkv) +
                            ", \"ms\": " + json_number(ms) + ", \"gflops\": " + json_number(gflops) + "}";
          } else {
            std::printf("d=%-3lld %-4s %3dx%-3d %9.3f ms %8.2f GFLOP/s\n", (long long)dim, dtype_name(dtype), bq,
                        bkv, ms, gflops);
            std::fflush(stdout);
          }
        }
      winners.push_back(best);
      if (!json)
        std::printf("best d=%lld %s: %dx%d (%.3f ms)\n", (long long)dim, dtype_name(dtype), best.block_q,
                    best.block_kv, best_ms);
    }

  // Keep the file's entries for other (isa, head_dim, dtype) keys.
  std::vector<TuneEntry> entries = winners;
  for (const TuneEntry& old : read_tune_file(out)) {
    bool replaced = false;
    for (const TuneEntry& w : winners)
      replaced |= old.isa == w.isa && old.head_dim == w.head_dim && old.dtype == w.dtype;
    if (!replaced) entries.push_back(old);
  }
  write_tune_file(out, entries);

  if (json) {
    Report r;
    r.text("isa", isa_name(isa));
    r.integer("threads", threads);
    r.integer("heads", kHeads);
    r.integer("seq", kSeq);
    r.text("out", out);
    r.raw("results", results_json + "]", "");
    std::string winners_json = "[";
    for (const TuneEntry& w : winners)
      winners_json += std::string(winners_json.size() > 1 ? ", " : "") + "{\"isa\": " + json_quote(w.isa) +
                      ", \"head_dim\": " + std::to_string(w.head_dim) +
                      ", \"dtype\": " + json_quote(w.dtype) + ", \"block_q\": " + std::to_string(w.block_q) +
                      ", \"block_kv\": " + std::to_string(w.block_kv) + "}";
    r.raw("winners", winners_json + "]", "");
    r.print(true);
  } else {
    std::printf("wrote %zu entries to %s\n", entries.size(), out.c_str());
  }
  return 0;
}

}  // namespace tileattn::cli
