// What tileattn knows about the machine: ISA features, caches, threads, and
// the tile shapes it picks from them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileattn/types.hpp"

namespace tileattn {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false;
  // AVX512-VBMI (byte permutes): the avx512bf16 rung's decode dot scores
  // use it (fp8 keys become bf16 by table lookups).
  bool avx512_vbmi = false;
  // AMX-TILE and AMX-BF16 with the tile state enabled by the OS (XCR0 bits
  // 17-18): the amx rung's bf16 products (Isa::amx).
  bool amx_bf16 = false;
  // AMX-INT8 with the tile state enabled: reported only (no kernel takes
  // it; int8 decode scores on tdpbssd lost to the FMA ones, docs/inference.md).
  bool amx_int8 = false;
  std::string vendor, brand;
  // CPUID leaf 1's display family and model (base + extended fields):
  // AMD Zen 3 / Zen 4 are family 0x19, Zen 5 0x1A. Tuning choices that
  // were measured per CPU generation key on these (docs/inference.md).
  int family = 0, model = 0;
};

struct CacheSizes {
  int64_t l1d = 32 * 1024;   // per core, bytes
  int64_t l2 = 512 * 1024;   // per core, bytes
  int64_t l3 = 8 * 1024 * 1024;  // total, bytes
  std::string source;        // where the numbers came from ("sysfs", "default")
};

const CpuFeatures& cpu_features();
const CacheSizes& cache_sizes();
int hardware_threads();

// Whose threads run tileattn's parallel regions: its own pool (the default),
// or another threading runtime's, so that an application whose runtime keeps
// its threads polling between its own operations (OpenMP's default: PyTorch's
// libgomp threads poll 6-8 ms after each region, Intel Xeon model 207) does
// not have tileattn's threads share cores with them. run(fn, ctx, threads)
// must call fn(ctx, t, n) once on each of n <= threads threads, t = 0 ..
// n - 1 (the calling thread should be t = 0; n may be 1), and return when
// every call has returned; fn does not throw. Over OpenMP:
//   void run(void (*fn)(void*, int, int), void* ctx, int threads) {
//   #pragma omp parallel num_threads(threads)
//     fn(ctx, omp_get_thread_num(), omp_get_num_threads());
//   }
// The Python package installs one over the OpenMP runtime PyTorch loaded
// (docs/python.md, "Threads").
struct ThreadRuntime {
  const char* name;  // what thread_runtime() reports
  void (*run)(void (*fn)(void* ctx, int thread, int threads), void* ctx, int threads);
};
// Every later call's parallel regions run on `runtime` (nullptr: the pool
// again). Calls already running keep the runtime they started with, so it
// must stay valid until every call started while it was installed has
// returned (a static object is simplest). Throws Error for a null name or
// run (and changes nothing).
void set_thread_runtime(const ThreadRuntime* runtime);
// "pool", or the installed runtime's name.
const char* thread_runtime();

// True when this build has the path and the CPU (with OS support) can run it.
bool isa_available(Isa isa);
// The best available path: avx512 > avx2 > generic.
Isa best_isa();
// What Isa::automatic resolves to: TILEATTN_ISA if set, else best_isa(); any
// other value is checked. Throws NotSupported for a path this CPU lacks (also
// named by TILEATTN_ISA), Error for a name or value that is no path.
Isa resolve_isa(Isa requested);

// Tile shape of the forward main loop.
struct TileShape {
  int block_q = 64;    // query rows per tile
  int block_kv = 64;   // keys per tile
  std::string reason;  // how it was chosen (env, tune file, cache model)
};

// The tile shape for head_dim/dtype/ISA: TILEATTN_TILES ("64x128") wins, then
// the tune file (TILEATTN_TUNE_FILE or ~/.cache/tileattn/tune.conf), then a
// cache model: the per-thread working set stays within L2, the K/V tiles
// within half of it. `v_head_dim` is V's head dim (0: head_dim); the tune
// file's entries are measured with V's head dim equal to Q/K's and apply
// only to such calls, others take the cache model. Throws Error for a
// head_dim outside 1..kMaxHeadDim.
TileShape choose_tiles(Isa isa, int64_t head_dim, DType dtype, int64_t v_head_dim = 0);
// The tiles attention_forward(args) runs with: choose_tiles' for its path,
// head_dim and dtype, with the per-call adjustments (128-key tiles for bf16
// products without a band, the query tile cut to short query sequences,
// decode's key tiles), the reason saying which applied. Validates args.
struct ForwardArgs;
TileShape forward_tiles(const ForwardArgs& args);
// The tiles attention_backward(args) runs its (query tile, key tile) pairs
// with: args.forward's block_q / block_kv where set, else the backward's
// cache model (64x128 where L2 has 2 MiB or more, else 64x64, smaller when
// the working set exceeds 3/4 of L2; docs/training.md); the reason says
// which. Validates args.
struct BackwardArgs;
TileShape backward_tiles(const BackwardArgs& args);
// Path of the tune file read by choose_tiles (may not exist).
std::string tune_file_path();
// Entries of the tune file, for `tileattn info`.
struct TuneEntry {
  std::string isa;
  int64_t head_dim = 0;
  std::string dtype;
  int block_q = 0, block_kv = 0;
};
std::vector<TuneEntry> read_tune_file(const std::string& path);
void write_tune_file(const std::string& path, const std::vector<TuneEntry>& entries);

// Measured FP32 multiply-add throughput in GFLOP/s (2 flops per lane per FMA)
// of `threads` threads (0: every hardware thread) running a register-only FMA
// loop of `isa` (automatic: the best available) for about `seconds` each; the
// best of `reps` runs. The yardstick for `fraction_of_peak`.
double measure_fma_peak_gflops(int threads = 0, Isa isa = Isa::automatic, double seconds = 0.2,
                               int reps = 3);

// Measured AMX-BF16 tile multiply-add throughput in GFLOP/s (bf16 inputs,
// fp32 accumulation, 2 flops per multiply-add), the same way; 0 where the
// CPU, the OS (Linux grants the tile state per process on request) or the
// build gives no AMX. The yardstick of the amx rung's bf16 forward.
double measure_amx_bf16_peak_gflops(int threads = 0, double seconds = 0.2, int reps = 3);
// Measured AVX512-BF16 dot-product throughput (vdpbf16ps: bf16 pairs, fp32
// sums, 2 flops per multiply-add) in GFLOP/s, the same way; 0 where the CPU
// or the build has no avx512bf16 rung. The yardstick of the avx512bf16
// rung's bf16 forward.
double measure_bf16_dot_peak_gflops(int threads = 0, double seconds = 0.2, int reps = 3);
// The code that runs a forward of `dtype` inputs on `isa`: the bf16 rungs
// (amx, avx512bf16) run fp32 and fp16 inputs on the avx512 code, so tune
// file entries and tile choices for those are avx512's.
Isa kernel_isa(Isa isa, DType dtype);
// The rung bf16 inputs take under Isa::automatic (TILEATTN_ISA included):
// amx, avx512bf16, or the FP32-FMA path they share with fp32 inputs.
Isa bf16_isa();
// cpu_features().amx_bf16, and Linux granted this process the tile data
// state (asked once, on the first call; a process whose threads have signal
// stacks too small for the tile state, as under some sanitizers, is refused).
bool amx_bf16_usable();

}  // namespace tileattn
