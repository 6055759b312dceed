// The accuracy rule of the project, in one place for every checker in C++:
// outputs (testing/problem_case.cpp: the GoogleTest suites, `tileattn check`,
// tileattn-ring --check) and gradients (tests/training/backward_support.hpp,
// tileattn-ring --check --backward via mpi/gradient_check.hpp). Python has its
// one copy in tests/python/reference.py. Kept free of GoogleTest so that a
// plain program can include it. docs/accuracy.md gives the measurements.
//
// A tensor is a list of rows (an output row: one query's head_dim values; a
// dK/dV row: one key's). Each row r must satisfy, against a float64 reference,
//
//   max_c |got - ref|  <=  2 x max_c |naive - ref|  +  floor_fraction(dtype) x max |ref|
//
// where naive is standard attention in the same precision and max |ref| is
// taken over the whole tensor's non-NaN elements. Per row, because the naive
// error differs by orders of magnitude between rows (a row biased by -1e9 is
// rounded away in any fp32 score, ~0.5 error, next to rows at ~1e-7): a
// tensor-wide maximum lets every ordinary row off. The floor is proportional to
// the tensor's magnitude, because two fp32 summation orders differ per row by a
// few units of the accumulator at the tensor's scale however lucky the naive
// one was for that row (and rows that cancel to ~0 keep that absolute error).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tileattn/types.hpp"

namespace tileattn::testing {

// Unit roundoff (half a unit in the last place at 1) of a storage type.
inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f32: return std::ldexp(1.0, -24);
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::i8: return 0.5;            // KV storage only (never an output's dtype);
    case DType::f8_e4m3: return std::ldexp(1.0, -4);  // listed for completeness
  }
  return 0;
}

// c(dtype) for outputs: the floor as a fraction of max |ref|. Half a unit of
// the storage type (both sides round their result to it; fp16/bf16 outputs
// round to the same neighbour except near a midpoint) plus 16 units of the fp32
// accumulator (the per-row spread of two fp32 summation orders: up to 5 units
// measured over the case table, docs/accuracy.md). fp32: 2^-20 + 2^-25
// (9.8e-7); fp16: 2.4e-4; bf16: 2.0e-3. A perturbation of 1e-3 (fp32) or
// 1e-2 (fp16/bf16) of every output fails (tests/core, tests/cli).
inline double output_floor_fraction(DType dtype) {
  constexpr double kAccumulatorUnits = 16;
  return 0.5 * unit_roundoff(dtype) + kAccumulatorUnits * unit_roundoff(DType::f32);
}

// c(dtype) for gradients: the same storage term, 64 units of the fp32
// accumulator. The backward's softmax is exp(S - LSE) with the LSE rounded to
// fp32: below |LSE| = 32 (where the kernel does not recompute max and sum) a
// peaked row keeps up to 2^-20 of relative error from that rounding, which
// naive attention does not have; measured up to 22 units (dQ, scale 10,
// causal, docs/accuracy.md).
inline double gradient_floor_fraction(DType dtype) {
  constexpr double kAccumulatorUnits = 64;
  return 0.5 * unit_roundoff(dtype) + kAccumulatorUnits * unit_roundoff(DType::f32);
}

// The LSE's floor, per row, as a fraction of max(1, |LSE|): 16 units of fp32.
// The LSE is a max of fp32 scores plus a log, rounded at their size, and the
// naive error of one row can be near zero by luck: at |LSE| ~ 4e28 a row
// needed 2.2 units (tests/reliability/numerics_test.cpp, huge scale), rows
// at |LSE| ~ 1e6 under one. Its error is taken less its own rounding to fp32
// (two units in the last place at its size).
inline double lse_floor_fraction() { return 16 * unit_roundoff(DType::f32); }

// The verdict on one tensor. error, naive_error and tolerance are those of its
// worst row (the largest error / tolerance), so ok() == (error <= tolerance)
// when no NaN disagrees.
struct RowCheck {
  double error = 0;        // worst row: max |got - ref|
  double naive_error = 0;  // worst row: max |naive - ref|
  double tolerance = 0;    // worst row: 2 x naive_error + floor
  double floor = 0;        // floor fraction x magnitude (+ check_gradient's D term)
  double magnitude = 0;    // max |ref| over the tensor's non-NaN elements
  double ratio = 0;        // worst row's error / tolerance (inf: error where tolerance is 0)
  int64_t worst_row = -1;  // index of that row, -1 when no row has an error
  bool nan_mismatch = false;
  bool ok() const { return !nan_mismatch && ratio <= 1; }
};

// The rule on one tensor. got, ref, naive: the tensor element for element,
// rows of `row_length` contiguous elements (ref in float64, got and naive as
// the dtype stored them). Every got is first multiplied by (1 + perturb): a
// check that still passes then does not bite. The floor is floor_fraction x
// max |ref| + extra_floor.
// row_allowance (empty: none): a further bound per row, added to that row's
// tolerance (a documented error outside the rule, e.g. the 2^-8 (P |V|) of
// ForwardArgs::bf16_probabilities).
inline RowCheck check_rows(const std::vector<double>& got, const std::vector<double>& ref,
                           const std::vector<double>& naive, int64_t row_length, double floor_fraction,
                           double perturb = 0, double extra_floor = 0,
                           const std::vector<double>& row_allowance = {}) {
  RowCheck g;
  for (size_t e = 0; e < ref.size(); ++e)
    if (!std::isnan(ref[e])) g.magnitude = std::max(g.magnitude, std::abs(ref[e]));
  g.floor = floor_fraction * g.magnitude + extra_floor;
  g.tolerance = g.floor;
  const size_t n = size_t(std::max<int64_t>(row_length, 1));
  for (size_t row0 = 0; row0 < ref.size(); row0 += n) {
    double error = 0, naive_error = 0;
    for (size_t e = row0; e < std::min(row0 + n, ref.size()); ++e) {
      const double value = got[e] * (1 + perturb);
      if (std::isnan(ref[e]) != std::isnan(value)) g.nan_mismatch = true;
      if (std::isnan(ref[e])) continue;
      error = std::max(error, std::abs(value - ref[e]));
      if (!std::isnan(naive[e])) naive_error = std::max(naive_error, std::abs(naive[e] - ref[e]));
    }
    if (error == 0) continue;
    const double tolerance =
        2 * naive_error + g.floor + (row_allowance.empty() ? 0.0 : row_allowance[row0 / n]);
    const double ratio = tolerance > 0 ? error / tolerance : std::numeric_limits<double>::infinity();
    if (ratio > g.ratio) {
      g.ratio = ratio;
      g.worst_row = int64_t(row0 / n);
      g.error = error;
      g.naive_error = naive_error;
      g.tolerance = tolerance;
    }
  }
  return g;
}

// An output ([..., rows, head_dim] dense) of `dtype`.
inline RowCheck check_output(const std::vector<double>& got, const std::vector<double>& ref,
                             const std::vector<double>& naive, int64_t head_dim, DType dtype, double perturb = 0,
                             const std::vector<double>& row_allowance = {}) {
  return check_rows(got, ref, naive, head_dim, output_floor_fraction(dtype), perturb, 0, row_allowance);
}

// A gradient ([..., rows, head_dim] dense: dQ by query, dK and dV by key).
// max_delta: for dQ and dK, max |D| over the rows, D = rowsum(dO o O) (0 for
// dV, which D does not enter). dS = P o (dP - D) cancels D: a row that sees
// one key has P = 1 and dP = D, so its exact dQ and dK are 0 while the
// kernel keeps the fp32 rounding of dP and D (each a dot product of head_dim
// terms, summed in different orders): a few units of the fp32 accumulator at
// |D|, times scale |K| (or scale |Q|). The floor then has a second term,
// 64 x 2^-24 x max |D|, whatever the storage type (D is summed in fp32).
// In fp16/bf16 D also carries the storage rounding of O (up to u(dtype) x
// sum |dO o O|), which the naive error covers row by row: naive_backward
// rounds O to the dtype before D, and with dropout takes Z = 1 / (1 - p) in
// fp32 from the fp32 p as the kernel does, so on a row that sees one key both
// round the same products Z v to the same 16-bit neighbours. A naive with
// another Z (2.5 for p = 0.6 as a double: products exactly on 16-bit
// midpoints) does not, and is no measure of this error (docs/accuracy.md,
// "16-bit dropout").
using GradientCheck = RowCheck;
inline GradientCheck check_gradient(const std::vector<double>& got, const std::vector<double>& ref,
                                    const std::vector<double>& naive, DType dtype, int64_t head_dim,
                                    double max_delta, double perturb = 0,
                                    const std::vector<double>& row_allowance = {}) {
  constexpr double kDeltaUnits = 64;
  return check_rows(got, ref, naive, head_dim, gradient_floor_fraction(dtype), perturb,
                    kDeltaUnits * unit_roundoff(DType::f32) * max_delta, row_allowance);
}

}  // namespace tileattn::testing
