// tileattn_tune_config: an opaque handle over the tune file's entries.
#include <cstring>
#include <memory>
#include <vector>

#include "capi/convert.hpp"
#include "capi/guard.hpp"
#include "tileattn/machine.hpp"

using namespace tileattn;

struct tileattn_tune_config {
  std::vector<TuneEntry> entries;
};

namespace {

std::string path_or_default(const char* path) { return path ? std::string(path) : tune_file_path(); }

}  // namespace

extern "C" {

tileattn_status tileattn_tune_config_create(tileattn_tune_config** config) {
  return capi::guarded(__func__, [&] {
    capi::require(config, "config");
    *config = new tileattn_tune_config;
  });
}

tileattn_status tileattn_tune_config_load(const char* path, tileattn_tune_config** config) {
  return capi::guarded(__func__, [&] {
    capi::require(config, "config");
    auto loaded = std::make_unique<tileattn_tune_config>();
    loaded->entries = read_tune_file(path_or_default(path));
    // Entries the C API cannot name (an unknown isa or dtype) are reported,
    // not silently dropped.
    for (const TuneEntry& e : loaded->entries) {
      parse_isa(e.isa);
      parse_dtype(e.dtype);
    }
    *config = loaded.release();
  });
}

tileattn_status tileattn_tune_config_destroy(tileattn_tune_config* config) {
  return capi::guarded(__func__, [&] { delete config; });
}

tileattn_status tileattn_tune_config_set(tileattn_tune_config* config, int32_t isa, int64_t head_dim,
                                         int32_t dtype, int32_t block_q, int32_t block_kv) {
  return capi::guarded(__func__, [&] {
    capi::require(config, "config");
    const Isa path = capi::to_isa(isa, "isa");
    if (path == Isa::automatic || path == Isa::reference)
      throw Error("isa: a tune entry names a concrete kernel path (generic, avx2, avx512, avx512bf16 or amx)");
    const DType type = capi::to_dtype(dtype, "dtype");
    if (head_dim < 1 || head_dim > kMaxHeadDim)
      throw Error("head_dim must be in 1.." + std::to_string(kMaxHeadDim) + ", got " + std::to_string(head_dim));
    if (block_q < 1 || block_q > 1024) throw Error("block_q must be in 1..1024, got " + std::to_string(block_q));
    if (block_kv < 1 || block_kv > 1024)
      throw Error("block_kv must be in 1..1024, got " + std::to_string(block_kv));
    TuneEntry entry{isa_name(path), head_dim, dtype_name(type), block_q, block_kv};
    for (TuneEntry& e : config->entries) {
      if (e.isa == entry.isa && e.head_dim == entry.head_dim && e.dtype == entry.dtype) {
        e = entry;
        return;
      }
    }
    config->entries.push_back(entry);
  });
}

tileattn_status tileattn_tune_config_count(const tileattn_tune_config* config, int64_t* count) {
  return capi::guarded(__func__, [&] {
    capi::require(config, "config");
    capi::require(count, "count");
    *count = int64_t(config->entries.size());
  });
}

tileattn_status tileattn_tune_config_get(const tileattn_tune_config* config, int64_t index, int32_t* isa,
                                         int64_t* head_dim, int32_t* dtype, int32_t* block_q,
                                         int32_t* block_kv) {
  return capi::guarded(__func__, [&] {
    capi::require(config, "config");
    if (index < 0 || index >= int64_t(config->entries.size()))
      throw Error("index " + std::to_string(index) + " is out of range 0.." +
                  std::to_string(int64_t(config->entries.size()) - 1));
    capi::require(isa, "isa");
    capi::require(head_dim, "head_dim");
    capi::require(dtype, "dtype");
    capi::require(block_q, "block_q");
    capi::require(block_kv, "block_kv");
    const TuneEntry& e = config->entries[size_t(index)];
    *isa = capi::from_isa(parse_isa(e.isa));
    *dtype = int32_t(parse_dtype(e.dtype));
    *head_dim = e.head_dim;
    *block_q = e.block_q;
    *block_kv = e.block_kv;
  });
}

tileattn_status tileattn_tune_config_save(const tileattn_tune_config* config, const char* path) {
  return capi::guarded(__func__, [&] {
    capi::require(config, "config");
    write_tune_file(path_or_default(path), config->entries);
  });
}

tileattn_status tileattn_tune_file_path(char* buffer, size_t capacity, size_t* length) {
  return capi::guarded(__func__, [&] {
    const std::string path = tune_file_path();
    if (length) *length = path.size();
    capi::require(buffer, "buffer");
    if (capacity < path.size() + 1)
      throw Error("capacity " + std::to_string(capacity) + " is too small for the path (" +
                  std::to_string(path.size() + 1) + " bytes with the terminating NUL)");
    std::memcpy(buffer, path.data(), path.size() + 1);
  });
}

}  // extern "C"
