// Window sides up to INT64_MAX: the band arithmetic stays in int64.
#include <limits>

#include "reliability/bad_input_support.hpp"

namespace tileattn::reliability {
namespace {

using testing::Case;
using testing::CaseData;
using testing::MaskCase;

// A window wider than any sequence is the same as no limit; the band
// arithmetic must not overflow for the largest values (negative offsets
// when seqlen_q > seqlen_k).
TEST(BadInput, HugeWindowsEqualUnbounded) {
  Case c = small_case();
  c.seqlen_q = 13;
  c.seqlen_k = 9;
  CaseData unbounded(c);
  unbounded.args.threads = 1;
  attention_forward(unbounded.args);
  for (int64_t w : {int64_t{1} << 59, int64_t{1} << 62, std::numeric_limits<int64_t>::max()}) {
    CaseData huge(c);
    huge.args.threads = 1;
    huge.args.mask.window_left = w;
    huge.args.mask.window_right = w;
    attention_forward(huge.args);
    EXPECT_EQ(huge.o32, unbounded.o32) << "window " << w;
    EXPECT_EQ(huge.lse, unbounded.lse) << "window " << w;
  }
}

}  // namespace
}  // namespace tileattn::reliability
