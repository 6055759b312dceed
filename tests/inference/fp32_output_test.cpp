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
#include "testing/case_table.hpp"
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
  std::vector<Isa> paths;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    if (isa_available(isa)) paths.push_back(isa);
  const DType dtypes[] = {DType::bf16, DType::f16};
  const KvQuant quants[] = {KvQuant::none, KvQuant::int8, KvQuant::fp8_e4m3};
  const int64_t page_sizes[] = {0, 16}, new_token_counts[] = {1, 40};
  for (size_t path = 0; path < paths.size(); ++path)
    for (int d = 0; d < 2; ++d)
      for (int q = 0; q < 3; ++q)
        for (int pg = 0; pg < 2; ++pg)
          for (int nt = 0; nt < 2; ++nt) {
            // Under the sanitizers each combination on one path (the sum of the counters
            // picks it, so every path meets every dtype, cache and step size).
            if (!tileattn::testing::in_quick_share(d + q + pg + nt, int64_t(path), int64_t(paths.size()))) continue;
            DecodeSpec spec;
            spec.isa = paths[path];
            spec.dtype = dtypes[d];
            spec.kv_quant = quants[q];
            spec.page_size = page_sizes[pg];
            spec.cached = {1100, 300};  // 1100: enough keys for a split
            spec.new_tokens = new_token_counts[nt];
            expect_fp32_output_rounds_to_ordinary(spec);
          }
}

}  // namespace
}  // namespace tileattn::kvtest
