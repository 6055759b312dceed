// Several application threads calling tileattn at once, each with its own
// inputs, get bitwise the same results as calling it alone. The library's
// pool serves one parallel region at a time; callers that find it busy run
// their items on their own thread, which must not change any result. Also
// run under ThreadSanitizer (scripts/sanitize.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "testing/problem_case.hpp"
#include "tileattn/tileattn.h"

namespace tileattn::reliability {
namespace {

using testing::Case;
using testing::CaseData;
using testing::MaskCase;

std::vector<Case> mixed_cases() {
  std::vector<Case> cases;
  const MaskCase masks[] = {MaskCase::none, MaskCase::causal, MaskCase::window, MaskCase::additive};
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16, DType::f32};
  for (int i = 0; i < 4; ++i) {
    Case c;
    c.batch = 1 + i % 2;
    c.heads = 4;
    c.kv_heads = i == 2 ? 1 : 2;
    c.seqlen_q = 40 + 17 * i;
    c.seqlen_k = 70 + 9 * i;
    c.head_dim = i == 3 ? 64 : 24 + 8 * i;
    c.mask = masks[i];
    c.dtype = dtypes[i];
    c.seed = uint64_t(100 + i);
    cases.push_back(c);
  }
  // A decode-shaped case: split-KV partial buffers are per call, not shared.
  // 6000 keys: 8 splits, and enough work (384 K pair-dims) that a call with
  // 2 threads uses both (run_forward_plan keeps smaller calls on one thread).
  Case decode;
  decode.batch = 1;
  decode.heads = 2;
  decode.kv_heads = 1;
  decode.seqlen_q = 1;
  decode.seqlen_k = 6000;
  decode.head_dim = 32;
  cases.push_back(decode);
  return cases;
}

std::vector<unsigned char> output_bytes(const CaseData& data) {
  const auto* o = data.c.dtype == DType::f32 ? reinterpret_cast<const unsigned char*>(data.o32.data())
                                             : reinterpret_cast<const unsigned char*>(data.o16.data());
  const size_t o_bytes = data.c.dtype == DType::f32 ? data.o32.size() * 4 : data.o16.size() * 2;
  std::vector<unsigned char> out(o, o + o_bytes);
  const auto* l = reinterpret_cast<const unsigned char*>(data.lse.data());
  out.insert(out.end(), l, l + data.lse.size() * 4);
  return out;
}

TEST(Concurrency, ThreadsCallingAtOnceGetTheResultOfACallAlone) {
  const std::vector<Case> cases = mixed_cases();
  const int kThreadSettings[] = {0, 1, 2};
  // Alone: each case once per library thread setting.
  std::vector<std::vector<unsigned char>> expected;
  for (const Case& c : cases) {
    CaseData data(c);
    data.args.threads = 2;
    attention_forward(data.args);
    expected.push_back(output_bytes(data));
  }
  // At once: every application thread runs its case repeatedly, with
  // different library thread counts (results do not depend on them).
  constexpr int kCallers = 6, kRepeats = 3;
  std::atomic<int> mismatches{0}, errors{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      const size_t which = size_t(t) % cases.size();
      auto data = std::make_unique<CaseData>(cases[which]);
      while (!go.load()) std::this_thread::yield();
      for (int r = 0; r < kRepeats; ++r) {
        data->args.threads = kThreadSettings[(t + r) % 3];
        try {
          attention_forward(data->args);
        } catch (...) {
          ++errors;
          continue;
        }
        if (output_bytes(*data) != expected[which]) ++mismatches;
        std::fill(data->o32.begin(), data->o32.end(), 0.0f);
        std::fill(data->o16.begin(), data->o16.end(), uint16_t{0});
      }
    });
  }
  go = true;
  for (auto& th : callers) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0) << "a concurrent call differed from the same call alone";
}

// The C API keeps one last-error message per thread: concurrent failing and
// succeeding calls each see their own status and message.
TEST(Concurrency, CApiStatusAndMessagesArePerThread) {
  constexpr int kCallers = 4, kRepeats = 20;
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      Case c;
      c.seqlen_q = c.seqlen_k = 16;
      c.head_dim = 16;
      CaseData data(c);
      tileattn_forward_args a;
      tileattn_forward_args_init(&a);
      a.batch = 1;
      a.heads = a.kv_heads = 2;
      a.seqlen_q = a.seqlen_k = 16;
      a.head_dim = t % 2 ? 600 : 16;  // odd callers fail
      a.dtype = TILEATTN_F32;
      const int64_t s[4] = {2 * 16 * 16, 16 * 16, 16, 1};
      a.q = {data.q32.data(), {s[0], s[1], s[2], s[3]}};
      a.k = {data.k32.data(), {s[0], s[1], s[2], s[3]}};
      a.v = {data.v32.data(), {s[0], s[1], s[2], s[3]}};
      a.o = {data.o32.data(), {s[0], s[1], s[2], s[3]}};
      a.threads = 1;
      for (int r = 0; r < kRepeats; ++r) {
        const tileattn_status status = tileattn_forward(&a);
        const std::string message = tileattn_last_error();
        const bool should_fail = t % 2 == 1;
        if (should_fail != (status == TILEATTN_INVALID_ARGUMENT)) ++wrong;
        if (should_fail != (message.find("head_dim") != std::string::npos)) ++wrong;
      }
    });
  }
  for (auto& th : callers) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace tileattn::reliability
