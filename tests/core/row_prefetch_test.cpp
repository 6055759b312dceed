// The next tile's prefetches (core/row_prefetch.hpp): every line of every
// row is asked for once, and pace() spreads what is left over the given
// number of issue_paced() calls.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/row_prefetch.hpp"

namespace tileattn::testing {
namespace {

using detail::RowPrefetch;

// The decode rows go to L2 only for the bf16 dot-product scores on AMD family
// 0x19 (Zen 4), where that was measured faster; L1 everywhere else.
TEST(RowPrefetch, DecodeRowsGoToL2OnlyForTheDotScoresOnZen4) {
  EXPECT_TRUE(detail::decode_prefetch_to_l2(true, "AuthenticAMD", 0x19));
  EXPECT_FALSE(detail::decode_prefetch_to_l2(false, "AuthenticAMD", 0x19));  // converting products
  EXPECT_FALSE(detail::decode_prefetch_to_l2(true, "AuthenticAMD", 0x1A));   // Zen 5
  EXPECT_FALSE(detail::decode_prefetch_to_l2(true, "GenuineIntel", 0x19));
  EXPECT_FALSE(detail::decode_prefetch_to_l2(true, "GenuineIntel", 6));
}

// Items walking small pages burst the next step toward L2 on AMD family 0x19
// with AVX-512 (Zen 4) where the products prefetch to L1; nowhere else.
TEST(RowPrefetch, WalkingItemsBurstTheNextStepToL2OnlyOnZen4WithL1Products) {
  EXPECT_TRUE(detail::decode_walk_burst_to_l2(false, "AuthenticAMD", 0x19, true));
  EXPECT_FALSE(detail::decode_walk_burst_to_l2(true, "AuthenticAMD", 0x19, true));  // the dot scores' rows go to L2
  EXPECT_FALSE(detail::decode_walk_burst_to_l2(false, "AuthenticAMD", 0x19, false));  // Zen 3: not measured
  EXPECT_FALSE(detail::decode_walk_burst_to_l2(false, "AuthenticAMD", 0x1A, true));   // Zen 5
  EXPECT_FALSE(detail::decode_walk_burst_to_l2(false, "GenuineIntel", 6, true));
}

// The FMA P V asks for the next step's V rows on AMD family 0x19 with AVX-512
// (Zen 4), where that was measured faster; the scores ask for V elsewhere.
TEST(RowPrefetch, ProbabilityProductAsksForTheNextStepsValuesOnlyOnZen4) {
  EXPECT_TRUE(detail::decode_pv_asks_next_v("AuthenticAMD", 0x19, true));
  EXPECT_FALSE(detail::decode_pv_asks_next_v("AuthenticAMD", 0x19, false));  // Zen 3: not measured
  EXPECT_FALSE(detail::decode_pv_asks_next_v("AuthenticAMD", 0x1A, true));   // Zen 5
  EXPECT_FALSE(detail::decode_pv_asks_next_v("GenuineIntel", 6, true));
  EXPECT_FALSE(detail::decode_pv_asks_next_v("GenuineIntel", 0x19, true));
}

TEST(RowPrefetch, CountsEveryLineOfEveryRowOnce) {
  std::vector<char> buffer(4096);
  const void* rows[3] = {buffer.data(), buffer.data() + 1024, buffer.data() + 2048};
  RowPrefetch prefetch;
  prefetch.reset(rows, 3, 130);  // 3 lines per row (the last one partial)
  EXPECT_EQ(prefetch.lines_left(), 9);
  prefetch.issue(2);
  EXPECT_EQ(prefetch.lines_left(), 7);
  prefetch.issue(2);  // crosses into the second row
  EXPECT_EQ(prefetch.lines_left(), 5);
  prefetch.finish();
  EXPECT_EQ(prefetch.lines_left(), 0);
  prefetch.issue(4);  // nothing left: no line past the rows
  EXPECT_EQ(prefetch.lines_left(), 0);
}

TEST(RowPrefetch, PaceSpreadsTheLinesLeftOverTheIssues) {
  std::vector<char> buffer(64 * 64);
  std::vector<const void*> rows;
  for (int r = 0; r < 8; ++r) rows.push_back(buffer.data() + r * 512);
  RowPrefetch prefetch;
  prefetch.reset(rows.data(), 8, 512);  // 8 lines per row, 64 lines
  prefetch.issue(4);
  prefetch.pace(7);  // 60 lines over 7 calls: 9 each, the last call asks for 6
  for (int call = 1; call <= 6; ++call) {
    prefetch.issue_paced();
    EXPECT_EQ(prefetch.lines_left(), 60 - 9 * call) << "call " << call;
  }
  prefetch.issue_paced();
  EXPECT_EQ(prefetch.lines_left(), 0);

  prefetch.reset(rows.data(), 8, 512);  // reset forgets the pace
  prefetch.issue_paced();
  EXPECT_EQ(prefetch.lines_left(), 64);
  prefetch.pace(0);  // no issues planned: issue_paced() asks for none
  prefetch.issue_paced();
  EXPECT_EQ(prefetch.lines_left(), 64);
}

}  // namespace
}  // namespace tileattn::testing
