// The backward operator on 1 and 2 threads agrees bit for bit, with both
// threads running work items (the thread pool's test hook, as in
// forward_test.cpp). tests/training/backward_test.cpp compares the same two
// thread counts over its whole table, but there a helper that wakes late may
// find every item taken and the two runs may both be single-threaded; here
// the census says how many threads ran items.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "support/thread_census.hpp"
#include "testing/case_table.hpp"
#include "training/backward_support.hpp"

namespace tileattn::testing {
namespace {

std::vector<BackwardCase> cases() {
  std::vector<BackwardCase> out;
  auto add = [&](Case c, float dropout = 0.0f) {
    BackwardCase bc;
    bc.c = c;
    bc.dropout_p = dropout;
    out.push_back(bc);
  };
  add(head_dim_case(59, MaskCase::none));
  add(head_dim_case(64, MaskCase::causal));
  add(length_case(17, 130));
  add(gqa_case(8, 2));
  {
    // Long keys, few (sequence, KV head) pairs: keys cut into chunks whose dQ
    // partial sums are added afterwards.
    Case c;
    c.heads = 2;
    c.kv_heads = 1;
    c.seqlen_q = 100;
    c.seqlen_k = 1100;
    c.head_dim = 16;
    c.mask = MaskCase::causal;
    add(c);
  }
  add_varlen_cases([&](Case c) { add(c); });
  {
    Case c;
    c.seqlen_q = 97;
    c.seqlen_k = 130;
    c.mask = MaskCase::causal;
    c.dtype = DType::bf16;
    add(c, 0.3f);
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].c.seed = 7000 + i;
  return out;
}

class BackwardThreads : public ::testing::TestWithParam<std::tuple<BackwardCase, Isa>> {};

TEST_P(BackwardThreads, OneAndTwoThreadsAgreeBitForBitWithBothRunningItems) {
  const BackwardCase& bc = std::get<0>(GetParam());
  const Isa isa = std::get<1>(GetParam());
  if (!isa_available(isa)) GTEST_SKIP() << isa_name(isa) << " not available on this CPU";
  BackwardData one(bc, isa), two(bc, isa);
  one.args.forward.threads = 1;
  two.args.forward.threads = 2;
  attention_backward(one.args);
  const detail::ThreadCensus census = run_on_every_thread([&] { attention_backward(two.args); });
  expect_threads_took_part(census, 2, bc.name());
  const DType dt = bc.c.dtype;
  EXPECT_EQ(std::memcmp(one.dq.data(dt), two.dq.data(dt), one.dq.bytes(dt)), 0) << "dQ: 1 vs 2 threads";
  EXPECT_EQ(std::memcmp(one.dk.data(dt), two.dk.data(dt), one.dk.bytes(dt)), 0) << "dK: 1 vs 2 threads";
  EXPECT_EQ(std::memcmp(one.dv.data(dt), two.dv.data(dt), one.dv.bytes(dt)), 0) << "dV: 1 vs 2 threads";
}

std::string test_name(const ::testing::TestParamInfo<std::tuple<BackwardCase, Isa>>& info) {
  std::string name = std::get<0>(info.param).name() + "_" + isa_name(std::get<1>(info.param));
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardThreads,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(Isa::generic, Isa::avx2, Isa::avx512)),
                         test_name);

}  // namespace
}  // namespace tileattn::testing
