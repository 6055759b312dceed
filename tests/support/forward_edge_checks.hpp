// Edge cases of the forward operator, written once and run on every path:
// the ISAs this CPU runs (tests/core/forward_test.cpp) and the emulated
// AVX-512 main loop (tests/isa/avx512_emulated_test.cpp). Each check builds
// its case, runs the operator through `run` and checks the result; `run`
// returns false when the path cannot run that case, and the check is then
// skipped with `skip_reason`.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/forward_plan.hpp"
#include "testing/problem_case.hpp"

namespace tileattn::testing::edges {

struct ForwardPath {
  std::function<bool(CaseData&)> run;  // runs data.args; false: not on this path
  std::string skip_reason;
  Isa plan_isa = Isa::generic;  // whose plan (tile shapes, key splits) the path follows
};

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Rows that see no key (a window hiding everything): zeros and LSE = -inf.
inline void window_hiding_everything(const ForwardPath& path) {
  Case c;
  c.seqlen_q = 40;
  c.seqlen_k = 8;  // bottom-right alignment: rows 0..31 see no key with window (0, 0)
  c.mask = MaskCase::window;
  c.window_left = 0;
  c.window_right = 0;
  CaseData data(c);
  if (!path.run(data)) GTEST_SKIP() << path.skip_reason;
  EXPECT_TRUE(compare_with_reference(data).ok());
  for (int64_t row = 0; row < 32; ++row) {
    EXPECT_EQ(data.lse_at(0, 0, row), -kInf);
    for (int64_t d = 0; d < c.head_dim; ++d) ASSERT_EQ(data.o_at(0, 1, row, d), 0.0f);
  }
}

inline void all_false_boolean_mask(const ForwardPath& path) {
  Case c;
  c.mask = MaskCase::boolean;
  CaseData data(c);
  std::fill(data.bool_mask.begin(), data.bool_mask.end(), 0);
  if (!path.run(data)) GTEST_SKIP() << path.skip_reason;
  for (float x : data.o32) ASSERT_EQ(x, 0.0f);
  for (float x : data.lse) ASSERT_EQ(x, -kInf);
}

// |q.k| up to ~3e4: exp2's clamp and flush are exercised.
inline void large_scores(const ForwardPath& path) {
  Case c;
  c.head_dim = 8;
  c.input_scale = 60.0f;
  c.scale = 1.0f;
  c.seqlen_q = c.seqlen_k = 97;
  CaseData data(c);
  if (!path.run(data)) GTEST_SKIP() << path.skip_reason;
  const Comparison cmp = compare_with_reference(data);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  for (float x : data.o32) ASSERT_TRUE(std::isfinite(x));
}

inline void nan_in_one_query_row(const ForwardPath& path) {
  Case c;
  c.seqlen_q = c.seqlen_k = 97;
  CaseData data(c);
  data.set_q(0, 1, 5, 3, kNaN);
  if (!path.run(data)) GTEST_SKIP() << path.skip_reason;
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t row = 0; row < c.seqlen_q; ++row) {
      const bool poisoned = h == 1 && row == 5;
      EXPECT_EQ(std::isnan(data.o_at(0, h, row, 0)), poisoned) << "head " << h << " row " << row;
    }
  EXPECT_TRUE(compare_with_reference(data).ok());
}

// A NaN key reaches exactly the (causal) rows that see it, in every dtype.
inline void nan_in_one_key_row(const ForwardPath& path) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Case c;
    c.seqlen_q = c.seqlen_k = 97;
    c.mask = MaskCase::causal;
    c.dtype = dtype;
    CaseData data(c);
    data.set_k(0, 0, 50, 0, kNaN);
    if (!path.run(data)) GTEST_SKIP() << path.skip_reason;
    for (int64_t row = 0; row < c.seqlen_q; ++row)
      EXPECT_EQ(std::isnan(data.o_at(0, 0, row, 0)), row >= 50) << dtype_name(dtype) << " row " << row;
    EXPECT_TRUE(compare_with_reference(data).ok()) << dtype_name(dtype);
  }
}

// A NaN in one key range of a split decode row survives the merge.
inline void nan_in_a_decode_split(const ForwardPath& path) {
  Case c;
  c.heads = 4;
  c.kv_heads = 1;
  c.seqlen_q = 1;
  c.seqlen_k = 1100;  // split into key ranges, merged afterwards
  CaseData data(c);
  ASSERT_GT(detail::plan_forward(data.args, path.plan_isa, 1).kv_splits, 1);
  data.set_k(0, 0, 900, 7, kNaN);
  if (!path.run(data)) GTEST_SKIP() << path.skip_reason;
  for (int64_t h = 0; h < c.heads; ++h) EXPECT_TRUE(std::isnan(data.o_at(0, h, 0, 0))) << h;
  EXPECT_TRUE(compare_with_reference(data).ok());
}

// Every block_q `tileattn tune` may pick (and odd ones) against odd key
// tiles; 300 query rows so that the tall tiles are not shrunk to the sequence.
inline void every_tile_shape(const ForwardPath& path) {
  for (int bq : {1, 7, 16, 64, 128, 192, 256})
    for (int bkv : {1, 13, 16, 64, 256}) {
      Case c;
      c.seqlen_q = 300;
      c.seqlen_k = 131;
      c.head_dim = 59;
      c.mask = MaskCase::causal;
      CaseData data(c);
      data.args.block_q = bq;
      data.args.block_kv = bkv;
      if (!path.run(data)) GTEST_SKIP() << path.skip_reason;
      const Comparison cmp = compare_with_reference(data);
      EXPECT_TRUE(cmp.ok()) << bq << "x" << bkv << ": " << cmp.describe();
    }
}

}  // namespace tileattn::testing::edges
