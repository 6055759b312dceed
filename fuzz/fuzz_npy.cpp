// Fuzzes the .npy reader with arbitrary bytes: truncated, oversized,
// malformed or lying headers. parse_npy must either throw tileattn::Error or
// return an array whose data size matches its shape and which survives a
// write/read round trip unchanged. ASan/UBSan report anything else.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "io/npy.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_npy: property violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tileattn::io;
  NpyArray array;
  try {
    array = parse_npy(data, size, "fuzz.npy");
  } catch (const tileattn::Error&) {
    return 0;
  }
  int64_t elements = 1;
  for (int64_t d : array.shape) {
    if (d < 0) fail("negative dimension accepted");
    elements *= d;  // cannot overflow: the data is in memory
  }
  if (uint64_t(elements) * npy_type_size(array.type) != array.bytes.size())
    fail("data size does not match the shape");
  const std::vector<unsigned char> encoded = encode_npy(array.type, array.shape, array.bytes.data());
  const NpyArray again = parse_npy(encoded.data(), encoded.size(), "round-trip.npy");
  if (again.type != array.type || again.shape != array.shape || again.bytes != array.bytes)
    fail("write/read round trip changed the array");
  return 0;
}
