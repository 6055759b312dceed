// Entry points of few_rows_vnni.cpp: the few-rows decode products of an int8
// cache on AVX512-VNNI (vpdpwssd: pairs of 16-bit integers into int32 sums),
// taken under bf16_probabilities with bf16 queries (FewRows16Kernels). Called
// only where CPUID has AVX512-VNNI (Cascade Lake, Ice Lake, Sapphire Rapids
// and later; Zen 4 and later).
//
// Scores: each query row is rounded once to 16-bit integers, q ~ step x q16
// with step = max |q| / kQ16Max(d) (few_rows_split_q16). A score is then an
// exact integer sum, sum_d q16[d] k[d], converted to fp32 (rounded once) and
// times step: the only error is Q's rounding, at most step / 2 per element,
// 2^-16 of the row's largest. That moves the LSE by more than the accuracy
// rule allows (its naive attention multiplies the bf16 queries exactly in
// fp32), so the default keeps the FMA products (docs/accuracy.md,
// docs/inference.md "int8 products on VNNI").
#pragma once

#include <cstdint>

#include "core/row_prefetch.hpp"

namespace tileattn::detail {

// The largest |q16|: every int32 sum (partial or whole) stays below 2^31 for
// keys in [-128, 127]: d x kQ16Max(d) x 128 < 2^31 (512 x 32767 x 128 =
// 2147418112).
constexpr int32_t kQ16Max(int64_t d) { return d <= 512 ? 32767 : 16383; }

// int16s per rounded query row as the main loop keeps them (its scratch's
// q16, core/scheduler.cpp): d rounded up to whole 32-element loads.
constexpr int64_t q16_row_stride(int64_t d) { return (d + 31) / 32 * 32; }

// Rows [0, m) of q (row stride ldq, d elements) rounded to q16 (row r at
// q16 + r * ldq16, zero from d up to d rounded up to 32) and steps[r *
// step_stride]. false when a row is not finite (the caller then takes the
// fp32 products, which carry NaN and infinity as the reference does).
bool few_rows_split_q16(int64_t m, int64_t d, const float* q, int64_t ldq, int16_t* q16, int64_t ldq16,
                        float* steps, int64_t step_stride);

// s[r, c] = steps[r * step_stride] x (q16[r] . key_rows[c]) for r < m <= 8,
// c < n: int8 keys of d bytes with unit element stride, read in place (any d;
// a masked load past the last 32). Prefetches the rows of `ahead` as the FMA
// scores do (few_rows16::scores).
void few_rows_int8_scores_vnni(int64_t m, int64_t n, int64_t d, const int16_t* q16, int64_t ldq16,
                               const float* steps, int64_t step_stride, const void* const* key_rows, float* s,
                               int64_t lds, const RowsToPrefetch& ahead);

// acc[r, :d] += sum_c p[r, c] value_rows[c][:d] for r < m <= 8, c < n: int8
// V rows of d bytes with unit element stride (any d), P rounded to 16-bit
// integers with one step per row and 32 keys (an error of at most 2^-16 of
// the largest P of those keys per element): the P V of bf16_probabilities
// on an int8 cache (few_rows_vnni.cpp explains the layout). Prefetches the
// K rows of `ahead` (the next step's, which the main loop gives this product
// instead of the scores; its V table is not read; ahead.k_row_bytes each) as
// it goes: key c's lines while the key pair holding c is multiplied, the
// even keys of a 32-key chunk in its first column pass and the odd ones in
// its second.
void few_rows_int8_accumulate_vnni(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp,
                                   const void* const* value_rows, float* acc, int64_t ldacc,
                                   const RowsToPrefetch& ahead = {});

}  // namespace tileattn::detail
