// Helpers shared by the KV-cache tests: typed buffers, random fills, and the
// tolerance rule (float64 reference; bound = 2 x the naive same-precision
// error + a floor, see src/testing/problem_case.cpp).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
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

// Result of comparing an output with the float64 reference.
struct Check {
  double max_error = 0, naive_error = 0, tolerance = 0;
  double lse_error = 0, lse_tolerance = 0;
  bool mismatch = false;  // NaN / inf where the reference has none, or the reverse
  bool ok() const { return !mismatch && max_error <= tolerance && lse_error <= lse_tolerance; }
  std::string describe() const {
    std::ostringstream s;
    s << "max_error " << max_error << " (tolerance " << tolerance << " = 2 x naive " << naive_error
      << " + floor), lse_error " << lse_error << " (tolerance " << lse_tolerance << ")"
      << (mismatch ? ", NaN/inf mismatch" : "");
    return s.str();
  }
};

// Compares o ([batch, heads, seqlen_q, head_dim] with `o_stride`) and the
// optional dense lse with reference_forward(args), bounded by naive_forward(args).
inline Check check_against_reference(const ForwardArgs& args, const Buffer& o,
                                     const std::array<int64_t, 4>& o_stride, const float* lse) {
  const ReferenceOutput ref = reference_forward(args);
  const ReferenceOutput naive = naive_forward(args);
  const AttentionShape& s = args.shape;
  Check c;
  double naive_lse = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const size_t row = size_t((b * s.heads + h) * s.seqlen_q + i);
        for (int64_t d = 0; d < s.head_dim; ++d) {
          const double expected = ref.o[row * size_t(s.head_dim) + size_t(d)];
          const double got = o.get(b * o_stride[0] + h * o_stride[1] + i * o_stride[2] + d * o_stride[3]);
          if (std::isnan(expected) != std::isnan(got)) c.mismatch = true;
          if (std::isnan(expected)) continue;
          c.max_error = std::max(c.max_error, std::abs(got - expected));
          c.naive_error = std::max(c.naive_error, std::abs(naive.o[row * size_t(s.head_dim) + size_t(d)] - expected));
        }
        if (!lse) continue;
        const double expected = ref.lse[row], got = lse[row];
        if (std::isinf(expected) || std::isinf(got)) {
          if (expected != got) c.mismatch = true;
          continue;
        }
        c.lse_error = std::max(c.lse_error, std::abs(got - expected));
        naive_lse = std::max(naive_lse, std::abs(naive.lse[row] - expected));
      }
  c.tolerance = 2 * c.naive_error + testing::tolerance_floor(args.dtype);
  c.lse_tolerance = 2 * naive_lse + 4 * std::ldexp(1.0, -23);
  return c;
}

}  // namespace tileattn::kvtest
