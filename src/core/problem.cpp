#include <cmath>

#include "core/problem.hpp"

namespace tileattn::detail {

Band make_band(const MaskSpec& mask) {
  Band band;
  // A side wider than any sequence (validation allows up to INT64_MAX) is
  // unbounded; clamping keeps i + offset -/+ side inside int64.
  band.left = mask.window_left < 0 || mask.window_left > kUnbounded ? kUnbounded : mask.window_left;
  band.right = mask.window_right < 0 || mask.window_right > kUnbounded ? kUnbounded : mask.window_right;
  if (mask.causal && band.right > 0) band.right = 0;
  return band;
}

Problem describe(const ForwardArgs& args) {
  Problem p;
  p.args = args;
  p.group = args.shape.heads / args.shape.kv_heads;
  float scale = std::isnan(args.scale) ? 1.0f / std::sqrt(static_cast<float>(args.shape.head_dim))
                                       : args.scale;
  p.score_scale = scale * kLog2e;
  p.band = make_band(args.mask);
  p.head_dim_padded = round_up(args.shape.head_dim, kPanelWidth);
  return p;
}

}  // namespace tileattn::detail
