// A call that appends nothing only reads the cache: views that repeat
// elements (a cache broadcast over the batch, stride 0) or share them (MLA's
// V as the first v_head_dim dims of its K rows) are read as given and give
// what the same values copied into a dense cache give, bit for bit. A call
// that appends to such a cache is refused (kv_hostile_test.cpp,
// kv_bad_input_test.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "support/small_values.hpp"
#include "tileattn/kv_cache.hpp"

namespace tileattn {
namespace {

constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kCapacity = 24, kDim = 48, kDimV = 32;

const auto values = testing_support::small_values;

// attention_with_kvcache of one query token per head, nothing appended.
std::vector<float> attend(const float* k, std::array<int64_t, 4> k_stride, const float* v,
                          std::array<int64_t, 4> v_stride, int64_t head_dim, int64_t v_head_dim) {
  const std::vector<float> q = values(kBatch * kHeads * head_dim, 7);
  std::vector<float> o(size_t(kBatch * kHeads * v_head_dim), 42.0f);
  std::vector<int32_t> seqlens = {kCapacity - 5, kCapacity};
  KvCacheArgs a;
  a.batch = kBatch;
  a.heads = kHeads;
  a.kv_heads = kKvHeads;
  a.head_dim = head_dim;
  a.v_head_dim = v_head_dim;
  a.seqlen_q = 1;
  a.q = {q.data(), {kHeads * head_dim, head_dim, head_dim, 1}};
  a.o = {o.data(), {kHeads * v_head_dim, v_head_dim, v_head_dim, 1}};
  a.k_cache = {const_cast<float*>(k), k_stride};
  a.v_cache = {const_cast<float*>(v), v_stride};
  a.capacity = kCapacity;
  a.cache_seqlens = seqlens.data();
  a.threads = 1;
  attention_with_kvcache(a);
  EXPECT_EQ(seqlens[0], kCapacity - 5);  // nothing appended
  return o;
}

TEST(KvCacheReadOnlyViews, BroadcastCacheIsReadWhenNothingIsAppended) {
  // One sequence's [Hkv, capacity, D] cache, batch stride 0.
  const std::vector<float> k = values(kKvHeads * kCapacity * kDim, 1), v = values(kKvHeads * kCapacity * kDim, 2);
  const std::array<int64_t, 4> stride = {0, kCapacity * kDim, kDim, 1};
  std::vector<float> k_dense, v_dense;
  for (int64_t b = 0; b < kBatch; ++b) {
    k_dense.insert(k_dense.end(), k.begin(), k.end());
    v_dense.insert(v_dense.end(), v.begin(), v.end());
  }
  const std::array<int64_t, 4> dense = {kKvHeads * kCapacity * kDim, kCapacity * kDim, kDim, 1};
  const std::vector<float> got = attend(k.data(), stride, v.data(), stride, kDim, kDim);
  const std::vector<float> want = attend(k_dense.data(), dense, v_dense.data(), dense, kDim, kDim);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST(KvCacheReadOnlyViews, ValuesSharingTheKeyRowsAreReadWhenNothingIsAppended) {
  // MLA's absorbed decode: V is the first kDimV dims of each K row.
  const std::vector<float> k = values(kBatch * kKvHeads * kCapacity * kDim, 3);
  const std::array<int64_t, 4> k_stride = {kKvHeads * kCapacity * kDim, kCapacity * kDim, kDim, 1};
  std::vector<float> v_dense;
  for (int64_t row = 0; row < kBatch * kKvHeads * kCapacity; ++row)
    v_dense.insert(v_dense.end(), k.begin() + row * kDim, k.begin() + row * kDim + kDimV);
  const std::array<int64_t, 4> v_stride = {kKvHeads * kCapacity * kDimV, kCapacity * kDimV, kDimV, 1};
  const std::vector<float> got = attend(k.data(), k_stride, k.data(), k_stride, kDim, kDimV);
  const std::vector<float> want = attend(k.data(), k_stride, v_dense.data(), v_stride, kDim, kDimV);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace tileattn
