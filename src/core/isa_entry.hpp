// The per-ISA entry points of the forward main loop. Each is defined in its own
// translation unit, compiled with that ISA's flags; forward.cpp picks one per call.
#pragma once

#include <cstdint>

#include "core/dropout.hpp"  // the main loops apply dropout (forward: online_softmax)
#include "core/mask_row.hpp"  // the mask step both main loops share
#include "core/problem.hpp"

namespace tileattn::detail {

using ForwardItemFn = void (*)(const Problem& p, const WorkItem& w, float* scratch);

void forward_item_generic(const Problem& p, const WorkItem& w, float* scratch);
void forward_item_avx2(const Problem& p, const WorkItem& w, float* scratch);
void forward_item_avx512(const Problem& p, const WorkItem& w, float* scratch);
// bf16 inputs only (Problem::product == bf16_dot); other dtypes on these
// rungs run forward_item_avx512.
void forward_item_avx512bf16(const Problem& p, const WorkItem& w, float* scratch);
void forward_item_amx(const Problem& p, const WorkItem& w, float* scratch);

// Backward main loop (training/backward_problem.hpp, core/backward_mainloop.hpp).
struct BackwardProblem;
struct BackwardItem;
using BackwardItemFn = void (*)(const BackwardProblem& p, const BackwardItem& w, float* scratch);

void backward_item_generic(const BackwardProblem& p, const BackwardItem& w, float* scratch);
void backward_item_avx2(const BackwardProblem& p, const BackwardItem& w, float* scratch);
void backward_item_avx512(const BackwardProblem& p, const BackwardItem& w, float* scratch);
// bf16 inputs only (Problem::product == bf16_dot), as their normalizer
// passes below; other dtypes on these rungs run the avx512 ones.
void backward_item_avx512bf16(const BackwardProblem& p, const BackwardItem& w, float* scratch);
void backward_item_amx(const BackwardProblem& p, const BackwardItem& w, float* scratch);

// The backward's normalizer pass: rows[0, count) of head h in sequence b.
using BackwardNormalizersFn = void (*)(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                                       int64_t count, float* scratch);
void backward_normalizers_generic(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                                  int64_t count, float* scratch);
void backward_normalizers_avx2(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                               int64_t count, float* scratch);
void backward_normalizers_avx512(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                                 int64_t count, float* scratch);
void backward_normalizers_avx512bf16(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                                     int64_t count, float* scratch);
void backward_normalizers_amx(const BackwardProblem& p, int64_t b, int64_t h, const int64_t* rows,
                              int64_t count, float* scratch);

}  // namespace tileattn::detail
