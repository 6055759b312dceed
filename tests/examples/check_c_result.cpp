// Reads what pkg_config_consumer.c wrote (sizes, Q, K, V and the O the C API
// computed), recomputes O with the C++ API and requires the same bits.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "tileattn/attention.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  int64_t h[7];
  if (!in.read(reinterpret_cast<char*>(h), sizeof h)) {
    std::fprintf(stderr, "%s: cannot read the header\n", argv[1]);
    return 1;
  }
  const int64_t batch = h[0], heads = h[1], kv_heads = h[2], seq_q = h[3], seq_k = h[4], dim = h[5];
  std::vector<float> q(size_t(batch * heads * seq_q * dim)), k(size_t(batch * kv_heads * seq_k * dim)),
      v(k.size()), o_c(q.size()), o_cpp(q.size());
  for (auto* t : {&q, &k, &v, &o_c})
    if (!in.read(reinterpret_cast<char*>(t->data()), std::streamsize(t->size() * sizeof(float)))) {
      std::fprintf(stderr, "%s: truncated\n", argv[1]);
      return 1;
    }
  tileattn::ForwardArgs args;
  args.shape = {batch, heads, kv_heads, seq_q, seq_k, dim};
  args.q = {q.data(), tileattn::dense_strides(tileattn::Layout::bhsd, batch, heads, seq_q, dim)};
  args.k = {k.data(), tileattn::dense_strides(tileattn::Layout::bhsd, batch, kv_heads, seq_k, dim)};
  args.v = {v.data(), args.k.stride};
  args.o = {o_cpp.data(), args.q.stride};
  args.mask.causal = h[6] != 0;
  tileattn::attention_forward(args);
  if (std::memcmp(o_c.data(), o_cpp.data(), o_c.size() * sizeof(float)) != 0) {
    std::fprintf(stderr, "FAILED: O from the C API (via pkg-config) differs from the C++ API\n");
    return 1;
  }
  std::printf("C API via pkg-config == C++ API, bit for bit (%zu values)\n", o_c.size());
  return 0;
}
