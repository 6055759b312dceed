// attention_probabilities: the P (after dropout) that the forward multiplies V
// with, for small shapes and debugging. Each row's softmax is computed here
// in float64 from the same inputs and mask, times the dropout factor of the
// same generator the main loops use, so the mask matches what the forward and
// the backward saw.
#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/dropout.hpp"
#include "core/half.hpp"
#include "core/problem.hpp"
#include "core/validate.hpp"
#include "tileattn/backward.hpp"

namespace tileattn {

void attention_probabilities(const ForwardArgs& args, float* probs,
                             const std::array<int64_t, 4>& stride) {
  const AttentionShape& s = args.shape;
  // The size guard comes first (for varlen, again once the lengths are known).
  auto guarded_elements = [&](int64_t max_nq, int64_t max_nk) {
    const int64_t sizes[4] = {s.batch, s.heads, max_nq, max_nk};
    int64_t elements = 1;
    for (int64_t size : sizes)
      if (__builtin_mul_overflow(elements, size, &elements) || elements > kMaxProbabilityElements)
        throw Error("probs: batch x heads x seqlen_q x seqlen_k exceeds " +
                    std::to_string(kMaxProbabilityElements) +
                    " entries; attention_probabilities is for small shapes");
    return elements;
  };
  if (!args.cu_seqlens_q && !args.cu_seqlens_k) guarded_elements(s.seqlen_q, s.seqlen_k);
  detail::validate(args);
  if (args.kv.seqlens || args.kv.block_table)
    throw NotSupported("attention_probabilities: KV-cache sources are not supported");
  auto longest = [&](const int32_t* cu, int64_t rows) {
    if (!cu) return rows;
    int64_t m = 0;
    for (int64_t b = 0; b < s.batch; ++b) m = std::max<int64_t>(m, cu[b + 1] - cu[b]);
    return m;
  };
  const int64_t max_nq = longest(args.cu_seqlens_q, s.seqlen_q);
  const int64_t max_nk = longest(args.cu_seqlens_k, s.seqlen_k);
  const int64_t sizes[4] = {s.batch, s.heads, max_nq, max_nk};
  const int64_t elements = guarded_elements(max_nq, max_nk);
  if (elements == 0) return;
  if (!probs) throw Error("probs: data is null");
  detail::check_injective("probs", sizes, stride.data(), 4);
  const detail::ViewSpan out = detail::view_range("probs", probs, 4, sizes, stride.data(), 4);
  const int64_t q_batches = args.cu_seqlens_q ? 1 : s.batch;
  const int64_t esize = int64_t(dtype_size(args.dtype));
  const int64_t q_sizes[4] = {q_batches, s.heads, s.seqlen_q, s.head_dim};
  const int64_t k_sizes[4] = {args.cu_seqlens_k ? 1 : s.batch, s.kv_heads, s.seqlen_k, s.head_dim};
  // V's rows are its own head dim wide (MLA: 512 where K's are 576).
  const int64_t v_sizes[4] = {k_sizes[0], k_sizes[1], k_sizes[2], value_head_dim(s)};
  for (const auto& [name, range] :
       {std::pair{"q", detail::view_range("q", args.q.data, esize, q_sizes, args.q.stride.data(), 4)},
        std::pair{"k", detail::view_range("k", args.k.data, esize, k_sizes, args.k.stride.data(), 4)},
        std::pair{"v", detail::view_range("v", args.v.data, esize, v_sizes, args.v.stride.data(), 4)}})
    if (detail::views_overlap(out, range)) throw Error(std::string("probs: output overlaps input ") + name);

  const detail::Problem p = detail::describe(args);
  const detail::DropoutSpec dropout = detail::make_dropout(args.dropout_p, args.seed);
  const double scale = std::isnan(args.scale) ? 1.0 / std::sqrt(double(s.head_dim)) : double(args.scale);
  std::vector<double> scores;
  const int dt = int(args.dtype);
  for (int64_t b = 0; b < s.batch; ++b) {
    const detail::Sequence seq = detail::sequence_of(p, b);
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kvh = h / p.group;
      for (int64_t i = 0; i < max_nq; ++i) {
        float* out_row = probs + b * stride[0] + h * stride[1] + i * stride[2];
        for (int64_t j = 0; j < max_nk; ++j) out_row[j * stride[3]] = 0.0f;
        if (i >= seq.nq) continue;
        const int64_t row = seq.q_row0 + i;
        const int64_t q_off = seq.q_batch * args.q.stride[0] + h * args.q.stride[1] + row * args.q.stride[2];
        // Scores of the visible keys (float64), then exp(score - LSE) x dropout.
        const detail::KeyRange keys = detail::visible_keys(p.band, seq, i, i + 1);
        scores.assign(size_t(max_nk), -std::numeric_limits<double>::infinity());
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.first; j < keys.last; ++j) {
          double bias = 0.0;
          if (args.mask.kind != MaskSpec::Kind::none) {
            const auto& ms = args.mask.stride;
            const int64_t m_off = b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3];
            if (args.mask.kind == MaskSpec::Kind::boolean) {
              if (!static_cast<const uint8_t*>(args.mask.data)[m_off]) continue;
            } else {
              bias = static_cast<const float*>(args.mask.data)[m_off];
            }
          }
          const int64_t k_off = seq.k_batch * args.k.stride[0] + kvh * args.k.stride[1] +
                                (seq.k_row0 + j) * args.k.stride[2];
          double dot = 0.0;
          for (int64_t c = 0; c < s.head_dim; ++c)
            dot += double(detail::load_element(args.q.data, dt, q_off + c * args.q.stride[3])) *
                   detail::load_element(args.k.data, dt, k_off + c * args.k.stride[3]);
          // The forward's score modifiers in its order: soft cap, ALiBi, then the mask.
          double score = dot * scale;
          if (args.softcap > 0.0f) score = double(args.softcap) * std::tanh(score / double(args.softcap));
          if (args.alibi_slopes) {
            const double slope = args.alibi_slopes[b * args.alibi_batch_stride + h];
            score -= slope * double(std::llabs(i + seq.offset - j));
          }
          scores[size_t(j)] = score + bias;
          if (!(scores[size_t(j)] <= max_score)) max_score = scores[size_t(j)];  // NaN propagates
        }
        if (max_score == -std::numeric_limits<double>::infinity()) continue;  // no visible key
        // A sink (ForwardArgs::sinks) joins the denominator; it has no column.
        const double sink = args.sinks ? double(args.sinks[h]) : -std::numeric_limits<double>::infinity();
        if (sink > max_score) max_score = sink;
        double sum = args.sinks ? std::exp(sink - max_score) : 0.0;
        for (int64_t j = keys.first; j < keys.last; ++j) sum += std::exp(scores[size_t(j)] - max_score);
        for (int64_t j = keys.first; j < keys.last; ++j) {
          double prob = std::exp(scores[size_t(j)] - max_score) / sum;
          if (dropout.active) prob *= detail::dropout_factor(dropout, b, h, i, j);
          out_row[j * stride[3]] = float(prob);
        }
      }
    }
  }
}

}  // namespace tileattn
