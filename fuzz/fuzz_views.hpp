// Buffers for strided views that the fuzz targets own: each is sized to
// exactly the bytes its view may touch (so ASan sees any access outside a
// view) and pre-filled with a sentinel (so writes outside it show), the
// checks on them, and the stride, value and score-modifier generators the
// targets share.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tileattn/attention.hpp"

namespace fuzzviews {

using tileattn::DType;

constexpr int64_t kMaxBufferBytes = int64_t{4} << 20;  // views larger than this are not allocated
constexpr unsigned char kSentinel = 0xA5;

// A buffer covering a strided view: bytes [lo, hi) relative to the view's origin.
struct ViewBuffer {
  std::vector<unsigned char> bytes;
  int64_t origin = 0;           // byte index of element (0, 0, 0, 0)
  bool overflow = false;        // the extent does not fit int64: the library must refuse
                                // (the pointer then names a 64-byte buffer)
  bool too_large = false;       // fits int64 but larger than kMaxBufferBytes: not allocated
  void* data() { return bytes.empty() ? nullptr : bytes.data() + origin; }
};

// Sizes the buffer of a view the way a caller would: every element the view
// names must be inside it.
inline ViewBuffer make_view_buffer(const int64_t* sizes, const int64_t* strides, int rank, int64_t esize) {
  ViewBuffer b;
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < rank; ++i)
    if (sizes[i] <= 0) {
      b.bytes.assign(64, kSentinel);  // empty view: a valid pointer, nothing to touch
      return b;
    }
  for (int i = 0; i < rank; ++i) {
    int64_t span;
    if (__builtin_mul_overflow(sizes[i] - 1, strides[i], &span) ||
        __builtin_mul_overflow(span, esize, &span) ||
        (span < 0 ? __builtin_add_overflow(lo, span, &lo) : __builtin_add_overflow(hi, span, &hi))) {
      b.overflow = true;
      b.bytes.assign(64, kSentinel);
      return b;
    }
  }
  int64_t total;
  if (__builtin_sub_overflow(hi, lo, &total) || __builtin_add_overflow(total, esize, &total)) {
    b.overflow = true;
    b.bytes.assign(64, kSentinel);
    return b;
  }
  if (total > kMaxBufferBytes) {
    b.too_large = true;
    return b;
  }
  b.bytes.assign(size_t(total), kSentinel);
  b.origin = -lo;
  return b;
}

// Marks the bytes of every element of a view (rank <= 4) in `mask`, a
// buffer of the view's bytes (make_view_buffer: every element starts a whole
// number of elements from the buffer's start). The set of elements is built
// one dimension at a time, each a dilation of the set so far by the
// dimension's offsets {0, stride, ..., (size - 1) stride}: a sliding window
// along each residue class of the stride, linear in the buffer whatever the
// sizes: a view may name billions of elements over a few bytes (zero or
// overlapping strides), more than a loop over its elements visits within the
// fuzzer's time limit (docs/reliability.md, "The harness timeout").
inline void mark_view(std::vector<unsigned char>& mask, int64_t origin, const int64_t* sizes,
                      const int64_t* strides, int rank, int64_t esize) {
  const int64_t slots = int64_t(mask.size()) / esize;
  std::vector<unsigned char> set(size_t(slots), 0), next(size_t(slots), 0);
  set[size_t(origin / esize)] = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t n = sizes[i], stride = strides[i];
    if (n <= 1 || stride == 0) continue;
    const int64_t step = stride < 0 ? -stride : stride;
    for (int64_t r = 0; r < step && r < slots; ++r) {
      // The residue class r, r + step, ... walked in the stride's direction:
      // slot x is in the next set when one of the n slots x, x - stride, ...,
      // x - (n - 1) stride is in this one.
      const int64_t count = (slots - 1 - r) / step + 1;
      int64_t in_window = 0;
      for (int64_t j = 0; j < count; ++j) {
        const int64_t at = stride > 0 ? r + j * step : r + (count - 1 - j) * step;
        in_window += set[size_t(at)];
        if (j >= n) in_window -= set[size_t(stride > 0 ? at - n * step : at + n * step)];
        next[size_t(at)] = in_window > 0;
      }
    }
    set.swap(next);
  }
  for (int64_t x = 0; x < slots; ++x)
    if (set[size_t(x)]) std::fill_n(mask.begin() + x * esize, esize, 1);
}

// Every size positive: the view names at least one element.
inline bool nonempty(const int64_t* sizes, int rank) {
  for (int i = 0; i < rank; ++i)
    if (sizes[i] <= 0) return false;
  return true;
}

// No byte of the buffer differs from the sentinel: nothing was written.
inline bool untouched(const ViewBuffer& buf) {
  for (unsigned char b : buf.bytes)
    if (b != kSentinel) return false;
  return true;
}

// Some byte of the buffer outside its view (rank <= 4) differs from the sentinel.
inline bool written_outside(const ViewBuffer& buf, const int64_t* sizes, const int64_t* strides, int rank,
                            int64_t esize) {
  if (buf.overflow || buf.bytes.empty()) return false;  // an overflowing view's buffer holds no element
  std::vector<unsigned char> inside(buf.bytes.size(), 0);
  if (nonempty(sizes, rank)) mark_view(inside, buf.origin, sizes, strides, rank, esize);
  for (size_t i = 0; i < buf.bytes.size(); ++i)
    if (!inside[i] && buf.bytes[i] != kSentinel) return true;
  return false;
}

// The element at byte `at` (f32, f16 or bf16), as a float.
inline float value_at(const std::vector<unsigned char>& bytes, size_t at, DType dtype) {
  if (dtype == DType::f32) {
    float f;
    std::memcpy(&f, &bytes[at], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &bytes[at], 2);
  if (dtype == DType::bf16) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const int exponent = (h >> 10) & 31, mantissa = h & 1023;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (exponent == 31) return mantissa ? std::numeric_limits<float>::quiet_NaN() : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(float(mantissa), -24);
  return sign * std::ldexp(float(mantissa | 1024), exponent - 25);
}

// Every element of the buffer (f32, f16 or bf16) finite and at most `bound` in magnitude.
inline bool moderate(const ViewBuffer& buf, DType dtype, float bound) {
  const size_t esize = tileattn::dtype_size(dtype);
  for (size_t i = 0; i + esize <= buf.bytes.size(); i += esize) {
    const float x = value_at(buf.bytes, i, dtype);
    if (!std::isfinite(x) || std::fabs(x) > bound) return false;
  }
  return true;
}

// Strides of a [b, h, n, d] view: dense in either layout, or arbitrary small
// values (negative, zero, overlapping), or huge ones that overflow.
inline std::array<int64_t, 4> pick_strides(FuzzedDataProvider& in, const int64_t* sizes) {
  // Sizes whose dense strides overflow int64: strides as large as they get.
  constexpr std::array<int64_t, 4> overflowing{std::numeric_limits<int64_t>::max(),
                                               std::numeric_limits<int64_t>::max(),
                                               std::numeric_limits<int64_t>::max(), 1};
  const int kind = in.ConsumeIntegralInRange<int>(0, 5);
  try {
    switch (kind) {
      case 0: return tileattn::dense_strides(tileattn::Layout::bhsd, sizes[0], sizes[1], sizes[2], sizes[3]);
      case 1: return tileattn::dense_strides(tileattn::Layout::bshd, sizes[0], sizes[1], sizes[2], sizes[3]);
      case 2: {
        auto s = tileattn::dense_strides(tileattn::Layout::bhsd, sizes[0], sizes[1], sizes[2], sizes[3]);
        s[2] += in.ConsumeIntegralInRange<int64_t>(0, 7);  // padded rows
        if (__builtin_mul_overflow(s[2], sizes[2], &s[1]) || __builtin_mul_overflow(s[1], sizes[1], &s[0]))
          return overflowing;
        return s;
      }
      case 3: {
        std::array<int64_t, 4> s;
        for (auto& x : s) x = in.ConsumeIntegralInRange<int64_t>(-64, 64);
        return s;
      }
      case 4: {
        auto s = tileattn::dense_strides(tileattn::Layout::bhsd, sizes[0], sizes[1], sizes[2], sizes[3]);
        s[size_t(in.ConsumeIntegralInRange<int>(0, 3))] = in.ConsumeIntegral<int64_t>();
        return s;
      }
      default: {
        std::array<int64_t, 4> s;
        for (auto& x : s) x = in.ConsumeIntegral<int64_t>();
        return s;
      }
    }
  } catch (const tileattn::Error&) {  // dense_strides refuses sizes whose strides overflow
  }
  return overflowing;
}

// Element values: mostly small, sometimes NaN, infinities, huge or denormal.
inline void fill_values(FuzzedDataProvider& in, ViewBuffer& buf, DType dtype) {
  if (buf.bytes.empty()) return;
  uint32_t state = in.ConsumeIntegral<uint32_t>() | 1u;
  const int special = in.ConsumeIntegralInRange<int>(0, 7);
  const size_t esize = tileattn::dtype_size(dtype);
  for (size_t i = 0; i + esize <= buf.bytes.size(); i += esize) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    float v = float(int(state % 2001) - 1000) / 500.0f;
    if (special && state % 97 == 0) {
      const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                1e30f, -1e30f, 1e-40f, 0.0f};
      v = specials[size_t(special - 1)];
    }
    if (esize == 4) {
      std::memcpy(&buf.bytes[i], &v, 4);
    } else if (esize == 1) {
      buf.bytes[i] = static_cast<unsigned char>(state >> 3);  // int8 / fp8 e4m3: any byte
    } else {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t half = uint16_t(bits >> 16);  // bf16 bits; as f16 just another pattern
      std::memcpy(&buf.bytes[i], &half, 2);
    }
  }
}

// Score modifiers of ForwardArgs and KvCacheArgs, each present or not: a
// soft cap, ALiBi slopes ([heads] with batch stride 0, [batch, heads] with
// stride heads, or any small stride, negative too) and attention sinks
// ([heads]), with values in range and out (negative, NaN, inf, huge). The
// slopes and sinks are views (fp32) sized as the others, so ASan sees a read
// past them.
struct ScoreModifiers {
  float softcap = 0.0f;
  bool has_alibi = false, has_sinks = false;
  int64_t alibi_batch_stride = 0;
  ViewBuffer slopes, sinks;
  // Every value present keeps the output finite for moderate inputs: a cap of
  // 0 or >= 0.5, finite slopes of at most 8, finite sinks of at most 1e30.
  bool moderate = true;

  template <class Args>
  void apply(Args& a) {
    a.softcap = softcap;
    a.alibi_slopes = has_alibi ? reinterpret_cast<const float*>(slopes.data()) : nullptr;
    a.alibi_batch_stride = alibi_batch_stride;
    a.sinks = has_sinks ? reinterpret_cast<const float*>(sinks.data()) : nullptr;
  }
};

inline ScoreModifiers pick_score_modifiers(FuzzedDataProvider& in, int64_t batch, int64_t heads) {
  constexpr float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  ScoreModifiers m;
  batch = std::max<int64_t>(batch, 0);
  heads = std::max<int64_t>(heads, 0);
  // Each fp32 element of `buf` from `table`; `within`: the largest magnitude that counts as moderate.
  const auto fill = [&](ViewBuffer& buf, const float (&table)[8], float within) {
    for (size_t i = 0; i + 4 <= buf.bytes.size(); i += 4) {
      const float x = table[in.ConsumeIntegralInRange<int>(0, 7)];
      if (!std::isfinite(x) || std::fabs(x) > within) m.moderate = false;
      std::memcpy(&buf.bytes[i], &x, 4);
    }
  };
  if (in.ConsumeBool()) {
    const float caps[] = {0.0f, 0.5f, 20.0f, 50.0f, -1.0f, nan, inf, 1e-38f};
    m.softcap = caps[in.ConsumeIntegralInRange<int>(0, 7)];
    if (m.softcap != 0.0f && !(m.softcap >= 0.5f)) m.moderate = false;
  }
  if (in.ConsumeBool()) {
    const int mode = in.ConsumeIntegralInRange<int>(0, 2);
    m.alibi_batch_stride = mode == 0 ? 0 : mode == 1 ? heads : in.ConsumeIntegralInRange<int64_t>(-2, 8);
    const int64_t sizes[2] = {batch, heads}, strides[2] = {m.alibi_batch_stride, 1};
    m.slopes = make_view_buffer(sizes, strides, 2, 4);
    const float slopes[] = {0.5f, 0.0625f, 0.0f, -1.0f, 8.0f, nan, inf, 1e30f};
    fill(m.slopes, slopes, 8.0f);
    m.has_alibi = true;
  }
  if (in.ConsumeBool()) {
    const int64_t sizes[1] = {heads}, strides[1] = {1};
    m.sinks = make_view_buffer(sizes, strides, 1, 4);
    const float sinks[] = {0.0f, 2.5f, -30.0f, 80.0f, 1e38f, 3e38f, nan, -inf};
    fill(m.sinks, sinks, 1e30f);
    m.has_sinks = true;
  }
  return m;
}

}  // namespace fuzzviews
