// The AVX-512 few-rows (decode) products of src/isa/avx512/few_rows_kernels.hpp,
// compiled natively with the AVX-512 flags in a translation unit of their own
// (native_avx512_few_rows.cpp, in a namespace of their own), behind plain
// declarations: the test that calls them is compiled without AVX-512 flags and
// checks isa_available(Isa::avx512) first, so a CPU without AVX-512 never runs
// an AVX-512 instruction. The main loop's decode tests reach the same products
// through avx512::Kernels; these call them directly, with rows placed against
// guard pages.
#pragma once

#include <cstdint>

#include "tileattn/types.hpp"

namespace tileattn::testing::native_avx512 {

// Same contracts as FewRows16Kernels (without prefetching): an fp8 e4m3
// row converts as FewRows16Kernels chooses (byte permutes where CPUID has
// AVX512-VBMI), or through fp16 with fp16_route (the path of CPUs without VBMI).
void few_rows_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq, const void* const* key_rows,
                     DType dtype, float* s, int64_t lds, bool fp16_route = false);
void few_rows_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                         const void* const* value_rows, DType dtype, float* acc, int64_t ldacc,
                         bool fp16_route = false);

}  // namespace tileattn::testing::native_avx512
