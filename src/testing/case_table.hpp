// The table of cases shared by the correctness tests and the benchmarks.
#pragma once

#include <functional>
#include <vector>

#include "testing/problem_case.hpp"

namespace tileattn::testing {

// Awkward sizes, every mask, GQA ratios, layouts, strides, varlen, dtypes.
// Under quick_tests() the cases whose float64 reference is expensive are left out.
std::vector<Case> correctness_cases();

// TILEATTN_TEST_QUICK=1: the sanitizer runs of CI (scripts/sanitize.sh), whose
// ASan+UBSan build runs the library several times slower than CTest's.
bool quick_tests();

// Whether combination `index` of a test's loop over `paths` paths (ISAs) runs
// on path number `path`: always, except under quick_tests(), where each
// combination runs on the one path index mod paths. A test that loops over
// several dimensions passes the sum of their loop counters as the index, so
// that every path still meets every value of every dimension; CTest (the full
// run) keeps every combination on every path.
bool in_quick_share(int64_t index, int64_t path, int64_t paths);

// Groups of correctness_cases that the backward's table
// (tests/training/backward_test.cpp) shares, each handed to `add` in order.
void add_mask_cases(const std::function<void(Case)>& add);            // every mask, 3 length pairs; windows
void add_layout_cases(const std::function<void(Case)>& add);          // bhsd/bshd x contiguous/strided
void add_varlen_cases(const std::function<void(Case)>& add);          // packed batches, empty sequences
void add_half_precision_cases(const std::function<void(Case)>& add);  // fp16, bf16
void add_softcap_cases(const std::function<void(Case)>& add);         // soft cap c = 5 with masks, GQA, bf16
void add_alibi_cases(const std::function<void(Case)>& add);           // ALiBi [H] / [B, H], masks, varlen, bf16
void add_sink_cases(const std::function<void(Case)>& add);            // sinks [H]: lengths, masks, varlen, GQA/MQA, fp16/bf16
// V's head dim apart from Q/K's (DeepSeek MLA 192/128 and 576/512, 256/128,
// 64/32, and V wider than Q/K): MHA/GQA/MQA, masks, unequal lengths,
// layouts, varlen, fp16/bf16, decode steps on the few-rows and split-KV paths.
void add_head_dim_pair_cases(const std::function<void(Case)>& add);

// Head dim d (97 queries and keys, the default heads) with mask m.
Case head_dim_case(int64_t d, MaskCase m);
// One head, head_dim 32, nq queries against nk keys; causal when nq + nk is
// odd: the sequence-length cases of both tables.
Case length_case(int64_t nq, int64_t nk);
// h query heads sharing kv_h KV heads (GQA, MQA), 33 causal queries, 70 keys.
Case gqa_case(int64_t h, int64_t kv_h);

}  // namespace tileattn::testing
