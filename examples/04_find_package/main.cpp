// 04: the installed package from another project: the C++ and the C API on
// the same inputs must give the same bits.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "tileattn/attention.hpp"
#include "tileattn/tileattn.h"

int main() {
  const int64_t batch = 1, heads = 4, kv_heads = 1, seq = 65, dim = 80;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> q(size_t(batch * heads * seq * dim)), k(size_t(batch * kv_heads * seq * dim)),
      v(k.size()), o_cpp(q.size()), o_c(q.size());
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = uniform(rng);

  tileattn::ForwardArgs args;
  args.shape = {batch, heads, kv_heads, seq, seq, dim};
  args.q = {q.data(), tileattn::dense_strides(tileattn::Layout::bhsd, batch, heads, seq, dim)};
  args.k = {k.data(), tileattn::dense_strides(tileattn::Layout::bhsd, batch, kv_heads, seq, dim)};
  args.v = {v.data(), args.k.stride};
  args.o = {o_cpp.data(), args.q.stride};
  args.mask.window_left = 16;  // sliding window of 16 keys back, causal
  args.mask.window_right = 0;
  tileattn::attention_forward(args);

  tileattn_forward_args c;
  tileattn_forward_args_init(&c);
  c.batch = batch;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.seqlen_q = c.seqlen_k = seq;
  c.head_dim = dim;
  c.q = {q.data(), {args.q.stride[0], args.q.stride[1], args.q.stride[2], args.q.stride[3]}};
  c.k = {k.data(), {args.k.stride[0], args.k.stride[1], args.k.stride[2], args.k.stride[3]}};
  c.v = {v.data(), {args.k.stride[0], args.k.stride[1], args.k.stride[2], args.k.stride[3]}};
  c.o = {o_c.data(), {args.q.stride[0], args.q.stride[1], args.q.stride[2], args.q.stride[3]}};
  c.window_left = 16;
  c.window_right = 0;
  if (tileattn_forward(&c) != TILEATTN_OK) {
    std::fprintf(stderr, "tileattn_forward: %s\n", tileattn_last_error());
    return 1;
  }
  if (std::memcmp(o_cpp.data(), o_c.data(), o_c.size() * sizeof(float)) != 0) {
    std::fprintf(stderr, "FAILED: the C and C++ APIs disagree\n");
    return 1;
  }
  std::printf("tileattn %s: C and C++ APIs agree bit for bit; O[0] = %.6f\n", tileattn_version_string(),
              o_c[0]);
  return 0;
}
