// The LSE output may not overlap the mask (an input).
#include <limits>

#include "reliability/bad_input_support.hpp"

namespace tileattn::reliability {
namespace {

using testing::Case;
using testing::CaseData;
using testing::MaskCase;

// LSE is an output too: writing it into the mask would change the mask the
// other rows still read.
TEST(BadInput, LseAliasingTheMask) {
  Case c = small_case();
  c.mask = MaskCase::additive;
  CaseData data(c);
  std::vector<float> mask_before = data.add_mask;
  data.args.lse = data.add_mask.data();
  expect_forward_refused(data, {"lse", "overlaps", "mask"});
  EXPECT_EQ(mask_before, data.add_mask) << "the mask was overwritten";
}

}  // namespace
}  // namespace tileattn::reliability
