#include "cli/openblas.hpp"

#include <dlfcn.h>

#include <cstdlib>

#include "tileattn/machine.hpp"

namespace tileattn::cli {

namespace {

// The fastest correct core for this CPU. A user's own OPENBLAS_CORETYPE wins.
// SkylakeX needs AVX-512 F/BW/DQ/VL (it dies with SIGILL without them). For
// AVX2+FMA, Haswell and Zen kernels were measured on the project machine (AMD
// EPYC Zen3, 2 threads, OpenBLAS 0.3.21, the baseline's N=4096 D=128 sgemms):
// Haswell 43.5 vs Zen 43.3 GFLOP/s averaged over 5 alternating runs -- equal
// within noise -- so Haswell, which is also correct on every AVX2+FMA CPU.
std::string choose_core() {
  if (const char* env = std::getenv("OPENBLAS_CORETYPE"); env && *env) return env;
  const CpuFeatures& f = cpu_features();
  if (f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl) return "SkylakeX";
  if (f.avx2 && f.fma) return "Haswell";
  return "";  // let OpenBLAS detect
}

OpenBlas load() {
  OpenBlas blas;
  blas.requested_core = choose_core();
  if (!blas.requested_core.empty()) setenv("OPENBLAS_CORETYPE", blas.requested_core.c_str(), 1);
  void* handle = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    blas.error = std::string("cannot load libopenblas.so.0: ") + (why ? why : "unknown error");
    return blas;
  }
  blas.sgemm = reinterpret_cast<OpenBlas::Sgemm>(dlsym(handle, "cblas_sgemm"));
  blas.set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(handle, "openblas_set_num_threads"));
  auto corename = reinterpret_cast<char* (*)()>(dlsym(handle, "openblas_get_corename"));
  if (!blas.sgemm || !blas.set_num_threads) {
    blas.error = "libopenblas.so.0 lacks cblas_sgemm or openblas_set_num_threads";
    return blas;
  }
  blas.core = corename ? corename() : "unknown";
  blas.loaded = true;
  return blas;
}

}  // namespace

const OpenBlas& load_openblas() {
  static const OpenBlas blas = load();
  return blas;
}

}  // namespace tileattn::cli
