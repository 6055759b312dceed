#include "tileattn/reference.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/half.hpp"
#include "core/problem.hpp"
#include "core/validate.hpp"
#include "reference/kv_row.hpp"

namespace tileattn {

namespace {

using detail::load_element;

// Shared walk over every (sequence, head, query row): computes the visible
// scores with `Real` arithmetic and hands them to softmax + P V in `Real`.
template <class Real>
ReferenceOutput run_reference(const ForwardArgs& a, bool round_to_dtype) {
  detail::validate(a);
  const detail::Problem p = detail::describe(a);
  const AttentionShape& s = a.shape;
  const int dt = static_cast<int>(a.dtype);
  // K/V: a quantized cache's elements times their key's scale (the
  // dequantized cache; Real(element) * Real(scale), exact in float64).
  const int kv_dt = static_cast<int>(kv_storage_dtype(a.dtype, a.kv.quant));
  const int64_t q_batches = a.cu_seqlens_q ? 1 : s.batch;
  const int64_t d = s.head_dim, dv = value_head_dim(s);  // Q/K, V/O
  const double scale = std::isnan(a.scale) ? 1.0 / std::sqrt(double(d)) : double(a.scale);
  ReferenceOutput out;
  // An empty batch computes nothing; validation does not bound seqlen_q then
  // (a packed Q may claim any row count), so nothing is sized by it either.
  if (s.batch == 0) return out;
  out.o.assign(size_t(q_batches * s.heads * s.seqlen_q * dv), 0.0);
  out.lse.assign(size_t(q_batches * s.heads * s.seqlen_q), -std::numeric_limits<double>::infinity());

  std::vector<Real> scores, qrow, acc;
  std::vector<char> visible;
  for (int64_t b = 0; b < s.batch; ++b) {
    const detail::Sequence seq = detail::sequence_of(p, b);
    if (seq.nq == 0) continue;  // no row to write; its keys (however many) are never read
    scores.resize(size_t(seq.nk));
    visible.resize(size_t(seq.nk));
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kvh = h / p.group;
      for (int64_t i = 0; i < seq.nq; ++i) {
        const int64_t q_off = seq.q_batch * a.q.stride[0] + h * a.q.stride[1] +
                              (seq.q_row0 + i) * a.q.stride[2];
        qrow.assign(size_t(d), Real(0));
        for (int64_t c = 0; c < d; ++c) qrow[c] = Real(load_element(a.q.data, dt, q_off + c * a.q.stride[3]));
        Real max_score = -std::numeric_limits<Real>::infinity();
        bool any = false;
        for (int64_t j = 0; j < seq.nk; ++j) {
          bool keep = detail::band_keeps(p.band, seq.offset, i, j);
          double bias = 0.0;
          if (keep && a.mask.kind != MaskSpec::Kind::none) {
            const auto& ms = a.mask.stride;
            const int64_t m_off = b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3];
            if (a.mask.kind == MaskSpec::Kind::boolean)
              keep = static_cast<const uint8_t*>(a.mask.data)[m_off] != 0;
            else
              bias = static_cast<const float*>(a.mask.data)[m_off];
          }
          visible[j] = keep;
          if (!keep) continue;
          const detail::KvRow k = detail::k_row(a, b, seq, kvh, j);
          Real dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += qrow[c] * (Real(load_element(a.k.data, kv_dt, k.offset + c * a.k.stride[3])) * Real(k.scale));
          Real score = dot * Real(scale);
          // Soft cap, then masks and bias (FlashAttention-2's order).
          if (a.softcap > 0.0f) score = Real(a.softcap) * std::tanh(score / Real(a.softcap));
          if (a.alibi_slopes)
            score -= Real(a.alibi_slopes[b * a.alibi_batch_stride + h]) *
                     Real(std::llabs(i + seq.offset - j));
          score += Real(bias);
          if (score == -std::numeric_limits<Real>::infinity()) {
            visible[j] = false;  // an additive -inf hides the key
            continue;
          }
          scores[j] = score;
          any = true;
          if (!(score <= max_score)) max_score = score;  // NaN propagates into the max
        }
        const int64_t out_row = (seq.q_batch * s.heads + h) * s.seqlen_q + seq.q_row0 + i;
        // A sink joins the denominator only: exp(sink) with no value.
        const Real sink = a.sinks ? Real(a.sinks[h]) : -std::numeric_limits<Real>::infinity();
        if (!any) {
          if (a.sinks) out.lse[size_t(out_row)] = double(sink);  // O = 0, LSE = sink
          continue;  // O = 0, LSE = -inf
        }
        if (sink > max_score) max_score = sink;  // a NaN max stays NaN
        Real sum = a.sinks ? std::exp(sink - max_score) : Real(0);
        acc.assign(size_t(dv), Real(0));
        for (int64_t j = 0; j < seq.nk; ++j) {
          if (!visible[j]) continue;
          Real prob = std::exp(scores[j] - max_score);
          scores[j] = prob;
          sum += prob;
        }
        for (int64_t j = 0; j < seq.nk; ++j) {
          if (!visible[j]) continue;
          const Real prob = scores[j] / sum;
          const detail::KvRow v = detail::v_row(a, b, seq, kvh, j);
          for (int64_t c = 0; c < dv; ++c)
            acc[c] += prob * (Real(load_element(a.v.data, kv_dt, v.offset + c * a.v.stride[3])) * Real(v.scale));
        }
        for (int64_t c = 0; c < dv; ++c) {
          double value = double(acc[c]);
          if (round_to_dtype) {
            float f = float(value);
            if (a.dtype == DType::f16) f = detail::f16_to_float(detail::float_to_f16(f));
            if (a.dtype == DType::bf16) f = detail::bf16_to_float(detail::float_to_bf16(f));
            value = f;
          }
          out.o[size_t(out_row * dv + c)] = value;
        }
        out.lse[size_t(out_row)] = double(max_score) + std::log(double(sum));
      }
    }
  }
  return out;
}

}  // namespace

ReferenceOutput reference_forward(const ForwardArgs& args) { return run_reference<double>(args, false); }
ReferenceOutput naive_forward(const ForwardArgs& args) { return run_reference<float>(args, true); }

}  // namespace tileattn
