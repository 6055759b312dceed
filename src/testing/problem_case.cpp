#include "testing/problem_case.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/half.hpp"
#include "testing/tolerance.hpp"

namespace tileattn::testing {

namespace {

constexpr int64_t kRowPadding = 5;  // extra elements per row in `strided` cases

struct Tensor {
  std::array<int64_t, 4> stride;
  int64_t elements;
};

// [b, h, n, dim] with the case's layout; `strided` pads each row.
Tensor make_tensor(const Case& c, int64_t batches, int64_t heads, int64_t rows, int64_t dim) {
  const int64_t d_alloc = dim + (c.strided ? kRowPadding : 0);
  Tensor t;
  t.stride = c.varlen ? std::array<int64_t, 4>{0, d_alloc, heads * d_alloc, 1}
                      : dense_strides(c.layout, batches, heads, rows, d_alloc);
  t.elements = batches * heads * rows * d_alloc;
  return t;
}

}  // namespace

std::string Case::name() const {
  static const char* masks[] = {"none", "causal", "window", "bool", "additive", "causal+bool", "additive_extreme"};
  std::ostringstream s;
  s << "b" << batch << "_h" << heads << "_kv" << kv_heads << "_q" << seqlen_q << "_k" << seqlen_k
    << "_d" << head_dim << (v_head_dim > 0 ? "_dv" + std::to_string(v_head_dim) : std::string()) << "_"
    << dtype_name(dtype) << "_" << layout_name(layout) << "_"
    << masks[int(mask)];
  if (mask == MaskCase::window) s << "(" << window_left << "," << window_right << ")";
  if (strided) s << "_strided";
  if (varlen) s << "_varlen";
  if (softcap > 0.0f) s << "_softcap" << softcap;
  if (alibi == Alibi::heads) s << "_alibi";
  if (alibi == Alibi::batch_heads) s << "_alibiBH";
  if (sinks) s << "_sinks";
  if (sinks && sink_shift != 0.0f) s << sink_shift;
  return s.str();
}

CaseData::CaseData(const Case& cs) : c(cs) {
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> uniform(-c.input_scale, c.input_scale);
  int64_t batches = c.batch, rows_q = c.seqlen_q, rows_k = c.seqlen_k;
  int64_t max_nq = c.seqlen_q, max_nk = c.seqlen_k;
  if (c.varlen) {
    batches = 1;
    cu_q.push_back(0);
    cu_k.push_back(0);
    max_nq = max_nk = 0;
    for (size_t b = 0; b < c.varlen_q_lengths.size(); ++b) {
      cu_q.push_back(cu_q.back() + c.varlen_q_lengths[b]);
      cu_k.push_back(cu_k.back() + c.varlen_k_lengths[b]);
      max_nq = std::max<int64_t>(max_nq, c.varlen_q_lengths[b]);
      max_nk = std::max<int64_t>(max_nk, c.varlen_k_lengths[b]);
    }
    rows_q = cu_q.back();
    rows_k = cu_k.back();
  }
  const int64_t dv = c.v_head_dim > 0 ? c.v_head_dim : c.head_dim;
  const Tensor tq = make_tensor(c, batches, c.heads, rows_q, c.head_dim);
  const Tensor tk = make_tensor(c, batches, c.kv_heads, rows_k, c.head_dim);
  const Tensor tv = make_tensor(c, batches, c.kv_heads, rows_k, dv);  // V, and O below
  const Tensor to = make_tensor(c, batches, c.heads, rows_q, dv);
  auto fill = [&](std::vector<float>& f32, std::vector<uint16_t>& f16, int64_t n) {
    if (c.dtype == DType::f32) {
      f32.resize(size_t(n));
      for (auto& x : f32) x = uniform(rng);
    } else {
      f16.resize(size_t(n));
      for (auto& x : f16)
        x = c.dtype == DType::f16 ? detail::float_to_f16(uniform(rng)) : detail::float_to_bf16(uniform(rng));
    }
  };
  fill(q32, q16, tq.elements);
  fill(k32, k16, tk.elements);
  fill(v32, v16, tv.elements);
  if (c.dtype == DType::f32) o32.assign(size_t(to.elements), 0.0f);
  else o16.assign(size_t(to.elements), 0);

  ForwardArgs& a = args;
  a.shape = {c.varlen ? int64_t(c.varlen_q_lengths.size()) : c.batch, c.heads, c.kv_heads, rows_q, rows_k, c.head_dim,
             c.v_head_dim};
  a.dtype = c.dtype;
  const bool f32 = c.dtype == DType::f32;
  a.q = {f32 ? static_cast<const void*>(q32.data()) : q16.data(), tq.stride};
  a.k = {f32 ? static_cast<const void*>(k32.data()) : k16.data(), tk.stride};
  a.v = {f32 ? static_cast<const void*>(v32.data()) : v16.data(), tv.stride};
  a.o = {f32 ? static_cast<void*>(o32.data()) : o16.data(), to.stride};
  if (c.with_lse) {
    lse.assign(size_t(batches * c.heads * rows_q), 0.0f);
    a.lse = lse.data();
    a.lse_stride = {c.heads * rows_q, rows_q, 1};
  }
  if (c.varlen) {
    a.cu_seqlens_q = cu_q.data();
    a.cu_seqlens_k = cu_k.data();
  }
  a.scale = c.scale;
  a.softcap = c.softcap;
  if (c.alibi != Case::Alibi::none) {
    // The standard ALiBi slopes 2^(-8 (h + 1) / heads); per batch entry b scaled by 1 + b / 2.
    const int64_t rows = c.alibi == Case::Alibi::batch_heads ? a.shape.batch : 1;
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t h = 0; h < c.heads; ++h)
        alibi_slopes.push_back(std::exp2(-8.0f * float(h + 1) / float(c.heads)) * (1.0f + 0.5f * float(b)));
    a.alibi_slopes = alibi_slopes.data();
    a.alibi_batch_stride = c.alibi == Case::Alibi::batch_heads ? c.heads : 0;
  }
  if (c.sinks) {
    for (int64_t h = 0; h < c.heads; ++h)
      this->sinks.push_back(c.sink_shift - 2.0f + 10.0f * std::fmod(0.37f * float(h) + 0.61f, 1.0f));
    a.sinks = this->sinks.data();
  }
  const int64_t mask_b = a.shape.batch;
  const int64_t mask_elems = mask_b * c.heads * max_nq * max_nk;
  const std::array<int64_t, 4> mask_stride{c.heads * max_nq * max_nk, max_nq * max_nk, max_nk, 1};
  switch (c.mask) {
    case MaskCase::none: break;
    case MaskCase::causal: a.mask.causal = true; break;
    case MaskCase::window:
      a.mask.window_left = c.window_left;
      a.mask.window_right = c.window_right;
      break;
    case MaskCase::causal_boolean:
      a.mask.causal = true;
      [[fallthrough]];
    case MaskCase::boolean: {
      bool_mask.resize(size_t(mask_elems));
      std::bernoulli_distribution keep(0.7);
      for (auto& m : bool_mask) m = keep(rng) ? 1 : 0;
      a.mask.kind = MaskSpec::Kind::boolean;
      a.mask.data = bool_mask.data();
      a.mask.stride = mask_stride;
      break;
    }
    case MaskCase::additive:
    case MaskCase::additive_extreme: {
      add_mask.resize(size_t(mask_elems));
      std::uniform_real_distribution<float> bias(-3.0f, 3.0f);
      std::bernoulli_distribution hide(0.1);
      for (auto& m : add_mask) m = hide(rng) ? -std::numeric_limits<float>::infinity() : bias(rng);
      if (c.mask == MaskCase::additive_extreme) {
        const float whole_row[] = {-1e9f, std::numeric_limits<float>::lowest(), 1e30f};
        for (int64_t bh = 0; bh < mask_b * c.heads; ++bh)
          for (int64_t r = 0; r < 3 && r < max_nq; ++r)
            for (int64_t j = 0; j < max_nk; ++j) add_mask[size_t((bh * max_nq + r) * max_nk + j)] = whole_row[r];
      }
      a.mask.kind = MaskSpec::Kind::additive;
      a.mask.data = add_mask.data();
      a.mask.stride = mask_stride;
      break;
    }
  }
}

float CaseData::o_at(int64_t qb, int64_t h, int64_t row, int64_t d) const {
  const auto& s = args.o.stride;
  const int64_t off = qb * s[0] + h * s[1] + row * s[2] + d * s[3];
  return detail::load_element(args.o.data, int(c.dtype), off);
}

float CaseData::lse_at(int64_t qb, int64_t h, int64_t row) const {
  const auto& s = args.lse_stride;
  return args.lse[qb * s[0] + h * s[1] + row * s[2]];
}

void CaseData::set_q(int64_t qb, int64_t h, int64_t row, int64_t d, float value) {
  const auto& s = args.q.stride;
  detail::store_element(const_cast<void*>(args.q.data), int(c.dtype), qb * s[0] + h * s[1] + row * s[2] + d * s[3], value);
}

void CaseData::set_k(int64_t kb, int64_t h, int64_t row, int64_t d, float value) {
  const auto& s = args.k.stride;
  detail::store_element(const_cast<void*>(args.k.data), int(c.dtype), kb * s[0] + h * s[1] + row * s[2] + d * s[3], value);
}

std::string Comparison::describe() const {
  std::ostringstream s;
  s << "max_error " << max_error << " in row " << worst_row << " (tolerance " << tolerance << " = 2 x naive "
    << naive_error << " + floor " << floor << " at max|ref| " << magnitude << "; ratio " << ratio << ")";
  if (perturb != 0) s << ", outputs x (1 + " << perturb << ")";
  s << ", lse_error " << lse_error << " (tolerance " << lse_tolerance << ")" << (nan_mismatch ? ", NaN mismatch" : "");
  return s.str();
}

std::vector<double> dense_o(const CaseData& data) {
  const ForwardArgs& a = data.args;
  const int64_t batches = a.cu_seqlens_q ? 1 : a.shape.batch;
  std::vector<double> o;
  const int64_t dv = value_head_dim(a.shape);
  o.reserve(size_t(batches * a.shape.heads * a.shape.seqlen_q * dv));
  for (int64_t qb = 0; qb < batches; ++qb)
    for (int64_t h = 0; h < a.shape.heads; ++h)
      for (int64_t r = 0; r < a.shape.seqlen_q; ++r)
        for (int64_t c = 0; c < dv; ++c) o.push_back(data.o_at(qb, h, r, c));
  return o;
}

std::vector<double> dense_lse(const CaseData& data) {
  const ForwardArgs& a = data.args;
  if (!a.lse) return {};
  const int64_t batches = a.cu_seqlens_q ? 1 : a.shape.batch;
  std::vector<double> lse;
  for (int64_t qb = 0; qb < batches; ++qb)
    for (int64_t h = 0; h < a.shape.heads; ++h)
      for (int64_t r = 0; r < a.shape.seqlen_q; ++r) lse.push_back(data.lse_at(qb, h, r));
  return lse;
}

std::vector<double> p_abs_v_allowance(const Case& c) {
  CaseData abs_v(c);
  for (uint16_t& bits : abs_v.v16) bits &= 0x7fff;
  const ReferenceOutput pv = reference_forward(abs_v.args);
  const size_t d = size_t(c.v_head_dim > 0 ? c.v_head_dim : c.head_dim);  // an O row
  std::vector<double> allowance(pv.o.size() / d, 0.0);
  for (size_t row = 0; row < allowance.size(); ++row)
    for (size_t e = row * d; e < (row + 1) * d; ++e)
      if (!std::isnan(pv.o[e])) allowance[row] = std::max(allowance[row], std::ldexp(pv.o[e], -8));
  return allowance;
}

Comparison compare_outputs(const ForwardArgs& a, const ReferenceOutput& ref, const ReferenceOutput& naive,
                           const std::vector<double>& o, const std::vector<double>& lse, double perturb,
                           const std::vector<double>& row_allowance) {
  Comparison cmp;
  cmp.perturb = perturb;
  const RowCheck rows =
      check_output(o, ref.o, naive.o, value_head_dim(a.shape), a.dtype, perturb, row_allowance);
  cmp.max_error = rows.error;
  cmp.naive_error = rows.naive_error;
  cmp.tolerance = rows.tolerance;
  cmp.ratio = rows.ratio;
  cmp.floor = rows.floor;
  cmp.magnitude = rows.magnitude;
  cmp.worst_row = rows.worst_row;
  cmp.nan_mismatch = rows.nan_mismatch;
  // The LSE, row by row: error <= 2 x naive error + lse_floor_fraction x
  // max(1, |LSE|) (testing/tolerance.hpp).
  cmp.lse_tolerance = lse_floor_fraction();
  double worst = -1;
  for (size_t row = 0; row < lse.size(); ++row) {
    const double expected = ref.lse[row];
    const double got = lse[row];
    if (std::isnan(expected) != std::isnan(got)) cmp.nan_mismatch = true;
    if (std::isnan(expected)) continue;
    if (std::isinf(expected) || std::isinf(got)) {
      if (expected != got) cmp.nan_mismatch = true;
      continue;
    }
    // Scores are kept in log2 units, where fp32 ends at FLT_MAX * ln 2 in
    // natural units: a row biased beyond that (numpy.finfo(float32).min) has
    // its LSE at that end (docs/accuracy.md).
    constexpr double kLog2Limit = double(std::numeric_limits<float>::max()) * 0.6931471805599453;
    if (std::abs(expected) > kLog2Limit) {
      if (!(std::abs(got) >= 0.999 * kLog2Limit && (got < 0) == (expected < 0))) cmp.nan_mismatch = true;
      continue;
    }
    // Less the LSE's own rounding to fp32 (two units in the last place at its
    // size): the naive LSE here is max + log(sum) in double, so the rounding
    // of the output alone would exceed "2 x naive" for a row biased by -1e9
    // (fp32 spacing 64 there).
    const double own_rounding = 2 * std::ldexp(1.0, std::ilogb(std::max(std::abs(expected), 1.0)) - 23);
    const double error = std::max(0.0, std::abs(got - expected) - own_rounding);
    const double tolerance =
        2 * std::abs(naive.lse[row] - expected) + lse_floor_fraction() * std::max(1.0, std::abs(expected));
    if (error / tolerance > worst) {
      worst = error / tolerance;
      cmp.lse_error = error;
      cmp.lse_tolerance = tolerance;
    }
  }
  return cmp;
}

Comparison compare_with_reference(const CaseData& data, double perturb) {
  return compare_outputs(data.args, reference_forward(data.args), naive_forward(data.args), dense_o(data),
                         dense_lse(data), perturb);
}

}  // namespace tileattn::testing
