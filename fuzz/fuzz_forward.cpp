// Fuzzes attention_forward: bytes become a ForwardArgs with small sizes and
// arbitrary strides (negative, zero, overlapping), flags, masks, variable-
// length batches, KV seqlens and paged block tables, over buffers this
// harness owns, each sized to exactly the bytes its view may touch (so ASan
// sees any access outside a view).
//
// Properties checked, beyond "no sanitizer finding":
//  - the call either succeeds or throws tileattn::Error / NotSupported;
//  - on a throw, no output byte changed (o, lse);
//  - on success, no byte of o or lse outside its view changed, and no input changed;
//  - a view whose byte extent overflows int64 is always refused;
//  - an output that aliases q is refused, or nothing was written.
#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "fuzz_views.hpp"
#include "tileattn/attention.hpp"

namespace {

using tileattn::DType;
using tileattn::ForwardArgs;
using tileattn::MaskSpec;
using namespace fuzzviews;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_forward: property violated: %s\n", what);
  std::abort();
}

std::vector<int32_t> make_cu_seqlens(FuzzedDataProvider& in, int64_t batch) {
  std::vector<int32_t> cu(size_t(batch + 1), 0);
  for (int64_t b = 0; b < batch; ++b) cu[size_t(b + 1)] = cu[size_t(b)] + in.ConsumeIntegralInRange<int32_t>(0, 9);
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0)  // a corrupt entry
    cu[in.ConsumeIntegralInRange<size_t>(0, cu.size() - 1)] = in.ConsumeIntegral<int32_t>();
  return cu;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  ForwardArgs a;
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  a.dtype = dtypes[in.ConsumeIntegralInRange<int>(0, 2)];
  const int64_t esize = int64_t(tileattn::dtype_size(a.dtype));
  auto& s = a.shape;
  s.batch = in.ConsumeIntegralInRange<int64_t>(-1, 3);
  s.kv_heads = in.ConsumeIntegralInRange<int64_t>(0, 3);
  s.heads = in.ConsumeBool() ? s.kv_heads * in.ConsumeIntegralInRange<int64_t>(1, 3)
                             : in.ConsumeIntegralInRange<int64_t>(-1, 6);
  s.seqlen_q = in.ConsumeIntegralInRange<int64_t>(-1, 20);
  s.seqlen_k = in.ConsumeIntegralInRange<int64_t>(-1, 40);
  const int64_t dims[] = {1, 3, 16, 17, 33, 64, 80, 96, 128, 256, 0, 257, 576, 577};
  s.head_dim = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 48) : dims[in.ConsumeIntegralInRange<int>(0, 13)];
  // V's head dim: mostly Q/K's (0), else its own, in range or not.
  const int64_t v_dims[] = {0, 0, 0, 0, 1, 17, 128, 512, 513, -1};
  s.v_head_dim = v_dims[in.ConsumeIntegralInRange<int>(0, 9)];
  const int64_t v_dim = s.v_head_dim != 0 ? s.v_head_dim : s.head_dim;  // V's and O's

  // Variable-length batches, KV seqlens, pages.
  const int source = in.ConsumeIntegralInRange<int>(0, 4);  // 0 dense, 1 varlen, 2 kv seqlens, 3 paged, 4 varlen q + kv seqlens
  const int64_t batch = s.batch > 0 ? s.batch : 0;
  std::vector<int32_t> cu_q, cu_k, kv_seqlens, block_table;
  if (source == 1 || source == 4) {
    cu_q = make_cu_seqlens(in, batch);
    a.cu_seqlens_q = cu_q.data();
    s.seqlen_q = cu_q.back() + in.ConsumeIntegralInRange<int64_t>(-1, 3);
  }
  if (source == 1) {
    cu_k = make_cu_seqlens(in, batch);
    a.cu_seqlens_k = cu_k.data();
    s.seqlen_k = cu_k.back() + in.ConsumeIntegralInRange<int64_t>(-1, 3);
  }
  if (source >= 2) {
    for (int64_t b = 0; b < batch; ++b) kv_seqlens.push_back(in.ConsumeIntegralInRange<int32_t>(-1, 41));
    a.kv.seqlens = kv_seqlens.data();
  }
  if (source == 3) {
    a.kv.page_size = in.ConsumeIntegralInRange<int64_t>(0, 8);
    a.kv.num_pages = in.ConsumeIntegralInRange<int64_t>(-1, 12);
    a.kv.block_table_stride = in.ConsumeIntegralInRange<int64_t>(-1, 8);
    const int64_t entries = batch * (a.kv.block_table_stride > 0 ? a.kv.block_table_stride : 0);
    for (int64_t i = 0; i < entries; ++i) block_table.push_back(in.ConsumeIntegralInRange<int32_t>(-1, 12));
    block_table.push_back(0);  // never an empty vector: the pointer must be non-null
    a.kv.block_table = block_table.data();
  }

  // Largest per-sequence lengths, as the mask's extent needs them (valid inputs only).
  int64_t max_nq = s.seqlen_q, max_nk = s.seqlen_k;
  if (!cu_q.empty()) {
    max_nq = 0;
    for (int64_t b = 0; b < batch; ++b) max_nq = std::max<int64_t>(max_nq, int64_t(cu_q[size_t(b + 1)]) - cu_q[size_t(b)]);
  }
  if (!cu_k.empty()) {
    max_nk = 0;
    for (int64_t b = 0; b < batch; ++b) max_nk = std::max<int64_t>(max_nk, int64_t(cu_k[size_t(b + 1)]) - cu_k[size_t(b)]);
  }
  if (!kv_seqlens.empty()) {
    max_nk = 0;
    for (int32_t n : kv_seqlens) max_nk = std::max<int64_t>(max_nk, n);
  }

  const int64_t q_sizes[4] = {cu_q.empty() ? s.batch : 1, s.heads, s.seqlen_q, s.head_dim};
  const int64_t o_sizes[4] = {q_sizes[0], s.heads, s.seqlen_q, v_dim};
  int64_t k_sizes[4] = {cu_k.empty() ? s.batch : 1, s.kv_heads, s.seqlen_k, s.head_dim};
  if (source == 3) {
    k_sizes[0] = a.kv.num_pages;
    k_sizes[2] = a.kv.page_size;
  }
  const int64_t v_sizes[4] = {k_sizes[0], k_sizes[1], k_sizes[2], v_dim};
  a.q.stride = pick_strides(in, q_sizes);
  a.k.stride = pick_strides(in, k_sizes);
  a.v.stride = in.ConsumeBool() ? a.k.stride : pick_strides(in, v_sizes);
  a.o.stride = in.ConsumeBool() ? a.q.stride : pick_strides(in, o_sizes);
  ViewBuffer q = make_view_buffer(q_sizes, a.q.stride.data(), 4, esize);
  ViewBuffer k = make_view_buffer(k_sizes, a.k.stride.data(), 4, esize);
  ViewBuffer v = make_view_buffer(v_sizes, a.v.stride.data(), 4, esize);
  ViewBuffer o = make_view_buffer(o_sizes, a.o.stride.data(), 4, esize);

  ViewBuffer lse;
  const int64_t l_sizes[3] = {q_sizes[0], s.heads, s.seqlen_q};
  if (in.ConsumeBool()) {
    if (in.ConsumeBool()) {
      a.lse_stride = {s.heads * s.seqlen_q, s.seqlen_q, 1};
    } else {
      for (auto& x : a.lse_stride) x = in.ConsumeIntegralInRange<int64_t>(-40, 40);
    }
    lse = make_view_buffer(l_sizes, a.lse_stride.data(), 3, 4);
  }

  // Masks.
  ViewBuffer mask;
  const int mask_kind = in.ConsumeIntegralInRange<int>(0, 4);
  a.mask.causal = in.ConsumeBool();
  const int64_t windows[] = {-2, -1, 0, 1, 3, 17, int64_t{1} << 40, std::numeric_limits<int64_t>::max()};
  a.mask.window_left = windows[in.ConsumeIntegralInRange<int>(0, 7)];
  a.mask.window_right = windows[in.ConsumeIntegralInRange<int>(0, 7)];
  const int64_t m_sizes[4] = {s.batch, s.heads, max_nq, max_nk};
  if (mask_kind == 1 || mask_kind == 2 || mask_kind == 3) {
    a.mask.kind = mask_kind == 1 ? MaskSpec::Kind::boolean : MaskSpec::Kind::additive;
    if (mask_kind == 3) a.mask.kind = static_cast<MaskSpec::Kind>(in.ConsumeIntegralInRange<int>(3, 9));
    for (size_t i = 0; i < 4; ++i) {
      const int mode = in.ConsumeIntegralInRange<int>(0, 2);
      int64_t dense = 1;
      for (size_t j = i + 1; j < 4; ++j)  // corrupt cu_seqlens may make sizes huge
        if (__builtin_mul_overflow(dense, std::max<int64_t>(1, m_sizes[j]), &dense)) dense = 1;
      a.mask.stride[i] = mode == 0 ? 0 : mode == 1 ? dense : in.ConsumeIntegralInRange<int64_t>(-30, 30);
    }
    const int64_t mask_esize = a.mask.kind == MaskSpec::Kind::boolean ? 1 : 4;
    mask = make_view_buffer(m_sizes, a.mask.stride.data(), 4, mask_esize);
  }

  const float scales[] = {std::numeric_limits<float>::quiet_NaN(), 0.125f, 1.0f, 0.0f, -2.0f, 1e20f,
                          std::numeric_limits<float>::infinity(), 1e-30f};
  a.scale = scales[in.ConsumeIntegralInRange<int>(0, 7)];
  const float dropouts[] = {0.0f, 0.0f, 0.25f, 0.999f, 1.0f, -0.5f, std::numeric_limits<float>::quiet_NaN()};
  a.dropout_p = dropouts[in.ConsumeIntegralInRange<int>(0, 6)];
  a.seed = in.ConsumeIntegral<uint64_t>();
  a.threads = in.ConsumeIntegralInRange<int>(-1, 3);
  const tileattn::Isa isas[] = {tileattn::Isa::automatic, tileattn::Isa::generic, tileattn::Isa::avx2,
                                tileattn::Isa::avx512, tileattn::Isa::reference};
  a.isa = isas[in.ConsumeIntegralInRange<int>(0, 4)];
  const int blocks[] = {0, 0, 0, 1, 3, 16, 33, 64, -1, 2000};
  a.block_q = blocks[in.ConsumeIntegralInRange<int>(0, 9)];
  a.block_kv = blocks[in.ConsumeIntegralInRange<int>(0, 9)];

  const bool alias_o_to_q = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  fill_values(in, q, a.dtype);
  fill_values(in, k, a.dtype);
  fill_values(in, v, a.dtype);
  if (mask.bytes.size()) {
    if (a.mask.kind == MaskSpec::Kind::boolean) {
      for (auto& byte : mask.bytes) byte = in.ConsumeIntegralInRange<unsigned char>(0, 2);
    } else {
      fill_values(in, mask, DType::f32);
    }
  }
  // Later additions read what the input has left (so the corpus files
  // written before them keep every earlier choice): the bf16
  // rungs (a CPU without one refuses it: NotSupported) and bf16_probabilities.
  if (in.ConsumeIntegralInRange<int>(0, 3) == 1)
    a.isa = in.ConsumeBool() ? tileattn::Isa::avx512bf16 : tileattn::Isa::amx;
  a.bf16_probabilities = in.ConsumeBool();

  a.q.data = q.data();
  a.k.data = k.data();
  a.v.data = v.data();
  a.o.data = alias_o_to_q ? q.data() : o.data();
  a.lse = lse.bytes.empty() ? nullptr : reinterpret_cast<float*>(lse.data());
  a.mask.data = mask.data();

  const bool overflow = q.overflow || k.overflow || v.overflow || o.overflow || lse.overflow ||
                        mask.overflow;
  const bool unallocated = q.too_large || k.too_large || v.too_large || o.too_large ||
                           lse.too_large || mask.too_large;
  if (unallocated && !overflow) {
    // A caller with that much memory would be fine; here only validation runs
    // (it reads cu_seqlens, seqlens and the block table, never the tensors).
    try {
      tileattn::validate(a);
    } catch (const tileattn::Error&) {
    }
    return 0;
  }

  const std::vector<unsigned char> q_before = q.bytes, k_before = k.bytes, v_before = v.bytes,
                                   mask_before = mask.bytes;
  bool threw = false;
  try {
    tileattn::attention_forward(a);
  } catch (const tileattn::Error&) {
    threw = true;
  } catch (const tileattn::NotSupported&) {
    threw = true;
  }
  // Overflowing views with no work (nothing to touch) may pass: only then.
  if ((q.overflow || o.overflow) && !threw && s.batch > 0 && max_nq > 0)
    fail("an overflowing q or o view was accepted");
  if (k.bytes != k_before || v.bytes != v_before || mask.bytes != mask_before) fail("an input was written");
  if (alias_o_to_q) {
    if (!threw && q.bytes != q_before) fail("o aliasing q was accepted and written");
    return 0;
  }
  if (q.bytes != q_before) fail("q was written");
  if (threw) {
    for (unsigned char b : o.bytes)
      if (b != kSentinel) fail("o written although the call threw");
    for (unsigned char b : lse.bytes)
      if (b != kSentinel) fail("lse written although the call threw");
    return 0;
  }
  // Success: nothing outside the views was written.
  if (!o.bytes.empty() && !o.overflow) {
    std::vector<unsigned char> inside(o.bytes.size(), 0);
    if (o_sizes[0] > 0 && o_sizes[1] > 0 && o_sizes[2] > 0 && o_sizes[3] > 0)
      mark_view(inside, o.origin, o_sizes, a.o.stride.data(), 4, esize);
    for (size_t i = 0; i < o.bytes.size(); ++i)
      if (!inside[i] && o.bytes[i] != kSentinel) fail("o written outside its view");
  }
  if (!lse.bytes.empty() && !lse.overflow) {
    std::vector<unsigned char> inside(lse.bytes.size(), 0);
    if (l_sizes[0] > 0 && l_sizes[1] > 0 && l_sizes[2] > 0)
      mark_view(inside, lse.origin, l_sizes, a.lse_stride.data(), 3, 4);
    for (size_t i = 0; i < lse.bytes.size(); ++i)
      if (!inside[i] && lse.bytes[i] != kSentinel) fail("lse written outside its view");
  }
  return 0;
}
