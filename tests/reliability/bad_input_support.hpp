// Shared checks of the bad-input tests: a call is refused with an Error whose
// message names the argument, and no output byte changed.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "testing/problem_case.hpp"

namespace tileattn::reliability {

// A byte snapshot of every output of a CaseData (O and LSE), taken after
// filling them with a sentinel, so "nothing written" is checkable.
struct OutputSnapshot {
  std::vector<unsigned char> o, lse;
};

inline OutputSnapshot poison_outputs(testing::CaseData& data) {
  auto fill = [](auto& vec) {
    if (!vec.empty()) std::memset(vec.data(), 0x5A, vec.size() * sizeof(vec[0]));
  };
  fill(data.o32);
  fill(data.o16);
  fill(data.lse);
  OutputSnapshot s;
  auto bytes = [](const auto& vec) {
    const auto* p = reinterpret_cast<const unsigned char*>(vec.data());
    return std::vector<unsigned char>(p, p + vec.size() * sizeof(vec[0]));
  };
  s.o = data.c.dtype == DType::f32 ? bytes(data.o32) : bytes(data.o16);
  s.lse = bytes(data.lse);
  return s;
}

inline bool outputs_unchanged(const testing::CaseData& data, const OutputSnapshot& s) {
  const void* o = data.c.dtype == DType::f32 ? static_cast<const void*>(data.o32.data()) : data.o16.data();
  return (s.o.empty() || std::memcmp(o, s.o.data(), s.o.size()) == 0) &&
         (s.lse.empty() || std::memcmp(data.lse.data(), s.lse.data(), s.lse.size()) == 0);
}

// Runs `call` and expects an Error whose message contains every needle, with
// the outputs of `data` untouched.
inline void expect_refused(testing::CaseData& data, const std::function<void()>& call,
                           const std::vector<std::string>& needles) {
  const OutputSnapshot before = poison_outputs(data);
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error mentioning '" << needles.front() << "'";
  } catch (const Error& e) {
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message '" << e.what() << "' lacks '" << needle << "'";
  }
  EXPECT_TRUE(outputs_unchanged(data, before)) << "an output was written although the call was refused";
}

inline void expect_forward_refused(testing::CaseData& data, const std::vector<std::string>& needles) {
  expect_refused(data, [&] { attention_forward(data.args); }, needles);
}

inline testing::Case small_case(DType dtype = DType::f32) {
  testing::Case c;
  c.batch = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.seqlen_q = 9;
  c.seqlen_k = 13;
  c.head_dim = 16;
  c.dtype = dtype;
  return c;
}

}  // namespace tileattn::reliability
