// Entry points of few_rows_vbmi.cpp: the AVX-512 FMA few-rows products of an
// fp8 e4m3 cache with the elements converted on AVX512-VBMI byte permutes
// (e4m3_permutes.hpp), the contracts of few_rows16::scores and accumulate
// for m = 1..8 rows. Called only where CPUID has VBMI (Ice Lake, Sapphire
// Rapids and later, Zen 4 and later; not Skylake, Cascade Lake or Cooper Lake).
#pragma once

#include <cstdint>

#include "core/row_prefetch.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::detail {
void few_rows_scores_e4m3(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq,
                          const void* const* key_rows, float* s, int64_t lds, const RowsToPrefetch& ahead);
void few_rows_accumulate_e4m3(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                              const void* const* value_rows, float* acc, int64_t ldacc,
                              const RowsToPrefetch& next);
}  // namespace tileattn::detail
