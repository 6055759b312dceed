// OpenBLAS, loaded at run time for the naive baseline of `tileattn bench`.
//
// OpenBLAS 0.3.21 picks its kernels (the "core") from OPENBLAS_CORETYPE when
// the library is loaded and does not know recent CPUs, so we set the variable
// ourselves and only then dlopen the library; it is never linked at build time
// (a build-time link would load it, and fix the core, before main runs).
#pragma once

#include <string>

namespace tileattn::cli {

struct OpenBlas {
  // cblas_sgemm with CBLAS_ORDER / CBLAS_TRANSPOSE passed as their int values.
  using Sgemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc);
  static constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

  bool loaded = false;
  std::string error;          // why it is not loaded
  std::string core;           // openblas_get_corename()
  std::string requested_core; // what OPENBLAS_CORETYPE was set to ("" = auto-detect)
  Sgemm sgemm = nullptr;
  void (*set_num_threads)(int) = nullptr;
};

// Loads libopenblas.so.0 once per process (later calls return the same).
const OpenBlas& load_openblas();

}  // namespace tileattn::cli
