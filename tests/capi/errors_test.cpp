// Bad input through the C API: a status code, a message naming the argument,
// nothing written; no exception crosses the boundary; messages are per thread.
#include <gtest/gtest.h>

#include <future>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "capi/c_args.hpp"
#include "capi/guard.hpp"
#include "testing/problem_case.hpp"
#include "tileattn/tileattn.h"

namespace tileattn {
namespace {

using testing::Case;
using testing::CaseData;

bool contains(const char* haystack, const std::string& needle) {
  return std::string(haystack).find(needle) != std::string::npos;
}

constexpr float kSentinel = 12345.0f;

// One bad forward call: the status, a message naming `argument`, and O and
// LSE untouched.
void expect_rejected(void (*spoil)(tileattn_forward_args&, CaseData&), const std::string& argument,
                     tileattn_status expected = TILEATTN_INVALID_ARGUMENT) {
  Case c;
  c.mask = testing::MaskCase::boolean;
  CaseData data(c);
  std::fill(data.o32.begin(), data.o32.end(), kSentinel);
  std::fill(data.lse.begin(), data.lse.end(), kSentinel);
  tileattn_forward_args args = capi_testing::to_c_args(data.args);
  spoil(args, data);
  EXPECT_EQ(tileattn_forward(&args), expected) << "argument " << argument;
  EXPECT_TRUE(contains(tileattn_last_error(), "tileattn_forward: ")) << tileattn_last_error();
  EXPECT_TRUE(contains(tileattn_last_error(), argument))
      << "message '" << tileattn_last_error() << "' does not name " << argument;
  for (float x : data.o32) ASSERT_EQ(x, kSentinel) << "O written despite the error";
  for (float x : data.lse) ASSERT_EQ(x, kSentinel) << "LSE written despite the error";
}

TEST(CApiErrors, NullArgs) {
  EXPECT_EQ(tileattn_forward(nullptr), TILEATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error(), "tileattn_forward: args is null");
  // Through the header's macro (sizeof the struct type: any pointer, NULL too) and the function.
  EXPECT_EQ(tileattn_forward_args_init(nullptr), TILEATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error(), "tileattn_forward_args_init_sized: args is null");
  EXPECT_EQ((tileattn_forward_args_init)(nullptr), TILEATTN_INVALID_ARGUMENT);
  EXPECT_EQ(tileattn_merge_states(nullptr), TILEATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error(), "tileattn_merge_states: args is null");
  EXPECT_EQ(tileattn_get_version(nullptr, nullptr, nullptr), TILEATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error(), "tileattn_get_version: major is null");
}

TEST(CApiErrors, BadForwardArguments) {
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.q.data = nullptr; }, "q: data is null");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.v.data = nullptr; }, "v");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.o.data = nullptr; }, "o");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.mask_data = nullptr; }, "mask");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.head_dim = 0; }, "head_dim");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.head_dim = 600; }, "head_dim");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.heads = -1; }, "heads");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.kv_heads = 3; }, "kv_heads");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.seqlen_q = -5; }, "seqlen_q");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.window_left = -2; }, "window_left");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.dtype = 7; }, "dtype");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.isa = 9; }, "isa");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.mask_kind = 3; }, "mask_kind");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.reserved0 = 1; }, "reserved0");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.dropout_p = 1.0f; }, "dropout_p");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.scale = std::numeric_limits<float>::infinity(); },
                  "scale");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.struct_size = 0; }, "struct_size");
  expect_rejected([](tileattn_forward_args& a, CaseData&) { a.struct_size = 16; }, "struct_size");
  // Output aliasing an input.
  expect_rejected([](tileattn_forward_args& a, CaseData& d) { a.q.data = d.o32.data(); }, "overlap");
}

TEST(CApiErrors, SuccessClearsTheMessage) {
  EXPECT_EQ(tileattn_forward(nullptr), TILEATTN_INVALID_ARGUMENT);
  EXPECT_STRNE(tileattn_last_error(), "");
  int32_t major, minor, patch;
  EXPECT_EQ(tileattn_get_version(&major, &minor, &patch), TILEATTN_OK);
  EXPECT_STREQ(tileattn_last_error(), "");
}

TEST(CApiErrors, BadMergeArguments) {
  std::vector<float> o_a(2 * 4, 1.0f), o_b(2 * 4, 2.0f), out(2 * 4, kSentinel);
  std::vector<float> lse_a(2, 0.0f), lse_b(2, 0.0f);
  tileattn_merge_args m;
  ASSERT_EQ(tileattn_merge_args_init(&m), TILEATTN_OK);
  m.batch = 1;
  m.heads = 1;
  m.rows = 2;
  m.head_dim = 4;
  m.o_a = {o_a.data(), {8, 8, 4, 1}};
  m.o_b = {o_b.data(), {8, 8, 4, 1}};
  m.o_out = {out.data(), {8, 8, 4, 1}};
  m.lse_a = lse_a.data();
  m.lse_b = nullptr;
  m.lse_a_stride[1] = m.lse_b_stride[1] = 2;
  EXPECT_EQ(tileattn_merge_states(&m), TILEATTN_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(tileattn_last_error(), "lse_b")) << tileattn_last_error();
  m.lse_b = lse_b.data();
  m.head_dim = 0;
  EXPECT_EQ(tileattn_merge_states(&m), TILEATTN_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(tileattn_last_error(), "head_dim")) << tileattn_last_error();
  m.head_dim = 4;
  m.dtype = 5;
  EXPECT_EQ(tileattn_merge_states(&m), TILEATTN_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(tileattn_last_error(), "dtype")) << tileattn_last_error();
  for (float x : out) ASSERT_EQ(x, kSentinel);
  // Equal LSEs: the average.
  m.dtype = TILEATTN_F32;
  ASSERT_EQ(tileattn_merge_states(&m), TILEATTN_OK) << tileattn_last_error();
  for (float x : out) EXPECT_FLOAT_EQ(x, 1.5f);
}

// Whatever the C++ side throws becomes a status; nothing propagates.
TEST(CApiErrors, EveryExceptionBecomesAStatus) {
  using capi::guarded;
  EXPECT_EQ(guarded("f", [] { throw Error("x: bad"); }), TILEATTN_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error(), "f: x: bad");
  EXPECT_EQ(guarded("f", [] { throw NotSupported("y: missing"); }), TILEATTN_NOT_SUPPORTED);
  EXPECT_STREQ(tileattn_last_error(), "f: y: missing");
  EXPECT_EQ(guarded("f", [] { throw std::bad_alloc(); }), TILEATTN_OUT_OF_MEMORY);
  EXPECT_STREQ(tileattn_last_error(), "f: out of memory");
  EXPECT_EQ(guarded("f", [] { throw std::runtime_error("boom"); }), TILEATTN_INTERNAL_ERROR);
  EXPECT_STREQ(tileattn_last_error(), "f: boom");
  EXPECT_EQ(guarded("f", [] { throw 42; }), TILEATTN_INTERNAL_ERROR);
  EXPECT_STREQ(tileattn_last_error(), "f: unknown exception");
  // A message longer than the buffer is truncated, not overflowed.
  EXPECT_EQ(guarded("f", [] { throw Error(std::string(5000, 'z')); }), TILEATTN_INVALID_ARGUMENT);
  EXPECT_LT(std::strlen(tileattn_last_error()), 5000u);
  EXPECT_EQ(guarded("f", [] {}), TILEATTN_OK);
  EXPECT_STREQ(tileattn_last_error(), "");
}

// Each thread sees only its own last error.
TEST(CApiErrors, LastErrorIsPerThread) {
  std::promise<void> a_failed, b_done;
  std::string a_after_b, b_before, b_after;
  std::thread a([&] {
    EXPECT_EQ(tileattn_forward(nullptr), TILEATTN_INVALID_ARGUMENT);
    a_failed.set_value();
    b_done.get_future().wait();
    a_after_b = tileattn_last_error();
  });
  std::thread b([&] {
    a_failed.get_future().wait();
    b_before = tileattn_last_error();
    EXPECT_EQ(tileattn_get_version(nullptr, nullptr, nullptr), TILEATTN_INVALID_ARGUMENT);
    b_after = tileattn_last_error();
    b_done.set_value();
  });
  a.join();
  b.join();
  EXPECT_EQ(b_before, "");
  EXPECT_EQ(b_after, "tileattn_get_version: major is null");
  EXPECT_EQ(a_after_b, "tileattn_forward: args is null");
}

TEST(CApiErrors, StatusStrings) {
  EXPECT_STREQ(tileattn_status_string(TILEATTN_OK), "ok");
  EXPECT_STREQ(tileattn_status_string(TILEATTN_INVALID_ARGUMENT), "invalid argument");
  EXPECT_STREQ(tileattn_status_string(TILEATTN_NOT_SUPPORTED), "not supported");
  EXPECT_STREQ(tileattn_status_string(TILEATTN_OUT_OF_MEMORY), "out of memory");
  EXPECT_STREQ(tileattn_status_string(TILEATTN_INTERNAL_ERROR), "internal error");
  EXPECT_STREQ(tileattn_status_string(static_cast<tileattn_status>(99)), "unknown status");
}

}  // namespace
}  // namespace tileattn
