// The float64 reference backward against central finite differences of the
// float64 reference forward, on tiny shapes: it checks the analytic formulas
// (and so everything the fast path is compared with) for masks, GQA, unequal
// lengths and dropout. Loss L = sum(dO o O).
#include "backward_support.hpp"

namespace tileattn::testing {
namespace {

double loss(const ForwardArgs& args, const std::vector<float>& d_o) {
  const training::BackwardReference ref = training::reference_forward_with_dropout(args);
  double l = 0;
  for (size_t e = 0; e < ref.o.size(); ++e) l += ref.o[e] * d_o[e];
  return l;
}

// d L / d x[e] by central differences; the perturbation actually applied is
// the float rounding of x +- h, measured exactly in double.
double finite_difference(ForwardArgs& args, std::vector<float>& x, size_t e,
                         const std::vector<float>& d_o) {
  const float original = x[e];
  const float up = original + 1e-3f, down = original - 1e-3f;
  x[e] = up;
  const double l_up = loss(args, d_o);
  x[e] = down;
  const double l_down = loss(args, d_o);
  x[e] = original;
  return (l_up - l_down) / (double(up) - double(down));
}

struct FdCase {
  int64_t heads, kv_heads, nq, nk;
  MaskCase mask;
  float dropout;
  bool sinks = false;
};

class FiniteDifferences : public ::testing::TestWithParam<FdCase> {};

TEST_P(FiniteDifferences, ReferenceGradientsMatch) {
  const FdCase& f = GetParam();
  BackwardCase bc;
  bc.c.heads = f.heads;
  bc.c.kv_heads = f.kv_heads;
  bc.c.seqlen_q = f.nq;
  bc.c.seqlen_k = f.nk;
  bc.c.head_dim = 4;
  bc.c.mask = f.mask;
  bc.c.window_left = 1;
  bc.c.window_right = 1;
  bc.dropout_p = f.dropout;
  bc.c.sinks = f.sinks;
  BackwardData data(bc, Isa::generic);
  const training::BackwardReference ref = training::reference_backward(data.args);
  ForwardArgs& a = data.fwd.args;
  struct Input {
    const char* name;
    std::vector<float>* values;
    const std::vector<double>* gradient;
  };
  for (const Input& in : {Input{"q", &data.fwd.q32, &ref.dq}, Input{"k", &data.fwd.k32, &ref.dk},
                          Input{"v", &data.fwd.v32, &ref.dv}, Input{"sinks", &data.fwd.sinks, &ref.d_sinks}}) {
    ASSERT_EQ(in.values->size(), in.gradient->size());
    for (size_t e = 0; e < in.values->size(); ++e) {
      const double fd = finite_difference(a, *in.values, e, data.d_o.f32);
      EXPECT_NEAR((*in.gradient)[e], fd, 1e-5 * std::max(1.0, std::abs(fd)))
          << "d" << in.name << "[" << e << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TinyShapes, FiniteDifferences,
                         ::testing::Values(FdCase{1, 1, 3, 5, MaskCase::none, 0.0f},
                                           FdCase{2, 1, 4, 4, MaskCase::causal, 0.0f},
                                           FdCase{2, 2, 5, 3, MaskCase::window, 0.0f},
                                           FdCase{2, 1, 3, 6, MaskCase::additive, 0.0f},
                                           FdCase{2, 2, 4, 5, MaskCase::boolean, 0.0f},
                                           FdCase{2, 1, 4, 6, MaskCase::causal, 0.4f},
                                           FdCase{2, 1, 5, 3, MaskCase::causal, 0.0f, true},
                                           FdCase{2, 2, 4, 6, MaskCase::window, 0.4f, true}));

}  // namespace
}  // namespace tileattn::testing
