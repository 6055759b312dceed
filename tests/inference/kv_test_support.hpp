// Helpers shared by the KV-cache tests: typed buffers, random fills, and the
// comparison with the float64 reference by the project's tolerance rule
// (src/testing/tolerance.hpp, through testing::compare_outputs).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/reference.hpp"

namespace tileattn::kvtest {

// Elements of one dtype, 4-byte aligned.
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, int64_t elements)
      : dtype_(dtype), elements_(elements), storage_(size_t((elements * int64_t(dtype_size(dtype)) + 3) / 4)) {}
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  int64_t elements() const { return elements_; }
  DType dtype() const { return dtype_; }
  float get(int64_t i) const { return detail::load_element(storage_.data(), int(dtype_), i); }
  void set(int64_t i, float value) {
    if (dtype_ == DType::f32) static_cast<float*>(data())[i] = value;
    else if (dtype_ == DType::f16) static_cast<uint16_t*>(data())[i] = detail::float_to_f16(value);
    else static_cast<uint16_t*>(data())[i] = detail::float_to_bf16(value);
  }
  void fill_uniform(std::mt19937_64& rng, float scale = 1.0f) {
    std::uniform_real_distribution<float> u(-scale, scale);
    for (int64_t i = 0; i < elements_; ++i) set(i, u(rng));
  }
  std::vector<uint8_t> bytes() const {
    const auto* p = reinterpret_cast<const uint8_t*>(storage_.data());
    return std::vector<uint8_t>(p, p + elements_ * int64_t(dtype_size(dtype_)));
  }

 private:
  DType dtype_ = DType::f32;
  int64_t elements_ = 0;
  std::vector<float> storage_;
};

inline std::array<int64_t, 4> bhsd(int64_t b, int64_t h, int64_t n, int64_t d) {
  return dense_strides(Layout::bhsd, b, h, n, d);
}

// The comparison with the float64 reference: testing::compare_outputs, the
// one implementation of the rule (src/testing/tolerance.hpp).
using Check = testing::Comparison;

// Compares o ([batch, heads, seqlen_q, value_head_dim] with `o_stride`) and the
// optional dense lse with reference_forward(args), bounded by naive_forward(args).
inline Check check_against_reference(const ForwardArgs& args, const Buffer& o,
                                     const std::array<int64_t, 4>& o_stride, const float* lse) {
  const AttentionShape& s = args.shape;
  const int64_t batches = args.cu_seqlens_q ? 1 : s.batch;
  std::vector<double> got, got_lse;
  const int64_t dv = value_head_dim(s);
  got.reserve(size_t(batches * s.heads * s.seqlen_q * dv));
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        for (int64_t d = 0; d < dv; ++d)
          got.push_back(o.get(b * o_stride[0] + h * o_stride[1] + i * o_stride[2] + d * o_stride[3]));
        if (lse) got_lse.push_back(lse[(b * s.heads + h) * s.seqlen_q + i]);
      }
  return testing::compare_outputs(args, reference_forward(args), naive_forward(args), got, got_lse);
}

}  // namespace tileattn::kvtest
