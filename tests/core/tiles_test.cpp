// forward_tiles: the tiles a call runs with, choose_tiles' plus the per-call
// adjustments, as `tileattn bench` reports them.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/forward_plan.hpp"
#include "core/problem.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

TEST(ForwardTiles, PerCallAdjustmentsShow) {
  Case c;
  c.seqlen_q = c.seqlen_k = 1024;
  c.head_dim = 128;
  CaseData fp32(c);
  fp32.args.isa = Isa::generic;
  const TileShape chosen = choose_tiles(Isa::generic, 128, DType::f32);
  const TileShape plain = forward_tiles(fp32.args);
  EXPECT_EQ(plain.block_q, chosen.block_q);
  EXPECT_EQ(plain.block_kv, chosen.block_kv);
  EXPECT_EQ(plain.reason, chosen.reason);

  Case short_q = c;
  short_q.seqlen_q = 5;
  CaseData few(short_q);
  few.args.isa = Isa::generic;
  const TileShape cut = forward_tiles(few.args);
  EXPECT_EQ(cut.block_q, 5);
  EXPECT_NE(cut.reason.find("this call"), std::string::npos) << cut.reason;

  // bf16 products without a band take wider tiles.
  // avx512bf16: 256 keys, else 128. amx: 512x256 where the shape gives >= 32 query
  // tiles of 512 rows (here 16 heads x 2048 rows: 64), else 256x256, each
  // where its working set (Q, accumulator, K, V and S in fp32 bytes) fits L2.
  const auto fits_l2 = [](int64_t q, int64_t kv) {
    return 4 * (q * 256 + kv * 256 + q * kv) <= cache_sizes().l2;  // D = Dv = 128
  };
  for (Isa isa : {Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    const TileShape base = choose_tiles(isa, 128, DType::bf16);
    Case b = c;  // 2 heads x 1024 rows: too few tiles for 512 rows
    b.dtype = DType::bf16;
    Case tall = b;
    tall.heads = tall.kv_heads = 16;
    tall.seqlen_q = tall.seqlen_k = 2048;
    CaseData unbanded(b), many(tall);
    unbanded.args.isa = many.args.isa = isa;
    const TileShape wide = forward_tiles(unbanded.args), wide_many = forward_tiles(many.args);
    if (isa == Isa::avx512bf16) {
      const int expected_kv = fits_l2(base.block_q, 256) ? 256 : 128;
      if (base.block_kv < expected_kv) {
        EXPECT_EQ(wide.block_kv, expected_kv) << isa_name(isa);
      }
      EXPECT_EQ(wide.block_q, base.block_q) << isa_name(isa);
    } else if (fits_l2(256, 256)) {
      EXPECT_EQ(wide.block_q, 256);
      EXPECT_EQ(wide.block_kv, 256);
      EXPECT_EQ(wide_many.block_q, fits_l2(512, 256) ? 512 : 256);
      EXPECT_EQ(wide_many.block_kv, 256);
    }
    if (wide.block_kv != base.block_kv) {
      EXPECT_NE(wide.reason.find("wider tiles"), std::string::npos) << wide.reason;
    }
    // A causal band: amx takes 256x256 (where it fits L2; 512x256 for MHA with
    // enough query tiles, below), avx512bf16 128
    // keys (where they fit); a sliding window keeps the cache model's tiles on both.
    b.mask = MaskCase::causal;
    CaseData banded(b);
    banded.args.isa = isa;
    const TileShape causal = forward_tiles(banded.args);
    if (isa == Isa::amx && fits_l2(256, 256)) {
      EXPECT_EQ(causal.block_q, 256);
      EXPECT_EQ(causal.block_kv, 256);
      // With enough 512-row query tiles, causal MHA takes 512x256 on amx and
      // GQA keeps 256x256 (forward.cpp).
      Case tall_causal = tall;
      tall_causal.mask = MaskCase::causal;
      Case gqa_causal = tall_causal;
      gqa_causal.kv_heads = 4;
      CaseData mha_data(tall_causal), gqa_data(gqa_causal);
      mha_data.args.isa = gqa_data.args.isa = isa;
      const TileShape mha_tiles = forward_tiles(mha_data.args), gqa_tiles = forward_tiles(gqa_data.args);
      EXPECT_EQ(mha_tiles.block_q, fits_l2(512, 256) ? 512 : 256);
      EXPECT_EQ(mha_tiles.block_kv, 256);
      EXPECT_EQ(gqa_tiles.block_q, 256);
      EXPECT_EQ(gqa_tiles.block_kv, 256);
    } else if (isa == Isa::avx512bf16) {
      EXPECT_EQ(causal.block_q, base.block_q);
      EXPECT_EQ(causal.block_kv, fits_l2(base.block_q, 128) ? std::max(128, base.block_kv) : base.block_kv);
    } else {
      EXPECT_EQ(causal.block_kv, base.block_kv) << isa_name(isa);
    }
    b.mask = MaskCase::window;
    CaseData windowed(b);
    windowed.args.isa = isa;
    EXPECT_EQ(forward_tiles(windowed.args).block_kv, base.block_kv) << isa_name(isa);
  }
}

// MLA's absorbed decode (one query per head, 128 heads on one KV head, K 576
// wide, V 512) on the bf16 dot-product rung: 256 or 128 keys per tile, the
// widest whose per-thread scratch (the main loop's layout, bf16 K/V tiles)
// fits L2, else the cache model's keys; the query heads go to one work item.
TEST(ForwardTiles, MlaDecodeOnBf16ProductsTakesWiderKeyTiles) {
  if (!isa_available(Isa::avx512bf16)) GTEST_SKIP() << "no avx512bf16 rung on this CPU";
  Case c;
  c.heads = 128;
  c.kv_heads = 1;
  c.seqlen_q = 1;
  c.seqlen_k = 8192;
  c.head_dim = 576;
  c.v_head_dim = 512;
  c.dtype = DType::bf16;
  c.mask = MaskCase::causal;
  CaseData mla(c);
  mla.args.isa = Isa::avx512bf16;
  const TileShape model = choose_tiles(Isa::avx512bf16, 576, DType::bf16, 512);
  int expected = model.block_kv;
  for (int keys : {256, 128}) {
    ForwardArgs a = mla.args;
    a.block_kv = keys;
    const detail::Problem p = detail::plan_forward(a, Isa::avx512bf16, 1);
    if (keys > model.block_kv && detail::forward_scratch_layout(p).total * 4 <= cache_sizes().l2) {
      expected = keys;
      break;
    }
  }
  EXPECT_EQ(forward_tiles(mla.args).block_kv, expected);
  const detail::Problem plan = detail::plan_forward(mla.args, Isa::avx512bf16, 1);
  EXPECT_EQ(plan.heads_per_item, 128) << "the cache model's " << model.block_q << "-row query tile";
}

}  // namespace
}  // namespace tileattn::testing
