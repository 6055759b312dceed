// The few-rows tile products (src/isa/*/few_rows_kernels.hpp): a work item
// that stacks at most 8 query rows (GQA group x new tokens) reads K/V rows in
// place instead of packing them. Its edges: every stacked row count 1..8 and
// the first count past the limit (9, packed path), head dims that are not a
// multiple of 8 or 16, partial key tiles (lengths not a multiple of the key
// tile, tiles of fewer than 8 keys), page size 1 and odd page sizes, split-KV
// lengths, element-strided K/V, and each ISA path.
#include <gtest/gtest.h>

#include "decode_fixture.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::kvtest {
namespace {

// One decode step checked against the float64 reference over the whole
// sequence (tolerance rule), and, for a paged spec, bitwise against the same
// step on a contiguous cache.
void expect_step_correct(DecodeSpec spec) {
  SCOPED_TRACE(spec.name());
  DecodeRun run(spec);
  run.prefill();
  run.decode();
  Buffer unused;
  std::vector<int32_t> lengths;
  const ForwardArgs full = run.full_sequence_args(unused, lengths);
  const Check c = check_against_reference(
      full, run.o, bhsd(run.batch, spec.heads, spec.new_tokens, spec.head_dim), run.lse.data());
  EXPECT_TRUE(c.ok()) << c.describe();
  if (spec.page_size == 0) return;
  spec.page_size = 0;
  DecodeRun contiguous(spec);
  contiguous.prefill();
  contiguous.decode();
  EXPECT_EQ(run.o.bytes(), contiguous.o.bytes()) << "paged output differs from contiguous";
  EXPECT_EQ(run.lse, contiguous.lse);
}

std::vector<Isa> isa_paths() {
  std::vector<Isa> paths;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    if (isa_available(isa)) paths.push_back(isa);
  return paths;
}

// Stacked rows = (heads / kv_heads) x new tokens.
struct Stack {
  int64_t group, new_tokens;
};

TEST(FewRows, EveryStackedRowCountAndHeadDim) {
  const Stack stacks[] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1},
                          {7, 1}, {8, 1}, {2, 3}, {4, 2}, {1, 7}, {3, 3}};
  for (Isa isa : isa_paths())
    for (const Stack& st : stacks)
      for (int64_t head_dim : {1, 7, 8, 9, 20, 36, 128}) {
        DecodeSpec spec;
        spec.isa = isa;
        spec.kv_heads = 2;
        spec.heads = 2 * st.group;
        spec.new_tokens = st.new_tokens;
        spec.head_dim = head_dim;
        spec.cached = {100};  // 100 + new keys: one full 64-key tile and a partial one
        spec.seed = uint64_t(st.group * 100 + st.new_tokens * 10 + head_dim);
        expect_step_correct(spec);
      }
}

TEST(FewRows, PartialTilesAndShortSequences) {
  for (Isa isa : isa_paths())
    for (int32_t cached : {0, 1, 6, 7, 62, 63, 64, 65, 127}) {
      DecodeSpec spec;
      spec.isa = isa;
      spec.heads = 8;
      spec.kv_heads = 2;
      spec.head_dim = 24;
      spec.cached = {cached, 3};
      spec.seed = uint64_t(cached + 1);
      expect_step_correct(spec);
    }
}

TEST(FewRows, HalfPrecisionCachesWithOddHeadDims) {
  for (Isa isa : isa_paths())
    for (DType dtype : {DType::f16, DType::bf16})
      for (int64_t head_dim : {5, 16, 40, 130}) {
        DecodeSpec spec;
        spec.isa = isa;
        spec.dtype = dtype;
        spec.heads = 8;
        spec.kv_heads = 2;
        spec.head_dim = head_dim;
        spec.cached = {77};
        spec.new_tokens = 2;
        expect_step_correct(spec);
      }
}

// Head dims around the AVX-512 products' blocks (32-element chunks, then
// 16-element blocks, then one masked block) and their column passes (16 / M
// vectors per row), every stacked row count, every dtype; the other ISAs run
// the same cases.
TEST(FewRows, HeadDimsAroundSixteenLaneBlocks) {
  for (Isa isa : isa_paths())
    for (DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (int64_t group : {1, 2, 3, 4, 5, 8})
        for (int64_t head_dim : {15, 17, 31, 33, 48, 64, 80, 96, 112, 144, 200, 256}) {
          DecodeSpec spec;
          spec.isa = isa;
          spec.dtype = dtype;
          spec.heads = 2 * group;
          spec.kv_heads = 2;
          spec.head_dim = head_dim;
          spec.cached = {45};  // 45 + 1 keys: a full 32-key tile and a partial one
          spec.seed = uint64_t(group * 1000 + head_dim);
          expect_step_correct(spec);
        }
}

TEST(FewRows, PageSizeOneAndOddPagesEqualContiguous) {
  for (Isa isa : isa_paths())
    for (int64_t page_size : {1, 3, 16})
      for (int64_t group : {1, 4, 8}) {
        DecodeSpec spec;
        spec.isa = isa;
        spec.page_size = page_size;
        spec.heads = 2 * group;
        spec.kv_heads = 2;
        spec.head_dim = 20;
        spec.dtype = DType::bf16;
        spec.cached = {70, 9};
        spec.seed = uint64_t(page_size * 10 + group);
        expect_step_correct(spec);
      }
}

TEST(FewRows, SplitKeysWindowsAndNoMask) {
  for (Isa isa : isa_paths()) {
    DecodeSpec spec;
    spec.isa = isa;
    spec.heads = 8;
    spec.kv_heads = 2;
    spec.head_dim = 24;
    spec.cached = {1100};  // long enough for split-KV
    expect_step_correct(spec);
    spec.cached = {300};
    spec.window_left = 40;
    spec.new_tokens = 2;
    expect_step_correct(spec);
    spec.window_left = -1;
    spec.causal = false;
    expect_step_correct(spec);
  }
}

// K and V interleaved element by element in one buffer (element stride 2):
// the few-rows products' strided branch.
TEST(FewRows, ElementStridedKeysAndValues) {
  for (Isa isa : isa_paths())
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + dtype_name(dtype));
      const int64_t heads = 4, kv_heads = 1, nk = 90, d = 12;
      std::mt19937_64 rng(7);
      Buffer q(dtype, heads * d), kv(dtype, kv_heads * nk * d * 2), o(dtype, heads * d);
      q.fill_uniform(rng);
      kv.fill_uniform(rng);
      std::vector<float> lse(static_cast<size_t>(heads));
      ForwardArgs a;
      a.shape = {1, heads, kv_heads, 1, nk, d};
      a.dtype = dtype;
      a.q = {q.data(), bhsd(1, heads, 1, d)};
      a.o = {o.data(), bhsd(1, heads, 1, d)};
      const std::array<int64_t, 4> kv_stride{kv_heads * nk * d * 2, nk * d * 2, d * 2, 2};
      const int64_t esize = int64_t(dtype_size(dtype));
      a.k = {kv.data(), kv_stride};
      a.v = {static_cast<const char*>(kv.data()) + esize, kv_stride};
      a.lse = lse.data();
      a.lse_stride = {heads, 1, 1};
      a.mask.causal = true;
      a.isa = isa;
      attention_forward(a);
      const Check c = check_against_reference(a, o, bhsd(1, heads, 1, d), lse.data());
      EXPECT_TRUE(c.ok()) << c.describe();
    }
}

}  // namespace
}  // namespace tileattn::kvtest
