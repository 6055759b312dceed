// One attention case: shapes, mask, dtype, layout. The same table of cases
// feeds the correctness tests and the benchmarks (as ggml's test-backend-ops).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tileattn/attention.hpp"
#include "tileattn/reference.hpp"

namespace tileattn::testing {

// additive_extreme: the additive mask with rows 0, 1 and 2 of every (batch,
// head) set whole to -1e9, numpy.finfo(float32).min and +1e30 (padding masks
// as Hugging Face writes them: finite, but beyond the scores' precision).
enum class MaskCase { none, causal, window, boolean, additive, causal_boolean, additive_extreme };

struct Case {
  int64_t batch = 1, heads = 2, kv_heads = 2, seqlen_q = 64, seqlen_k = 64, head_dim = 64;
  int64_t v_head_dim = 0;    // V and O (AttentionShape::v_head_dim); 0: head_dim
  DType dtype = DType::f32;
  Layout layout = Layout::bhsd;
  MaskCase mask = MaskCase::none;
  int64_t window_left = 16, window_right = 0;
  bool strided = false;      // inputs are views with padding between rows
  bool varlen = false;       // packed sequences with lengths `varlen_lengths`
  std::vector<int32_t> varlen_q_lengths, varlen_k_lengths;
  bool with_lse = true;
  float scale = std::numeric_limits<float>::quiet_NaN();
  float softcap = 0.0f;      // ForwardArgs::softcap (0: off)
  // ALiBi slopes: none, [heads] (the standard geometric slopes), or [batch, heads]
  // (those scaled by 1 + batch / 2).
  enum class Alibi { none, heads, batch_heads } alibi = Alibi::none;
  // Attention sinks [heads]: logits spread over [-2, 8] (below and above the
  // rows' LSE ~ log(keys), so both sides of the fold's max show).
  bool sinks = false;
  float sink_shift = 0.0f;  // added to every sink (large scores need large sinks to matter)
  float input_scale = 1.0f;  // inputs are uniform in [-input_scale, input_scale]
  uint64_t seed = 1;
  std::string name() const;
};

// Owns the input/output buffers of one case and the ForwardArgs pointing into them.
struct CaseData {
  Case c;
  std::vector<uint16_t> q16, k16, v16, o16;  // f16/bf16 storage
  std::vector<float> q32, k32, v32, o32;     // f32 storage
  std::vector<float> lse;
  std::vector<uint8_t> bool_mask;
  std::vector<float> add_mask;
  std::vector<int32_t> cu_q, cu_k;
  std::vector<float> alibi_slopes;
  std::vector<float> sinks;
  ForwardArgs args;

  explicit CaseData(const Case& c);
  // O element (q-batch, head, row, d < value_head_dim) as float, from whichever storage.
  float o_at(int64_t qb, int64_t h, int64_t row, int64_t d) const;
  float lse_at(int64_t qb, int64_t h, int64_t row) const;
  // Write value into q/k/v element (for NaN tests).
  void set_q(int64_t qb, int64_t h, int64_t row, int64_t d, float value);
  void set_k(int64_t kb, int64_t h, int64_t row, int64_t d, float value);
};

// The verdict of testing/tolerance.hpp's rule on O (per row) and the LSE.
struct Comparison {
  double max_error = 0;        // worst O row (largest error / tolerance): its error against float64
  double naive_error = 0;      // that row's error of the naive same-precision implementation
  double tolerance = 0;        // that row's bound: 2 * naive_error + floor_fraction(dtype) * magnitude
  double ratio = 0;            // max_error / tolerance: above 1 fails
  double floor = 0;            // floor_fraction(dtype) * magnitude
  double magnitude = 0;        // max |O| of the float64 reference
  int64_t worst_row = -1;      // flat row index (batch, head, row) of that row
  double perturb = 0;          // every O element was multiplied by 1 + perturb before comparing
  double lse_error = 0;        // worst LSE row by the same rule (less the LSE's own rounding)
  double lse_tolerance = 0;
  bool nan_mismatch = false;   // NaN where the reference has none, or the reverse
  bool ok() const { return !nan_mismatch && ratio <= 1 && lse_error <= lse_tolerance; }
  std::string describe() const;
};

// Compares what is in data's outputs with the float64 reference, by
// testing/tolerance.hpp's rule; runs nothing but the references. With
// perturb != 0 every O element is scaled by (1 + perturb) first.
Comparison compare_with_reference(const CaseData& data, double perturb = 0);

// The same comparison for outputs held elsewhere: o dense [batches, heads,
// seqlen_q, value_head_dim] as double, lse dense [batches, heads, seqlen_q] (empty:
// not checked), against ref = reference_forward(args) and naive =
// naive_forward(args) (batches: 1 for packed sequences, else shape.batch).
// row_allowance (one per O row; empty: none) widens each row's tolerance by
// a documented bound (testing/tolerance.hpp's check_rows).
Comparison compare_outputs(const ForwardArgs& args, const ReferenceOutput& ref, const ReferenceOutput& naive,
                           const std::vector<double>& o, const std::vector<double>& lse, double perturb = 0,
                           const std::vector<double>& row_allowance = {});

// bf16_probabilities' bound, one allowance per O row for compare_outputs:
// 2^-8 x the row's largest (P |V|)(i, d), P the float64 reference's
// probabilities (|V| through the reference with V's sign bits cleared; a
// 16-bit case).
std::vector<double> p_abs_v_allowance(const Case& c);

// O and LSE of a case's buffers, dense as compare_outputs takes them.
std::vector<double> dense_o(const CaseData& data);
std::vector<double> dense_lse(const CaseData& data);

}  // namespace tileattn::testing
