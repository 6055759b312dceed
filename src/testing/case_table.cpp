#include "testing/case_table.hpp"

#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>

namespace tileattn::testing {

// Every mask with Nq = Nk, Nq < Nk and Nq > Nk, and windows open on either side.
void add_mask_cases(const std::function<void(Case)>& add) {
  for (MaskCase m : {MaskCase::none, MaskCase::causal, MaskCase::window, MaskCase::boolean,
                     MaskCase::additive, MaskCase::causal_boolean, MaskCase::additive_extreme})
    for (auto [nq, nk] : {std::pair<int64_t, int64_t>{97, 97}, {17, 130}, {130, 17}}) {
      Case c;
      c.seqlen_q = nq;
      c.seqlen_k = nk;
      c.head_dim = 40;
      c.mask = m;
      add(c);
    }
  for (auto [left, right] : {std::pair<int64_t, int64_t>{5, 3}, {-1, 7}, {20, -1}, {0, 0}}) {
    Case c;
    c.seqlen_q = 97;
    c.seqlen_k = 150;
    c.mask = MaskCase::window;
    c.window_left = left;
    c.window_right = right;
    add(c);
  }
}

// Both layouts, contiguous and with a non-contiguous stride.
void add_layout_cases(const std::function<void(Case)>& add) {
  for (Layout layout : {Layout::bhsd, Layout::bshd})
    for (bool strided : {false, true}) {
      Case c;
      c.batch = 2;
      c.heads = 4;
      c.kv_heads = 2;
      c.seqlen_q = 50;
      c.seqlen_k = 77;
      c.layout = layout;
      c.strided = strided;
      c.mask = MaskCase::causal;
      add(c);
    }
}

// Variable-length batches with empty and length-1 sequences.
void add_varlen_cases(const std::function<void(Case)>& add) {
  for (MaskCase m : {MaskCase::none, MaskCase::causal, MaskCase::boolean}) {
    Case c;
    c.varlen = true;
    c.heads = 4;
    c.kv_heads = 2;
    c.varlen_q_lengths = {5, 0, 1, 64, 100, 3};
    c.varlen_k_lengths = {7, 3, 0, 64, 130, 1};
    c.mask = m;
    add(c);
  }
}

// fp16 and bf16 inputs (fp32 accumulation).
void add_half_precision_cases(const std::function<void(Case)>& add) {
  for (DType dt : {DType::f16, DType::bf16})
    for (MaskCase m : {MaskCase::none, MaskCase::causal, MaskCase::additive, MaskCase::additive_extreme}) {
      Case c;
      c.dtype = dt;
      c.batch = 2;
      c.heads = 4;
      c.kv_heads = 2;
      c.seqlen_q = 97;
      c.seqlen_k = 130;
      c.head_dim = 80;
      c.mask = m;
      add(c);
    }
}

// A causal GQA case in fp16 or bf16 (whose products may defer the scale),
// for the score modifiers to be set on.
static Case half_precision_modifier_case(DType dt) {
  Case c;
  c.dtype = dt;
  c.heads = 4;
  c.kv_heads = 2;
  c.seqlen_q = 97;
  c.seqlen_k = 130;
  c.head_dim = 80;
  c.mask = MaskCase::causal;
  return c;
}

// Soft cap c = 5 on scores that exceed it: inputs in [-4, 4] give scaled
// scores of standard deviation ~5 at any head_dim (16 sqrt(D) / 3 / sqrt(D)),
// so a third of them are beyond the cap and a missing or wrong cap shows.
// Fully visible tiles (none), band-partial ones (causal, window), a bias
// added after the cap, GQA, and bf16 (whose products may defer the scale).
void add_softcap_cases(const std::function<void(Case)>& add) {
  for (auto [m, nq, nk] : {std::tuple<MaskCase, int64_t, int64_t>{MaskCase::none, 97, 97},
                           {MaskCase::causal, 97, 130},
                           {MaskCase::causal, 130, 17},
                           {MaskCase::window, 97, 150},
                           {MaskCase::additive, 70, 70},
                           {MaskCase::boolean, 33, 70}}) {
    Case c;
    c.seqlen_q = nq;
    c.seqlen_k = nk;
    c.head_dim = 40;
    c.mask = m;
    c.softcap = 5.0f;
    c.input_scale = 4.0f;
    add(c);
  }
  Case gqa = gqa_case(8, 2);
  gqa.softcap = 5.0f;
  gqa.input_scale = 4.0f;
  add(gqa);
  for (DType dt : {DType::f16, DType::bf16}) {
    Case c = half_precision_modifier_case(dt);
    c.softcap = 5.0f;
    c.input_scale = 4.0f;
    add(c);
  }
}

// The score modifiers' (ALiBi, sinks) shapes: B2, H4 over 2 KV heads, D40,
// and a causal varlen batch with empty sequences both ways.
static Case modifier_case(MaskCase mask, int64_t nq, int64_t nk) {
  Case c;
  c.batch = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.seqlen_q = nq;
  c.seqlen_k = nk;
  c.head_dim = 40;
  c.mask = mask;
  return c;
}

static Case modifier_varlen_case() {
  Case c;
  c.varlen = true;
  c.heads = 4;
  c.kv_heads = 2;
  c.varlen_q_lengths = {5, 0, 1, 64, 100, 3};
  c.varlen_k_lengths = {7, 3, 0, 64, 130, 1};
  c.mask = MaskCase::causal;
  return c;
}

// ALiBi: slopes per head and per (batch, head); unequal lengths (the
// bottom-right offset), fully visible tiles (none), band-partial ones,
// varlen (per-sequence offsets), GQA, bf16 (whose products may defer the
// scale), and together with a soft cap and an additive mask.
void add_alibi_cases(const std::function<void(Case)>& add) {
  for (auto [m, nq, nk, alibi] :
       {std::tuple<MaskCase, int64_t, int64_t, Case::Alibi>{MaskCase::none, 97, 97, Case::Alibi::heads},
        {MaskCase::causal, 97, 130, Case::Alibi::batch_heads},
        {MaskCase::none, 130, 17, Case::Alibi::batch_heads},
        {MaskCase::window, 97, 150, Case::Alibi::heads}}) {
    Case c = modifier_case(m, nq, nk);
    c.alibi = alibi;
    add(c);
  }
  Case varlen = modifier_varlen_case();
  varlen.alibi = Case::Alibi::batch_heads;
  add(varlen);
  Case both;
  both.seqlen_q = 70;
  both.seqlen_k = 90;
  both.head_dim = 40;
  both.mask = MaskCase::additive;
  both.softcap = 5.0f;
  both.input_scale = 4.0f;
  both.alibi = Case::Alibi::heads;
  add(both);
  for (DType dt : {DType::f16, DType::bf16}) {
    Case c = half_precision_modifier_case(dt);
    c.alibi = Case::Alibi::heads;
    add(c);
  }
}

// Attention sinks: unequal lengths both ways (130 x 17 causal: rows that see
// no key get O = 0 and LSE = sink), fully visible and band-partial tiles, a
// window, varlen with empty sequences, GQA and MQA, with a soft cap, ALiBi
// and an additive mask, and fp16/bf16 (whose products may defer the scale).
void add_sink_cases(const std::function<void(Case)>& add) {
  for (auto [m, nq, nk] : {std::tuple<MaskCase, int64_t, int64_t>{MaskCase::none, 97, 97},
                           {MaskCase::causal, 97, 130},
                           {MaskCase::causal, 130, 17},
                           {MaskCase::window, 97, 150}}) {
    Case c = modifier_case(m, nq, nk);
    c.sinks = true;
    add(c);
  }
  Case varlen = modifier_varlen_case();
  varlen.sinks = true;
  add(varlen);
  for (auto [h, kvh] : {std::pair<int64_t, int64_t>{8, 2}, {8, 1}}) {
    Case c = gqa_case(h, kvh);
    c.sinks = true;
    add(c);
  }
  Case all;
  all.seqlen_q = 70;
  all.seqlen_k = 90;
  all.head_dim = 40;
  all.mask = MaskCase::additive;
  all.softcap = 5.0f;
  all.input_scale = 4.0f;
  all.alibi = Case::Alibi::heads;
  all.sinks = true;
  add(all);
  for (DType dt : {DType::f16, DType::bf16}) {
    Case c = half_precision_modifier_case(dt);
    c.sinks = true;
    add(c);
  }
}

void add_head_dim_pair_cases(const std::function<void(Case)>& add) {
  struct Pair {
    int64_t d, dv, heads, kv_heads, nq, nk;
    MaskCase mask;
    DType dtype;
  };
  const Pair pairs[] = {
      {192, 128, 2, 2, 97, 97, MaskCase::none, DType::f32},      // MLA prefill, MHA
      {192, 128, 8, 2, 33, 70, MaskCase::causal, DType::f32},    // GQA, unequal lengths
      {192, 128, 4, 4, 64, 64, MaskCase::causal, DType::bf16},
      {576, 512, 4, 1, 33, 70, MaskCase::causal, DType::f32},    // MLA absorbed, MQA
      {576, 512, 2, 1, 17, 97, MaskCase::none, DType::f16},
      {576, 512, 4, 1, 40, 40, MaskCase::causal, DType::bf16},
      {256, 128, 2, 2, 97, 17, MaskCase::window, DType::f32},
      {64, 32, 8, 2, 33, 70, MaskCase::causal, DType::f32},
      {64, 32, 4, 1, 97, 97, MaskCase::boolean, DType::f16},
      {40, 72, 4, 2, 33, 70, MaskCase::additive, DType::f32},   // V wider than Q/K
  };
  for (const Pair& pair : pairs) {
    Case c;
    c.head_dim = pair.d;
    c.v_head_dim = pair.dv;
    c.heads = pair.heads;
    c.kv_heads = pair.kv_heads;
    c.seqlen_q = pair.nq;
    c.seqlen_k = pair.nk;
    c.mask = pair.mask;
    c.dtype = pair.dtype;
    add(c);
  }
  {
    Case c;  // bshd, strided rows
    c.head_dim = 192;
    c.v_head_dim = 128;
    c.layout = Layout::bshd;
    c.strided = true;
    c.seqlen_q = 17;
    c.seqlen_k = 97;
    c.mask = MaskCase::causal;
    add(c);
  }
  {
    Case c;  // packed sequences
    c.head_dim = 192;
    c.v_head_dim = 128;
    c.varlen = true;
    c.varlen_q_lengths = {5, 0, 40};
    c.varlen_k_lengths = {9, 3, 40};
    c.mask = MaskCase::causal;
    add(c);
  }
  // MLA decode steps: one query per head against a long cache, one KV head.
  // 8 heads stack into the few-rows products, 16 into the packed ones; both
  // split the keys and merge.
  for (auto [heads, dtype] : {std::pair<int64_t, DType>{8, DType::bf16}, {16, DType::f32}}) {
    Case c;
    c.head_dim = 576;
    c.v_head_dim = 512;
    c.heads = heads;
    c.kv_heads = 1;
    c.seqlen_q = 1;
    c.seqlen_k = 1100;
    c.mask = MaskCase::causal;
    c.dtype = dtype;
    add(c);
  }
}

Case head_dim_case(int64_t d, MaskCase m) {
  Case c;
  c.head_dim = d;
  c.seqlen_q = c.seqlen_k = 97;
  c.mask = m;
  return c;
}

Case length_case(int64_t nq, int64_t nk) {
  Case c;
  c.heads = c.kv_heads = 1;
  c.seqlen_q = nq;
  c.seqlen_k = nk;
  c.head_dim = 32;
  c.mask = (nq + nk) % 2 ? MaskCase::causal : MaskCase::none;
  return c;
}

Case gqa_case(int64_t h, int64_t kv_h) {
  Case c;
  c.heads = h;
  c.kv_heads = kv_h;
  c.seqlen_q = 33;
  c.seqlen_k = 70;
  c.mask = MaskCase::causal;
  return c;
}

std::vector<Case> correctness_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  // Head dims, including ones that leave partial SIMD vectors and panels.
  for (int64_t d : {1, 8, 59, 64, 80, 96, 111, 128, 256})
    for (MaskCase m : {MaskCase::none, MaskCase::causal}) add(head_dim_case(d, m));
  // Sequence lengths, equal and unequal both ways.
  for (int64_t nq : {1, 17, 64, 97, 1025})
    for (int64_t nk : {1, 17, 64, 97, 1025}) {
      if (nq == 1025 && nk == 1025) continue;  // covered below, once
      add(length_case(nq, nk));
    }
  {
    Case c;
    c.heads = c.kv_heads = 1;
    c.seqlen_q = c.seqlen_k = 1025;
    c.head_dim = 64;
    c.mask = MaskCase::causal;
    add(c);
  }
  add_mask_cases(add);
  // GQA ratios 1, 4, 8 and MQA.
  for (auto [h, kvh] : {std::pair<int64_t, int64_t>{8, 8}, {8, 2}, {8, 1}, {4, 1}, {12, 3}})
    add(gqa_case(h, kvh));
  add_layout_cases(add);
  add_varlen_cases(add);
  add_half_precision_cases(add);
  {
    Case c;
    c.dtype = DType::bf16;
    c.layout = Layout::bshd;
    c.strided = true;
    c.head_dim = 111;
    c.seqlen_q = 64;
    c.seqlen_k = 1025;
    add(c);
  }
  // Decode shapes: few rows against long key sequences take the split-KV path
  // (stacked GQA heads, partial results merged).
  for (auto [h, kvh, nq, nk, m] : {std::tuple<int64_t, int64_t, int64_t, int64_t, MaskCase>{8, 1, 1, 3000, MaskCase::none},
                                   {4, 2, 3, 2100, MaskCase::causal},
                                   {8, 2, 1, 1500, MaskCase::window},
                                   {2, 2, 5, 1100, MaskCase::boolean},
                                   // rows biased by -1e9, -FLT_MAX and 1e30 in key splits of
                                   // 544 and 496 keys: merged by their key counts
                                   {1, 1, 4, 1040, MaskCase::additive_extreme}}) {
    Case c;
    c.heads = h;
    c.kv_heads = kvh;
    c.seqlen_q = nq;
    c.seqlen_k = nk;
    c.head_dim = 64;
    c.mask = m;
    c.window_left = 700;
    add(c);
  }
  {
    Case c;
    c.dtype = DType::bf16;
    c.heads = 8;
    c.kv_heads = 2;
    c.seqlen_q = 1;
    c.seqlen_k = 2048;
    c.head_dim = 128;
    c.mask = MaskCase::causal;
    add(c);
  }
  add_softcap_cases(add);  // last: the cases above keep their seeds
  {
    // Decode with a soft cap: the few-rows products and the split-KV merge.
    Case c;
    c.heads = 8;
    c.kv_heads = 2;
    c.seqlen_q = 1;
    c.seqlen_k = 1500;
    c.mask = MaskCase::causal;
    c.softcap = 5.0f;
    c.input_scale = 4.0f;
    add(c);
  }
  add_alibi_cases(add);
  {
    // Decode with ALiBi: the few-rows products and the split-KV merge.
    Case c;
    c.heads = 8;
    c.kv_heads = 2;
    c.seqlen_q = 1;
    c.seqlen_k = 1500;
    c.mask = MaskCase::causal;
    c.alibi = Case::Alibi::heads;
    add(c);
  }
  add_sink_cases(add);
  // Decode with sinks: the few-rows products and the split-KV merge, which
  // adds each row's sink once (the splits leave it out); one GQA step, one
  // multi-row windowed step.
  for (auto [h, kvh, nq, m] : {std::tuple<int64_t, int64_t, int64_t, MaskCase>{8, 2, 1, MaskCase::causal},
                               {4, 2, 3, MaskCase::window}}) {
    Case c;
    c.heads = h;
    c.kv_heads = kvh;
    c.seqlen_q = nq;
    c.seqlen_k = 2100;
    c.head_dim = 64;
    c.mask = m;
    c.window_left = 700;
    c.sinks = true;
    add(c);
  }
  add_head_dim_pair_cases(add);
  for (size_t i = 0; i < cases.size(); ++i) cases[i].seed = 1000 + i;
  // TILEATTN_TEST_QUICK=1 (sanitizer runs in CI): drop the cases whose float64
  // reference is expensive; every mask, dtype, layout and path stays covered.
  if (quick_tests()) {
    std::vector<Case> kept;
    for (const Case& c : cases) {
      const int64_t work = c.batch * c.heads * c.seqlen_q * c.seqlen_k * c.head_dim;
      if (c.varlen || work <= 4'000'000) kept.push_back(c);
    }
    cases = kept;
  }
  return cases;
}

bool quick_tests() {
  const char* quick = std::getenv("TILEATTN_TEST_QUICK");
  return quick && std::string(quick) == "1";
}

bool in_quick_share(int64_t index, int64_t path, int64_t paths) {
  return !quick_tests() || index % paths == path;
}

}  // namespace tileattn::testing
