// Wall-clock timing with steady_clock, medians, peak RSS, and random inputs
// for the benchmarks.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "cli/tensor_files.hpp"
#include "core/half.hpp"

namespace tileattn::cli {

template <class Fn>
double time_ms(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Largest resident set of this process so far, MiB.
inline double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// `elements` values uniform in [-1, 1) in `dtype` storage (splitmix64: fast
// enough for the 16M-element inputs of long-sequence benchmarks).
inline TypedBuffer random_buffer(DType dtype, int64_t elements, uint64_t seed) {
  TypedBuffer b = zeros(dtype, elements);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < elements; ++i) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float x = float(z >> 40) * (1.0f / 8388608.0f) - 1.0f;  // 24 bits -> [-1, 1)
    if (dtype == DType::f32) b.f32[size_t(i)] = x;
    else if (dtype == DType::f16) b.bits16[size_t(i)] = detail::float_to_f16(x);
    else b.bits16[size_t(i)] = detail::float_to_bf16(x);
  }
  return b;
}

// Widens a buffer to fp32 (exact for fp16 and bf16).
inline std::vector<float> to_f32(const TypedBuffer& b) {
  if (b.dtype == DType::f32) return b.f32;
  std::vector<float> out(b.bits16.size());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = b.dtype == DType::f16 ? detail::f16_to_float(b.bits16[i]) : detail::bf16_to_float(b.bits16[i]);
  return out;
}

}  // namespace tileattn::cli
