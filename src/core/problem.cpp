#include <cmath>

#include "core/problem.hpp"

namespace tileattn::detail {

Band make_band(const MaskSpec& mask) { return make_band(mask.causal, mask.window_left, mask.window_right); }

Problem describe(const ForwardArgs& args) {
  Problem p;
  p.args = args;
  p.group = args.shape.heads / args.shape.kv_heads;
  float scale = std::isnan(args.scale) ? 1.0f / std::sqrt(static_cast<float>(args.shape.head_dim))
                                       : args.scale;
  p.score_scale = scale * kLog2e;
  p.softcap_log2 = args.softcap * kLog2e;  // core/softcap.hpp: the cap keeps its form in log2 units
  p.band = make_band(args.mask);
  p.head_dim_padded = round_up(args.shape.head_dim, kPanelWidth);
  p.v_head_dim = value_head_dim(args.shape);
  p.v_head_dim_padded = round_up(p.v_head_dim, kPanelWidth);
  return p;
}

}  // namespace tileattn::detail
