#include "cli/tensor_files.hpp"

#include <cmath>
#include <cstdio>

#include "core/half.hpp"

namespace tileattn::cli {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

TypedBuffer zeros(DType dtype, int64_t elements) {
  TypedBuffer b;
  b.dtype = dtype;
  if (dtype == DType::f32) b.f32.assign(size_t(elements), 0.0f);
  else b.bits16.assign(size_t(elements), 0);
  return b;
}

TypedBuffer convert_to(const io::NpyArray& array, DType to, const std::string& flag, const std::string& name) {
  if (array.type == io::NpyType::boolean)
    throw Error(name + ": a bool or uint8 array (|b1, |u1: mask types) is not a valid attention input (expected float32 or float16)");
  const int64_t n = array.elements();
  TypedBuffer out;
  out.dtype = to;
  const bool from_f32 = array.type == io::NpyType::f32;
  auto value = [&](int64_t i) {
    return from_f32 ? array.f32()[i] : detail::f16_to_float(array.f16()[i]);  // both exact
  };
  if (to == DType::f32) {
    out.f32.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) out.f32[size_t(i)] = value(i);
    return out;
  }
  out.bits16.resize(size_t(n));
  if (to == DType::f16 && !from_f32) {
    for (int64_t i = 0; i < n; ++i) out.bits16[size_t(i)] = array.f16()[i];
    return out;
  }
  const bool half = to == DType::f16;
  for (int64_t i = 0; i < n; ++i) {
    const float x = value(i);
    const uint16_t bits = half ? detail::float_to_f16(x) : detail::float_to_bf16(x);
    // A finite value that rounds to inf would silently become inf (and the
    // outputs NaN); inf and NaN already in the input keep their meaning.
    const float back = half ? detail::f16_to_float(bits) : detail::bf16_to_float(bits);
    if (std::isfinite(x) && !std::isfinite(back)) {
      char message[160];
      std::snprintf(message, sizeof message, " holds %g (element %lld), outside %s's range (%g); ", double(x),
                    (long long)i, half ? "fp16" : "bf16", half ? 65504.0 : double(detail::bf16_to_float(0x7f7f)));
      throw Error(flag + ": " + name + message + "scale the input or compute in " +
                  (half ? "bf16 or fp32" : "fp32") + " (--dtype)");
    }
    out.bits16[size_t(i)] = bits;
  }
  return out;
}

io::NpyType output_type(DType compute) { return compute == DType::f16 ? io::NpyType::f16 : io::NpyType::f32; }

std::vector<unsigned char> encode_output(const TypedBuffer& buffer, const std::vector<int64_t>& shape) {
  if (buffer.dtype != DType::bf16) return io::encode_npy(output_type(buffer.dtype), shape, buffer.data());
  std::vector<float> widened(buffer.bits16.size());  // bf16 -> fp32 is exact
  for (std::size_t i = 0; i < widened.size(); ++i) widened[i] = detail::bf16_to_float(buffer.bits16[i]);
  return io::encode_npy(io::NpyType::f32, shape, widened.data());
}

void load_mask(const std::string& path, int64_t batch, int64_t heads, int64_t nq, int64_t nk,
               io::NpyArray& file, std::vector<float>& storage, MaskSpec& spec) {
  file = io::read_npy(path);
  const std::vector<int64_t>& s = file.shape;
  if (s.size() == 2 && s[0] == nq && s[1] == nk) {
    spec.stride = {0, 0, nk, 1};  // one mask broadcast over batch and heads
  } else if (s.size() == 4 && s[0] == batch && s[1] == heads && s[2] == nq && s[3] == nk) {
    spec.stride = {heads * nq * nk, nq * nk, nk, 1};
  } else {
    throw Error(path + ": mask shape " + shape_text(s) + " must be [Nq, Nk] = " + shape_text({nq, nk}) +
                " or [B, Hq, Nq, Nk] = " + shape_text({batch, heads, nq, nk}));
  }
  switch (file.type) {
    case io::NpyType::boolean:
      spec.kind = MaskSpec::Kind::boolean;  // numpy bools are bytes 0/1; nonzero = keep
      spec.data = file.u8();
      break;
    case io::NpyType::f32:
      spec.kind = MaskSpec::Kind::additive;
      spec.data = file.f32();
      break;
    case io::NpyType::f16:
      storage.resize(size_t(file.elements()));
      for (std::size_t i = 0; i < storage.size(); ++i) storage[i] = detail::f16_to_float(file.f16()[i]);
      spec.kind = MaskSpec::Kind::additive;
      spec.data = storage.data();
      break;
  }
}

std::vector<float> load_sinks(const std::string& path, int64_t heads) {
  const io::NpyArray file = io::read_npy(path);
  if (file.shape.size() != 1 || file.shape[0] != heads)
    throw Error("--sinks " + path + ": shape " + shape_text(file.shape) + " must be [Hq] = " +
                shape_text({heads}) + " (one sink logit per query head)");
  if (file.type == io::NpyType::boolean)
    throw Error("--sinks " + path + ": dtype bool; expected float32 or float16 logits");
  std::vector<float> sinks(static_cast<size_t>(heads), 0.0f);
  for (int64_t h = 0; h < heads; ++h)
    sinks[size_t(h)] = file.type == io::NpyType::f32 ? file.f32()[h] : detail::f16_to_float(file.f16()[h]);
  return sinks;  // finiteness is the library's check (it names sinks[h])
}

}  // namespace tileattn::cli
