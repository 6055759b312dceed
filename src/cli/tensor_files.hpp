// .npy files as attention operands: shape checks with messages that name the
// file, and conversion to the precision the computation runs in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/npy.hpp"
#include "tileattn/attention.hpp"

namespace tileattn::cli {

// Elements of one tensor in a compute dtype (fp32, or fp16/bf16 bits).
struct TypedBuffer {
  DType dtype = DType::f32;
  std::vector<float> f32;
  std::vector<uint16_t> bits16;
  const void* data() const {
    return dtype == DType::f32 ? static_cast<const void*>(f32.data()) : bits16.data();
  }
  void* data() { return dtype == DType::f32 ? static_cast<void*>(f32.data()) : bits16.data(); }
};

std::string shape_text(const std::vector<int64_t>& shape);  // "(1, 8, 128, 64)"

// Converts a float32/float16 array to `to`, rounding to nearest even. A
// finite value that would round to inf (fp16: |x| >= 65520) is an Error
// naming `flag`, the file `name`, the value and its element index.
TypedBuffer convert_to(const io::NpyArray& array, DType to, const std::string& flag, const std::string& name);
// A zeroed buffer of `elements` elements of `dtype`.
TypedBuffer zeros(DType dtype, int64_t elements);

// What an output file holds for a compute dtype: .npy has no bfloat16, so
// fp16 results are written as float16 and fp32/bf16 results as float32.
io::NpyType output_type(DType compute);
// The bytes of `buffer` as a .npy file of output_type(buffer.dtype).
std::vector<unsigned char> encode_output(const TypedBuffer& buffer, const std::vector<int64_t>& shape);

// Loads an optional mask file for queries [batch, heads, nq] x keys nk into
// `spec`; `storage` keeps converted float16 additive masks alive.
void load_mask(const std::string& path, int64_t batch, int64_t heads, int64_t nq, int64_t nk,
               io::NpyArray& file, std::vector<float>& storage, MaskSpec& spec);

// Reads an attention-sink file (--sinks): float32 (or float16) [heads], one
// logit per query head. Errors name the flag and the file.
std::vector<float> load_sinks(const std::string& path, int64_t heads);

}  // namespace tileattn::cli
