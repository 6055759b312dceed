// 01: attention forward with the C++ API, checked against the float64 reference.
//
// Grouped-query attention (8 query heads sharing 2 key/value heads), causal
// mask, fp32, Q/K/V in [batch, heads, seq, dim] layout. Build against the
// installed package with find_package(tileattn) and tileattn::tileattn.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "tileattn/attention.hpp"
#include "tileattn/reference.hpp"

int main() {
  const int64_t batch = 2, heads = 8, kv_heads = 2, seq = 200, dim = 64;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto random_tensor = [&](int64_t h) {
    std::vector<float> t(size_t(batch * h * seq * dim));
    for (float& x : t) x = uniform(rng);
    return t;
  };
  std::vector<float> q = random_tensor(heads), k = random_tensor(kv_heads), v = random_tensor(kv_heads);
  std::vector<float> o(q.size()), lse(size_t(batch * heads * seq));

  tileattn::ForwardArgs args;
  args.shape = {batch, heads, kv_heads, seq, seq, dim};
  args.dtype = tileattn::DType::f32;
  // Strides are in elements; dense_strides gives those of a contiguous tensor.
  args.q = {q.data(), tileattn::dense_strides(tileattn::Layout::bhsd, batch, heads, seq, dim)};
  args.k = {k.data(), tileattn::dense_strides(tileattn::Layout::bhsd, batch, kv_heads, seq, dim)};
  args.v = {v.data(), args.k.stride};
  args.o = {o.data(), args.q.stride};
  args.lse = lse.data();
  args.lse_stride = {heads * seq, seq, 1};
  args.mask.causal = true;  // scale stays NaN: 1/sqrt(dim)

  try {
    tileattn::attention_forward(args);
  } catch (const tileattn::Error& e) {  // a bad argument; nothing was written
    std::fprintf(stderr, "attention_forward: %s\n", e.what());
    return 2;
  }

  // Accuracy as the project measures it: the error against float64 may be at
  // most twice that of a naive implementation in the same precision.
  const tileattn::ReferenceOutput exact = tileattn::reference_forward(args);
  const tileattn::ReferenceOutput naive = tileattn::naive_forward(args);
  double error = 0, naive_error = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    error = std::max(error, std::abs(o[i] - exact.o[i]));
    naive_error = std::max(naive_error, std::abs(naive.o[i] - exact.o[i]));
  }
  const double floor = 0.25 * std::ldexp(1.0, -23);  // a quarter of fp32 unit roundoff
  const double tolerance = 2 * naive_error + floor;
  std::printf("O[0,0,0,0:4] = %.6f %.6f %.6f %.6f\n", o[0], o[1], o[2], o[3]);
  std::printf("max |O - O_float64| = %.3g (naive fp32: %.3g, tolerance %.3g)\n", error, naive_error,
              tolerance);
  if (!(error <= tolerance)) {
    std::fprintf(stderr, "FAILED: error above tolerance\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
