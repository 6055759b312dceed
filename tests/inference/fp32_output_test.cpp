// KvCacheArgs::fp32_output: attention_with_kvcache writes O in fp32 for
// 16-bit queries and caches (quantized ones included); rounded to the dtype
// it is the ordinary call's O bit for bit, with the same LSE, and it is fp32
// accurate: against float64 over the cache as stored (dequantized), its
// error is under 1/8 of the 16-bit O's (an O computed in 16 bits and widened
// would have the 16-bit error). Contiguous and paged caches, decode (few
// rows, split keys) and prefill-sized steps, every path the CPU runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "decode_fixture.hpp"
#include "tileattn/machine.hpp"
#include "tileattn/reference.hpp"

namespace tileattn::kvtest {
namespace {

void expect_fp32_output_rounds_to_ordinary(const DecodeSpec& spec) {
  SCOPED_TRACE(spec.name());
  DecodeRun ordinary(spec), wide(spec);
  ordinary.prefill();
  wide.prefill();
  ordinary.decode();
  Buffer o32(DType::f32, wide.o.elements());
  wide.args.o.data = o32.data();
  wide.args.fp32_output = true;
  wide.decode();
  Buffer rounded(spec.dtype, 1);
  for (int64_t i = 0; i < o32.elements(); ++i) {
    rounded.set(0, o32.get(i));  // round to nearest even, as the ordinary call's store
    if (std::memcmp(rounded.data(), static_cast<const char*>(ordinary.o.data()) + i * 2, 2) != 0) {
      ADD_FAILURE() << "O element " << i << ": fp32 " << o32.get(i) << " rounds to " << rounded.get(0)
                    << ", the ordinary call wrote " << ordinary.o.get(i);
      return;
    }
  }
  EXPECT_EQ(std::memcmp(wide.lse.data(), ordinary.lse.data(), ordinary.lse.size() * sizeof(float)), 0)
      << "the LSE differs from the ordinary call's";

  ForwardArgs f = kvcache_forward_args(ordinary.args, ordinary.seqlens.data());
  f.q = {ordinary.q_expected.data(), bhsd(ordinary.batch, spec.heads, spec.new_tokens, spec.head_dim)};
  f.lse = nullptr;
  const ReferenceOutput ref = reference_forward(f);
  double err16 = 0, err32 = 0;
  for (int64_t i = 0; i < o32.elements(); ++i) {
    err16 = std::max(err16, std::abs(double(ordinary.o.get(i)) - ref.o[size_t(i)]));
    err32 = std::max(err32, std::abs(double(o32.get(i)) - ref.o[size_t(i)]));
  }
  EXPECT_GT(err16, 0.0);
  EXPECT_LT(err32, err16 / 8) << "fp32 O error " << err32 << " against the 16-bit O's " << err16;
}

TEST(KvCacheFp32Output, RoundsToTheOrdinaryOutput) {
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx}) {
    if (!isa_available(isa)) continue;
    for (DType dtype : {DType::bf16, DType::f16})
      for (KvQuant quant : {KvQuant::none, KvQuant::int8, KvQuant::fp8_e4m3})
        for (int64_t page_size : {0, 16})
          for (int64_t new_tokens : {1, 40}) {
            DecodeSpec spec;
            spec.isa = isa;
            spec.dtype = dtype;
            spec.kv_quant = quant;
            spec.page_size = page_size;
            spec.cached = {1100, 300};  // 1100: enough keys for a split
            spec.new_tokens = new_tokens;
            expect_fp32_output_rounds_to_ordinary(spec);
          }
  }
}

}  // namespace
}  // namespace tileattn::kvtest
