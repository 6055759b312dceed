// Basic vocabulary shared by every public header: element types, ISA names, errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace tileattn {

// Storage type of a tensor. Arithmetic is always fp32 (accumulators, softmax).
// i8 and f8_e4m3 are storage types of quantized KV caches only (KvQuant in
// attention.hpp): never the dtype of q, o or a forward's inputs.
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2, i8 = 3, f8_e4m3 = 4 };

// The largest head dims the operators take: Q and K, and V and O (DeepSeek's
// MLA: 576 / 512 in its absorbed decode).
inline constexpr int64_t kMaxHeadDim = 576;
inline constexpr int64_t kMaxValueHeadDim = 512;

// dtype_name gives "unknown" for a value outside the enum; dtype_size throws
// Error for one.
const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);
// Parses "fp32"/"f32"/"float32", "fp16"/..., "bf16"/...; throws Error otherwise
// (the KV-only storage types are parsed by parse_kv_dtype, attention.hpp).
DType parse_dtype(const std::string& name);

// Instruction-set path. `automatic` picks the best the CPU supports (or the
// one TILEATTN_ISA names). `reference` runs the float64 reference: slow, for
// checking a result on the user's own machine.
// The rungs above avx512 differ from it only for bf16 inputs, whose products
// run as bf16 dot products with fp32 sums: `avx512bf16` on AVX512-BF16's
// vdpbf16ps, `amx` on AMX-BF16 tiles (tdpbf16ps). fp32 and fp16 inputs take
// the avx512 code on both.
enum class Isa : int { automatic = 0, generic = 1, avx2 = 2, avx512 = 3, reference = 4, avx512bf16 = 5, amx = 6 };
// One past the largest Isa value (resolve_isa refuses values outside [0, kIsaCount)).
inline constexpr int kIsaCount = 7;
static_assert(kIsaCount == int(Isa::amx) + 1, "kIsaCount follows the last Isa");

const char* isa_name(Isa isa);
// Parses "generic", "avx2", "avx512", "avx512bf16", "amx", "reference",
// "auto"; throws Error otherwise.
Isa parse_isa(const std::string& name);

// Invalid argument: the message names the argument and what was expected.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A requested feature this build or CPU does not provide.
class NotSupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tileattn
