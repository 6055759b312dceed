#include "training/reference_backward.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/dropout.hpp"
#include "reference/kv_row.hpp"
#include "core/half.hpp"
#include "core/problem.hpp"
#include "core/validate.hpp"
#include "training/backward_problem.hpp"

namespace tileattn::training {

namespace {

using detail::load_element;

// `Real` arithmetic; `naive` rounds O and the gradients to the dtype, as a
// same-precision implementation that stores them would. With `given`, each
// row's LSE and O come from it (reference_backward_from_lse) instead of
// from this softmax.
template <class Real>
BackwardReference run(const ForwardArgs& a, const InputView* d_o, bool naive, const BackwardArgs* given = nullptr) {
  const detail::Problem p = detail::describe(a);
  const detail::DropoutSpec dropout = detail::make_dropout(a.dropout_p, a.seed);
  // The exact keep scale for the float64 reference; the float one otherwise.
  const Real keep_scale = naive ? Real(dropout.keep_scale) : Real(1.0 / (1.0 - double(a.dropout_p)));
  const AttentionShape& s = a.shape;
  const int dt = static_cast<int>(a.dtype);
  const int kv_dt = static_cast<int>(kv_storage_dtype(a.dtype, a.kv.quant));
  const int64_t q_batches = a.cu_seqlens_q ? 1 : s.batch, k_batches = a.cu_seqlens_k ? 1 : s.batch;
  const int64_t d = s.head_dim, dv_dim = value_head_dim(s);  // Q/K/dQ/dK; V/O/dO/dV
  const Real scale = Real(std::isnan(a.scale) ? 1.0 / std::sqrt(double(d)) : double(a.scale));
  auto round = [&](Real x) -> Real {
    if (!naive) return x;
    float f = float(x);
    if (a.dtype == DType::f16) f = detail::f16_to_float(detail::float_to_f16(f));
    if (a.dtype == DType::bf16) f = detail::bf16_to_float(detail::float_to_bf16(f));
    return Real(f);
  };

  BackwardReference out;
  out.o.assign(size_t(q_batches * s.heads * s.seqlen_q * dv_dim), 0.0);
  out.lse.assign(size_t(q_batches * s.heads * s.seqlen_q), -std::numeric_limits<double>::infinity());
  out.delta.assign(out.lse.size(), 0.0);
  std::vector<Real> dq(size_t(q_batches * s.heads * s.seqlen_q * d), Real(0));
  std::vector<Real> dk(size_t(k_batches * s.kv_heads * s.seqlen_k * d), Real(0));
  std::vector<Real> dv(size_t(k_batches * s.kv_heads * s.seqlen_k * dv_dim), Real(0));
  std::vector<Real> d_sinks(a.sinks ? size_t(s.heads) : 0, Real(0));

  std::vector<Real> q, o, g, prob, zeta, dcap, krows, vrows;
  std::vector<char> visible;
  for (int64_t b = 0; b < s.batch; ++b) {
    const detail::Sequence seq = detail::sequence_of(p, b);
    const int64_t nk = seq.nk;
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kvh = h / p.group;
      // This head's keys and values, as Real.
      krows.assign(size_t(nk * d), Real(0));
      vrows.assign(size_t(nk * dv_dim), Real(0));
      // A quantized cache (forward with dropout only) as its elements times
      // their key's scale; contiguous or paged.
      for (int64_t j = 0; j < nk; ++j) {
        const detail::KvRow kr = detail::k_row(a, b, seq, kvh, j), vr = detail::v_row(a, b, seq, kvh, j);
        for (int64_t c = 0; c < d; ++c)
          krows[size_t(j * d + c)] =
              Real(load_element(a.k.data, kv_dt, kr.offset + c * a.k.stride[3])) * Real(kr.scale);
        for (int64_t c = 0; c < dv_dim; ++c)
          vrows[size_t(j * dv_dim + c)] =
              Real(load_element(a.v.data, kv_dt, vr.offset + c * a.v.stride[3])) * Real(vr.scale);
      }
      for (int64_t i = 0; i < seq.nq; ++i) {
        const int64_t row = seq.q_row0 + i;
        const int64_t q_off = seq.q_batch * a.q.stride[0] + h * a.q.stride[1] + row * a.q.stride[2];
        q.assign(size_t(d), Real(0));
        for (int64_t c = 0; c < d; ++c) q[c] = Real(load_element(a.q.data, dt, q_off + c * a.q.stride[3]));
        // Scores of visible keys, their max.
        prob.assign(size_t(nk), Real(0));
        dcap.assign(size_t(nk), Real(1));
        visible.assign(size_t(nk), 0);
        Real max_score = -std::numeric_limits<Real>::infinity();
        bool any = false;
        for (int64_t j = 0; j < nk; ++j) {
          bool keep = j >= i + seq.offset - p.band.left && j <= i + seq.offset + p.band.right;
          Real bias = 0;
          if (keep && a.mask.kind != MaskSpec::Kind::none) {
            const auto& ms = a.mask.stride;
            const int64_t m_off = b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3];
            if (a.mask.kind == MaskSpec::Kind::boolean) keep = static_cast<const uint8_t*>(a.mask.data)[m_off] != 0;
            else bias = Real(static_cast<const float*>(a.mask.data)[m_off]);
          }
          if (!keep) continue;
          Real dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[c] * krows[size_t(j * d + c)];
          Real score = dot * scale;
          if (a.softcap > 0.0f) {
            // Soft cap before masks and bias; d(capped) / d(score) = 1 - tanh^2.
            const Real t = std::tanh(score / Real(a.softcap));
            score = Real(a.softcap) * t;
            dcap[j] = Real(1) - t * t;
          }
          if (a.alibi_slopes)
            score -= Real(a.alibi_slopes[b * a.alibi_batch_stride + h]) * Real(std::llabs(i + seq.offset - j));
          score += bias;
          if (score == -std::numeric_limits<Real>::infinity()) continue;
          visible[j] = 1;
          prob[j] = score;
          any = true;
          if (!(score <= max_score)) max_score = score;
        }
        const int64_t out_row = (seq.q_batch * s.heads + h) * s.seqlen_q + row;
        // A sink joins the denominator only (no value, no column of P).
        const Real sink = a.sinks ? Real(a.sinks[h]) : -std::numeric_limits<Real>::infinity();
        if (!any) {
          // O = 0, dQ = 0, no contribution to dK / dV (nor to d_sinks: D = 0);
          // LSE = the sink, or -inf.
          if (a.sinks) out.lse[size_t(out_row)] = double(sink);
          continue;
        }
        // The row's normalizer: exp(max_score) * sum = exp(LSE).
        Real sum = 0;
        if (given) {
          const float lse = given->lse[seq.q_batch * given->lse_stride[0] + h * given->lse_stride[1] +
                                       row * given->lse_stride[2]];
          if (lse == -std::numeric_limits<float>::infinity()) continue;  // P = 0, as the kernels take it
          max_score = Real(lse);
          sum = Real(1);
          for (int64_t j = 0; j < nk; ++j)
            if (visible[j]) prob[j] = std::exp(prob[j] - max_score);
        } else {
          if (sink > max_score) max_score = sink;  // a NaN max stays NaN
          sum = a.sinks ? std::exp(sink - max_score) : Real(0);
          for (int64_t j = 0; j < nk; ++j)
            if (visible[j]) sum += prob[j] = std::exp(prob[j] - max_score);
        }
        zeta.assign(size_t(nk), Real(1));
        for (int64_t j = 0; j < nk; ++j) {
          if (!visible[j]) continue;
          prob[j] /= sum;
          if (dropout.active)
            zeta[j] = detail::dropout_factor(dropout, b, h, i, j) != 0.0f ? keep_scale : Real(0);
        }
        o.assign(size_t(dv_dim), Real(0));
        if (given) {
          const int64_t o_off =
              seq.q_batch * given->o.stride[0] + h * given->o.stride[1] + row * given->o.stride[2];
          for (int64_t c = 0; c < dv_dim; ++c)
            o[c] = Real(load_element(given->o.data, dt, o_off + c * given->o.stride[3]));
        } else {
          for (int64_t j = 0; j < nk; ++j)
            if (visible[j])
              for (int64_t c = 0; c < dv_dim; ++c) o[c] += prob[j] * zeta[j] * vrows[size_t(j * dv_dim + c)];
          for (int64_t c = 0; c < dv_dim; ++c) {
            o[c] = round(o[c]);
            out.o[size_t(out_row * dv_dim + c)] = double(o[c]);
          }
          out.lse[size_t(out_row)] = double(max_score) + std::log(double(sum));
        }
        if (!d_o) continue;
        const int64_t g_off = seq.q_batch * d_o->stride[0] + h * d_o->stride[1] + row * d_o->stride[2];
        g.assign(size_t(dv_dim), Real(0));
        for (int64_t c = 0; c < dv_dim; ++c) g[c] = Real(load_element(d_o->data, dt, g_off + c * d_o->stride[3]));
        Real delta = 0;
        for (int64_t c = 0; c < dv_dim; ++c) delta += g[c] * o[c];
        out.delta[size_t(out_row)] = double(delta);
        if (a.sinks) d_sinks[size_t(h)] -= std::exp(sink - max_score) / sum * delta;
        for (int64_t j = 0; j < nk; ++j) {
          if (!visible[j]) continue;
          Real dp = 0;
          for (int64_t c = 0; c < dv_dim; ++c) dp += g[c] * vrows[size_t(j * dv_dim + c)];
          const Real ds = prob[j] * (zeta[j] * dp - delta) * dcap[j];
          const Real pz = prob[j] * zeta[j];
          const size_t key = size_t((seq.k_batch * s.kv_heads + kvh) * s.seqlen_k + seq.k_row0 + j);
          for (int64_t c = 0; c < d; ++c) {
            dq[size_t(out_row * d + c)] += scale * ds * krows[size_t(j * d + c)];
            dk[key * size_t(d) + size_t(c)] += scale * ds * q[c];
          }
          for (int64_t c = 0; c < dv_dim; ++c) dv[key * size_t(dv_dim) + size_t(c)] += pz * g[c];
        }
      }
    }
  }
  auto finish = [&](const std::vector<Real>& from, std::vector<double>& to) {
    to.resize(from.size());
    for (size_t e = 0; e < from.size(); ++e) to[e] = double(round(from[e]));
  };
  if (d_o) {
    finish(dq, out.dq);
    finish(dk, out.dk);
    finish(dv, out.dv);
    out.d_sinks.assign(d_sinks.begin(), d_sinks.end());  // fp32 output: not rounded to the dtype
  }
  return out;
}

}  // namespace

BackwardReference reference_backward(const BackwardArgs& args) {
  detail::validate(args);
  return run<double>(args.forward, &args.d_o, false);
}

BackwardReference reference_backward_from_lse(const BackwardArgs& args) {
  detail::validate(args);
  BackwardReference out = run<double>(args.forward, &args.d_o, false, &args);
  out.o.clear();
  out.lse.clear();
  return out;
}

BackwardReference naive_backward(const BackwardArgs& args) {
  detail::validate(args);
  return run<float>(args.forward, &args.d_o, true);
}

BackwardReference reference_forward_with_dropout(const ForwardArgs& args) {
  detail::validate(args);
  return run<double>(args, nullptr, false);
}

BackwardReference naive_forward_with_dropout(const ForwardArgs& args) {
  detail::validate(args);
  return run<float>(args, nullptr, true);
}

}  // namespace tileattn::training
