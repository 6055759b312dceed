// forward_tiles: the tiles a call runs with, choose_tiles' plus the per-call
// adjustments, as `tileattn bench` reports them.
#include <gtest/gtest.h>

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

  // bf16 products without a band take 128-key tiles; a causal band keeps the chosen ones.
  for (Isa isa : {Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    Case b = c;
    b.dtype = DType::bf16;
    CaseData unbanded(b);
    unbanded.args.isa = isa;
    const TileShape wide = forward_tiles(unbanded.args);
    const TileShape base = choose_tiles(isa, 128, DType::bf16);
    if (base.block_kv < 128) {
      EXPECT_EQ(wide.block_kv, 128) << isa_name(isa);
      EXPECT_NE(wide.reason.find("128-key"), std::string::npos) << wide.reason;
    }
    b.mask = MaskCase::causal;
    CaseData banded(b);
    banded.args.isa = isa;
    EXPECT_EQ(forward_tiles(banded.args).block_kv, base.block_kv) << isa_name(isa);
  }
}

}  // namespace
}  // namespace tileattn::testing
