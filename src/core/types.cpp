#include <cmath>

#include "tileattn/attention.hpp"
#include "tileattn/types.hpp"

namespace tileattn {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::i8: return "int8";
    case DType::f8_e4m3: return "fp8_e4m3";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::i8:
    case DType::f8_e4m3: return 1;
  }
  throw Error("dtype: unknown value " + std::to_string(int(dtype)));
}

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::f32;
  if (name == "fp16" || name == "f16" || name == "float16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  throw Error("dtype: expected fp32, fp16 or bf16, got '" + name + "'");
}

const char* kv_quant_name(KvQuant quant) {
  switch (quant) {
    case KvQuant::none: return "none";
    case KvQuant::int8: return "int8";
    case KvQuant::fp8_e4m3: return "fp8_e4m3";
  }
  return "unknown";
}

DType kv_storage_dtype(DType dtype, KvQuant quant) {
  switch (quant) {
    case KvQuant::int8: return DType::i8;
    case KvQuant::fp8_e4m3: return DType::f8_e4m3;
    default: return dtype;
  }
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::automatic: return "auto";
    case Isa::generic: return "generic";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::amx: return "amx";
    case Isa::reference: return "reference";
  }
  return "unknown";
}

Isa parse_isa(const std::string& name) {
  if (name == "auto" || name.empty()) return Isa::automatic;
  if (name == "generic" || name == "portable") return Isa::generic;
  if (name == "avx2") return Isa::avx2;
  if (name == "avx512") return Isa::avx512;
  if (name == "avx512bf16") return Isa::avx512bf16;
  if (name == "amx") return Isa::amx;
  if (name == "reference") return Isa::reference;
  throw Error("isa: expected auto, generic, avx2, avx512, avx512bf16, amx or reference, got '" + name + "'");
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::bhsd: return "bhsd";
    case Layout::bshd: return "bshd";
  }
  return "unknown";
}

Layout parse_layout(const std::string& name) {
  if (name == "bhsd") return Layout::bhsd;
  if (name == "bshd") return Layout::bshd;
  throw Error("layout: expected bhsd or bshd, got '" + name + "'");
}

std::array<int64_t, 4> dense_strides(Layout layout, int64_t batch, int64_t heads, int64_t rows,
                                     int64_t dim) {
  if (layout != Layout::bhsd && layout != Layout::bshd)
    throw Error("dense_strides: layout: unknown value " + std::to_string(int(layout)));
  if (batch < 0 || heads < 0 || rows < 0 || dim < 0)
    throw Error("dense_strides: sizes must be >= 0, got batch " + std::to_string(batch) + ", heads " +
                std::to_string(heads) + ", rows " + std::to_string(rows) + ", dim " + std::to_string(dim));
  // Sizes no tensor can have would overflow the products (undefined behaviour).
  int64_t row_stride = 0, outer_stride = 0;
  const int64_t inner = layout == Layout::bhsd ? rows : heads;
  if (__builtin_mul_overflow(inner, dim, &row_stride) ||
      __builtin_mul_overflow(layout == Layout::bhsd ? heads : rows, row_stride, &outer_stride))
    throw Error("dense_strides: heads x rows x head_dim overflows int64 (" + std::to_string(heads) + " x " +
                std::to_string(rows) + " x " + std::to_string(dim) + ")");
  if (layout == Layout::bhsd) return {outer_stride, row_stride, dim, 1};
  return {outer_stride, dim, row_stride, 1};
}

}  // namespace tileattn
