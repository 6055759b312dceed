// Attention sinks: the fold into a row's (max, sum) pair (core/sink.hpp),
// rows that see no key, and the checks on the sinks and d_sinks arguments.
// The accuracy over the case table is in forward_test.cpp and
// training/backward_test.cpp (the cases named *_sinks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/sink.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Sink, FoldBelowAndAboveTheRowMax) {
  // Row: scores {0, 1} in log2 units, max 1, sum 2^-1 + 1 = 1.5.
  float max = 1.0f, sum = 1.5f;
  EXPECT_EQ(detail::fold_sink(-1.0f, max, sum), 1.0f);  // below: max stays, acc stays
  EXPECT_EQ(max, 1.0f);
  EXPECT_FLOAT_EQ(sum, 1.75f);
  max = 1.0f, sum = 1.5f;
  EXPECT_FLOAT_EQ(detail::fold_sink(3.0f, max, sum), 0.25f);  // above: everything rescaled to 2^3
  EXPECT_EQ(max, 3.0f);
  EXPECT_FLOAT_EQ(sum, 1.375f);  // 1.5 / 4 + 1
}

TEST(Sink, FoldOfARowWithoutKeysAndOfANaNRow) {
  float max = -kInf, sum = 0.0f;
  EXPECT_EQ(detail::fold_sink(2.5f, max, sum), 0.0f);
  EXPECT_EQ(max, 2.5f);
  EXPECT_EQ(sum, 1.0f);
  max = std::numeric_limits<float>::quiet_NaN(), sum = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(detail::fold_sink(2.5f, max, sum)));
  EXPECT_TRUE(std::isnan(max));
  EXPECT_TRUE(std::isnan(sum));
}

// An all-false boolean mask: every row sees no key, so O = 0 and LSE = the
// row's head's sink, on every path (the reference included), in one pass
// and with key splits (2 rows against 3000 keys take the split-KV merge).
TEST(Sink, RowsThatSeeNoKeyGetZeroOutputAndTheSinkAsLse) {
  for (int64_t nk : {int64_t{40}, int64_t{3000}})
    for (Isa isa : {Isa::reference, Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx}) {
      if (!isa_available(isa)) continue;
      Case c;
      c.heads = 4;
      c.seqlen_q = 2;
      c.seqlen_k = nk;
      c.mask = MaskCase::boolean;
      c.sinks = true;
      CaseData data(c);
      std::fill(data.bool_mask.begin(), data.bool_mask.end(), uint8_t{0});
      data.args.isa = isa;
      attention_forward(data.args);
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < c.seqlen_q; ++i) {
          EXPECT_FLOAT_EQ(data.lse[size_t(h * c.seqlen_q + i)], data.sinks[size_t(h)])
              << isa_name(isa) << " keys " << nk;
          for (int64_t e = 0; e < c.head_dim; ++e)
            ASSERT_EQ(data.o32[size_t((h * c.seqlen_q + i) * c.head_dim + e)], 0.0f) << isa_name(isa);
        }
    }
}

TEST(Sink, NonFiniteSinkIsAnErrorNamingItAndNothingIsWritten) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf, 3e38f}) {
    Case c;
    c.heads = 4;
    c.kv_heads = 2;
    c.sinks = true;
    CaseData data(c);
    data.sinks[2] = bad;
    std::fill(data.o32.begin(), data.o32.end(), 7.0f);
    std::fill(data.lse.begin(), data.lse.end(), 7.0f);
    const std::vector<float> before = data.o32;
    const std::vector<float> lse_before = data.lse;
    try {
      attention_forward(data.args);
      ADD_FAILURE() << "sink " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sinks[2]"), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::memcmp(before.data(), data.o32.data(), before.size() * 4), 0);
    EXPECT_EQ(std::memcmp(lse_before.data(), data.lse.data(), lse_before.size() * 4), 0);
  }
}

// attention_probabilities with sinks: each row's keys share what the sink
// leaves, sum_j P_ij + exp(sink_h - LSE_i) = 1 with the forward's LSE.
TEST(Sink, ProbabilitiesLeaveTheSinkItsShare) {
  Case c;
  c.heads = 4;
  c.kv_heads = 2;
  c.seqlen_q = 9;
  c.seqlen_k = 13;
  c.mask = MaskCase::causal;
  c.sinks = true;
  CaseData data(c);
  attention_forward(data.args);
  const int64_t nq = c.seqlen_q, nk = c.seqlen_k;
  std::vector<float> probs(size_t(c.heads * nq * nk));
  attention_probabilities(data.args, probs.data(), {c.heads * nq * nk, nq * nk, nk, 1});
  double worst = 0, smallest_sink_share = 1;
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t i = 0; i < nq; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < nk; ++j) sum += probs[size_t((h * nq + i) * nk + j)];
      const double sink_share = std::exp(double(data.sinks[size_t(h)]) - double(data.lse[size_t(h * nq + i)]));
      smallest_sink_share = std::min(smallest_sink_share, sink_share);
      worst = std::max(worst, std::fabs(sum + sink_share - 1.0));
    }
  EXPECT_LE(worst, 1e-5);
  EXPECT_GE(smallest_sink_share, 1e-3);  // the sinks take a visible share: the check bites
}

}  // namespace
}  // namespace tileattn::testing
