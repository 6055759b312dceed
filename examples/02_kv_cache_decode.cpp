// 02: token-by-token decoding with a paged KV cache (C++ API).
//
// A prompt is prefilled into the cache, then each decode step appends one
// key/value per sequence and attends its query to everything cached -- the
// way an LLM generates text. Keys and queries get rotary embeddings (RoPE,
// NeoX convention) on the fly. At the end the last step is recomputed by
// plain attention over the cached keys and values, in float64, to check it.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "tileattn/kv_cache.hpp"
#include "tileattn/reference.hpp"
#include "tileattn/rope.hpp"

int main() {
  const int64_t batch = 2, heads = 8, kv_heads = 2, dim = 64;
  const int64_t prompt = 20, steps = 12, page_size = 16;
  const int64_t pages_per_seq = (prompt + steps + page_size - 1) / page_size;
  const int64_t num_pages = batch * pages_per_seq;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> t(static_cast<size_t>(n));
    for (float& x : t) x = uniform(rng);
    return t;
  };

  // The cache: pages [num_pages, kv_heads, page_size, dim]; sequence b owns the
  // pages its row of the block table lists (here interleaved between sequences).
  std::vector<float> k_pages(size_t(num_pages * kv_heads * page_size * dim));
  std::vector<float> v_pages(k_pages.size());
  std::vector<int32_t> block_table(size_t(batch * pages_per_seq));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p = 0; p < pages_per_seq; ++p) block_table[size_t(b * pages_per_seq + p)] = int32_t(p * batch + b);
  std::vector<int32_t> cache_seqlens(size_t(batch), 0);
  const tileattn::RopeTables rope = tileattn::rope_tables(10000.0, prompt + steps, dim);

  tileattn::KvCacheArgs args;
  args.batch = batch;
  args.heads = heads;
  args.kv_heads = kv_heads;
  args.head_dim = dim;
  args.k_cache = {k_pages.data(), {kv_heads * page_size * dim, page_size * dim, dim, 1}};
  args.v_cache = {v_pages.data(), args.k_cache.stride};
  args.cache_seqlens = cache_seqlens.data();
  args.block_table = block_table.data();
  args.block_table_stride = pages_per_seq;
  args.page_size = page_size;
  args.num_pages = num_pages;
  args.rotary_cos = rope.cos.data();
  args.rotary_sin = rope.sin.data();
  args.rotary_dim = dim;
  args.rotary_positions = rope.positions;

  // Prefill: append the prompt's keys and values ([batch, kv_heads, prompt, dim]).
  std::vector<float> k_prompt = random(batch * kv_heads * prompt * dim), v_prompt = random(int64_t(k_prompt.size()));
  args.seqlen_new = prompt;
  args.k_new = {k_prompt.data(), {kv_heads * prompt * dim, prompt * dim, dim, 1}};
  args.v_new = {v_prompt.data(), args.k_new.stride};
  tileattn::kv_cache_append(args);

  // Decode: one token per sequence per step.
  std::vector<float> q(size_t(batch * heads * dim)), o(q.size()), k_tok(size_t(batch * kv_heads * dim)),
      v_tok(k_tok.size());
  args.seqlen_q = 1;
  args.seqlen_new = 1;
  args.q = {q.data(), {heads * dim, dim, dim, 1}};
  args.o = {o.data(), args.q.stride};
  args.k_new = {k_tok.data(), {kv_heads * dim, dim, dim, 1}};
  args.v_new = {v_tok.data(), args.k_new.stride};
  for (int64_t step = 0; step < steps; ++step) {
    for (auto* t : {&q, &k_tok, &v_tok})
      for (float& x : *t) x = uniform(rng);  // stand-ins for the model's projections
    tileattn::attention_with_kvcache(args);  // appends, attends, advances cache_seqlens
  }
  std::printf("decoded %lld steps; cache holds %d and %d tokens\n", (long long)steps, cache_seqlens[0],
              cache_seqlens[1]);

  // Check the last step: float64 attention of the (rotated) last query over
  // what the cache now holds. kvcache_forward_args describes exactly that.
  std::vector<float> q_rotated = q;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pos = cache_seqlens[size_t(b)] - 1, half = dim / 2;
    for (int64_t h = 0; h < heads; ++h) {
      float* x = q_rotated.data() + (b * heads + h) * dim;
      for (int64_t i = 0; i < half; ++i) {
        const double c = rope.cos[size_t(pos * half + i)], s = rope.sin[size_t(pos * half + i)];
        const double x0 = x[i], x1 = x[i + half];
        x[i] = float(x0 * c - x1 * s);
        x[i + half] = float(x0 * s + x1 * c);
      }
    }
  }
  tileattn::KvCacheArgs check = args;
  check.q.data = q_rotated.data();
  check.rotary_cos = check.rotary_sin = nullptr;
  check.rotary_dim = check.rotary_positions = 0;
  const tileattn::ForwardArgs last = tileattn::kvcache_forward_args(check, cache_seqlens.data());
  const tileattn::ReferenceOutput exact = tileattn::reference_forward(last);
  const tileattn::ReferenceOutput naive = tileattn::naive_forward(last);
  double error = 0, naive_error = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    error = std::max(error, std::abs(o[i] - exact.o[i]));
    naive_error = std::max(naive_error, std::abs(naive.o[i] - exact.o[i]));
  }
  // The library also rotates in float64 and rounds once, so the rotated
  // queries match and the usual rule applies.
  const double tolerance = 2 * naive_error + 0.25 * std::ldexp(1.0, -23);
  std::printf("last step: max |O - O_float64| = %.3g (naive fp32: %.3g, tolerance %.3g)\n", error,
              naive_error, tolerance);
  if (!(error <= tolerance)) {
    std::fprintf(stderr, "FAILED: error above tolerance\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
