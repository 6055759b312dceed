// The *_init macros pass sizeof the header's struct to *_init_sized, which
// writes no further than that: a program compiled against an older header
// (a shorter struct) keeps the bytes after its struct, a newer one (longer)
// gets zeros in the fields this library does not know; below the first
// release's size nothing is written. The defaults are those of the whole
// struct's init.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "tileattn/tileattn.h"

namespace tileattn {
namespace {

constexpr unsigned char kCanary = 0xAB;

template <class T>
void expect_sized_init(tileattn_status (*init_sized)(T*, size_t), std::size_t v1_size, const char* name) {
  SCOPED_TRACE(name);
  T full;
  std::memset(static_cast<void*>(&full), kCanary, sizeof full);
  ASSERT_EQ((*init_sized)(&full, sizeof full), TILEATTN_OK) << tileattn_last_error();
  EXPECT_EQ(full.struct_size, sizeof full);

  // An older caller's struct: v1_size bytes, then memory that is not its own.
  alignas(T) unsigned char older[sizeof(T) + 64];
  std::memset(older, kCanary, sizeof older);
  ASSERT_EQ(init_sized(reinterpret_cast<T*>(older), v1_size), TILEATTN_OK) << tileattn_last_error();
  std::size_t struct_size = 0;
  std::memcpy(&struct_size, older, sizeof struct_size);
  EXPECT_EQ(struct_size, v1_size);
  const std::size_t rest = offsetof(T, struct_size) + sizeof(std::size_t);
  EXPECT_EQ(std::memcmp(older + rest, reinterpret_cast<const unsigned char*>(&full) + rest, v1_size - rest), 0)
      << "the first release's fields differ from the whole struct's defaults";
  for (std::size_t i = v1_size; i < sizeof older; ++i) ASSERT_EQ(older[i], kCanary) << "byte " << i << " written";

  // A newer caller's struct: 16 bytes this library does not know, zeroed.
  alignas(T) unsigned char newer[sizeof(T) + 64];
  std::memset(newer, kCanary, sizeof newer);
  ASSERT_EQ(init_sized(reinterpret_cast<T*>(newer), sizeof(T) + 16), TILEATTN_OK) << tileattn_last_error();
  std::memcpy(&struct_size, newer, sizeof struct_size);
  EXPECT_EQ(struct_size, sizeof(T) + 16);
  EXPECT_EQ(std::memcmp(newer + rest, reinterpret_cast<const unsigned char*>(&full) + rest, sizeof(T) - rest), 0);
  for (std::size_t i = sizeof(T); i < sizeof(T) + 16; ++i) ASSERT_EQ(newer[i], 0) << "byte " << i;
  for (std::size_t i = sizeof(T) + 16; i < sizeof newer; ++i) ASSERT_EQ(newer[i], kCanary) << "byte " << i;

  // Not a struct's size at all: refused, nothing written.
  std::memset(older, kCanary, sizeof older);
  EXPECT_EQ(init_sized(reinterpret_cast<T*>(older), std::size_t{1} << 40), TILEATTN_INVALID_ARGUMENT);
  for (unsigned char b : older) ASSERT_EQ(b, kCanary);

  // Shorter than the first release: refused, nothing written.
  std::memset(older, kCanary, sizeof older);
  EXPECT_EQ(init_sized(reinterpret_cast<T*>(older), v1_size - 1), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("struct_size is " + std::to_string(v1_size - 1)),
            std::string::npos)
      << tileattn_last_error();
  for (unsigned char b : older) ASSERT_EQ(b, kCanary);
}

#define TILEATTN_TEST_SIZE_THROUGH(type, member) (offsetof(type, member) + sizeof(((type*)nullptr)->member))

TEST(CApiStructInit, SizedInitWritesNoFurtherThanTheCallersStruct) {
  expect_sized_init(&tileattn_forward_args_init_sized, TILEATTN_TEST_SIZE_THROUGH(tileattn_forward_args, block_kv),
                    "forward");
  expect_sized_init(&tileattn_backward_args_init_sized, TILEATTN_TEST_SIZE_THROUGH(tileattn_backward_args, dv),
                    "backward");
  expect_sized_init(&tileattn_merge_args_init_sized,
                    TILEATTN_TEST_SIZE_THROUGH(tileattn_merge_args, lse_out_stride), "merge");
  expect_sized_init(&tileattn_kv_cache_args_init_sized,
                    TILEATTN_TEST_SIZE_THROUGH(tileattn_kv_cache_args, reserved1), "kv_cache");
  expect_sized_init(&tileattn_cpu_info_init_sized, TILEATTN_TEST_SIZE_THROUGH(tileattn_cpu_info, brand), "cpu_info");
}

// The header's init names are the sized functions with sizeof the argument's
// struct; the unsized functions (for programs built against earlier
// headers) fill the whole struct with the same defaults.
TEST(CApiStructInit, MacroAndFunctionGiveTheSameStruct) {
  tileattn_kv_cache_args by_macro, by_function;
  std::memset(static_cast<void*>(&by_macro), kCanary, sizeof by_macro);
  std::memset(static_cast<void*>(&by_function), 0x5C, sizeof by_function);
  ASSERT_EQ(tileattn_kv_cache_args_init(&by_macro), TILEATTN_OK);
  ASSERT_EQ((tileattn_kv_cache_args_init)(&by_function), TILEATTN_OK);
  EXPECT_EQ(by_macro.struct_size, sizeof by_macro);
  EXPECT_EQ(std::memcmp(&by_macro, &by_function, sizeof by_macro), 0);
}

}  // namespace
}  // namespace tileattn
