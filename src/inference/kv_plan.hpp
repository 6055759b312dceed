// Validation of KV-cache calls, separated from the writes so that a call
// either passes every check and then writes, or throws and writes nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "tileattn/kv_cache.hpp"

namespace tileattn::detail {

// What an append will do, computed by validate_append without writing.
struct AppendPlan {
  std::vector<int32_t> counts;       // [batch] rows appended per sequence
  std::vector<int32_t> new_lengths;  // [batch] cache_seqlens after the append
};

// Checks the cache description: sizes, dtype, cache_seqlens, the cache
// views, and (paged) that the table covers the current lengths; with
// `writes` (the call appends) also that the cache and int8 scale views reach
// each element once and do not overlap each other, nor fp8 scales the cache.
void validate_cache(const KvCacheArgs& a, bool writes);

// validate_cache plus the new rows: their views, capacity / page coverage for
// the new lengths, page indices, write conflicts between table entries, and
// rotary tables long enough for the new positions, and the call's other
// inputs apart from what it writes (`attends`: attention_with_kvcache, which
// also reads sinks and ALiBi slopes). With seqlen_new == 0 the plan appends
// nothing.
AppendPlan validate_append(const KvCacheArgs& a, bool attends);

// Writes the planned rows into the cache (rotating keys when rotary tables
// are given). Does not touch cache_seqlens.
void write_append(const KvCacheArgs& a, const AppendPlan& plan);

// attention_with_kvcache: o and lse must not overlap the cache (its unused
// rows included: they are storage the next append fills), nor q the cache
// when this call appends to it. Runs before the forward's validation so that
// these errors name k_cache / v_cache; null q or o are left to the forward.
void validate_apart_from_cache(const KvCacheArgs& a, const AppendPlan& plan);

// Checks rotary arguments for queries at positions L_b - seqlen_q .. L_b - 1.
void validate_query_rotary(const KvCacheArgs& a, const std::vector<int32_t>& lengths);

}  // namespace tileattn::detail
