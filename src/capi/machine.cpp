// Machine queries: CPU features, caches, ISA paths and tile shapes.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "capi/convert.hpp"
#include "capi/guard.hpp"
#include "tileattn/machine.hpp"

using namespace tileattn;

namespace {

void copy_truncated(char* destination, std::size_t capacity, const std::string& source) {
  const std::size_t n = std::min(capacity - 1, source.size());
  std::memcpy(destination, source.data(), n);
  destination[n] = '\0';
}

constexpr std::size_t kCpuInfoV1Size = TILEATTN_CAPI_SIZE_THROUGH(tileattn_cpu_info, brand);

// The C runtime installed last, behind one C++ ThreadRuntime that forwards
// to it (its run has no user data to carry the pointer).
std::atomic<const tileattn_thread_runtime*>& installed_c_runtime() {
  static std::atomic<const tileattn_thread_runtime*> runtime{nullptr};
  return runtime;
}

void run_on_c_runtime(void (*fn)(void*, int, int), void* ctx, int threads) {
  installed_c_runtime().load(std::memory_order_acquire)->run(fn, ctx, threads);
}

// What the C++ side holds while a C runtime is installed; the C API reports
// the C runtime's own name instead of this one.
const ThreadRuntime kCRuntime{"C API thread runtime", run_on_c_runtime};

}  // namespace

extern "C" {

tileattn_status(tileattn_cpu_info_init)(tileattn_cpu_info* info) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(info, sizeof *info, kCpuInfoV1Size, capi::zeroed_struct<tileattn_cpu_info>(), "info");  // the whole struct
  });
}

tileattn_status tileattn_cpu_info_init_sized(tileattn_cpu_info* info, size_t struct_size) {
  return capi::guarded(__func__, [&] {
    capi::init_versioned(info, struct_size, kCpuInfoV1Size, capi::zeroed_struct<tileattn_cpu_info>(), "info");
  });
}

tileattn_status tileattn_get_cpu_info(tileattn_cpu_info* info) {
  return capi::guarded(__func__, [&] {
    capi::require(info, "info");
    const CpuFeatures& f = cpu_features();
    const CacheSizes& c = cache_sizes();
    tileattn_cpu_info filled = capi::zeroed_struct<tileattn_cpu_info>();
    filled.avx2 = f.avx2;
    filled.fma = f.fma;
    filled.f16c = f.f16c;
    filled.avx512f = f.avx512f;
    filled.avx512bw = f.avx512bw;
    filled.avx512dq = f.avx512dq;
    filled.avx512vl = f.avx512vl;
    filled.avx512_vnni = f.avx512_vnni;
    filled.avx512_bf16 = f.avx512_bf16;
    filled.avx512_fp16 = f.avx512_fp16;
    filled.hardware_threads = hardware_threads();
    filled.best_isa = capi::from_isa(best_isa());
    filled.l1d_bytes = c.l1d;
    filled.l2_bytes = c.l2;
    filled.l3_bytes = c.l3;
    copy_truncated(filled.vendor, sizeof filled.vendor, f.vendor);
    copy_truncated(filled.brand, sizeof filled.brand, f.brand);
    filled.amx_bf16 = f.amx_bf16;
    filled.amx_int8 = f.amx_int8;
    filled.family = f.family;
    filled.model = f.model;
    capi::write_versioned(filled, info, "info", kCpuInfoV1Size);
  });
}

tileattn_status tileattn_isa_available(int32_t isa, int32_t* available) {
  return capi::guarded(__func__, [&] {
    const Isa path = capi::to_isa(isa, "isa");
    capi::require(available, "available");
    *available = isa_available(path);
  });
}

tileattn_status tileattn_resolve_isa(int32_t requested, int32_t* resolved) {
  return capi::guarded(__func__, [&] {
    const Isa path = capi::to_isa(requested, "requested");
    capi::require(resolved, "resolved");
    *resolved = capi::from_isa(resolve_isa(path));
  });
}

tileattn_status tileattn_isa_name(int32_t isa, const char** name) {
  return capi::guarded(__func__, [&] {
    const Isa path = capi::to_isa(isa, "isa");
    capi::require(name, "name");
    *name = tileattn::isa_name(path);
  });
}

tileattn_status tileattn_choose_tiles(int32_t isa, int64_t head_dim, int32_t dtype,
                                      int32_t* block_q, int32_t* block_kv) {
  return capi::guarded(__func__, [&] {
    const Isa path = capi::to_isa(isa, "isa");
    const DType type = capi::to_dtype(dtype, "dtype");
    if (head_dim < 1 || head_dim > kMaxHeadDim)
      throw Error("head_dim must be in 1.." + std::to_string(kMaxHeadDim) + ", got " + std::to_string(head_dim));
    capi::require(block_q, "block_q");
    capi::require(block_kv, "block_kv");
    const TileShape tiles = choose_tiles(resolve_isa(path), head_dim, type);
    *block_q = tiles.block_q;
    *block_kv = tiles.block_kv;
  });
}

tileattn_status tileattn_dense_strides(int32_t layout, int64_t batch, int64_t heads, int64_t rows,
                                       int64_t dim, int64_t stride[4]) {
  return capi::guarded(__func__, [&] {
    if (layout != TILEATTN_LAYOUT_BHSD && layout != TILEATTN_LAYOUT_BSHD)
      throw Error("layout: unknown value " + std::to_string(layout));
    if (batch < 0 || heads < 0 || rows < 0 || dim < 0) throw Error("sizes must be >= 0");
    capi::require(stride, "stride");
    int64_t product;
    if (__builtin_mul_overflow(heads, rows, &product) || __builtin_mul_overflow(product, dim, &product) ||
        __builtin_mul_overflow(product, batch, &product))
      throw Error("sizes: element count overflows int64");
    const auto s = tileattn::dense_strides(layout == TILEATTN_LAYOUT_BHSD ? Layout::bhsd : Layout::bshd,
                                           batch, heads, rows, dim);
    for (int i = 0; i < 4; ++i) stride[i] = s[i];
  });
}

tileattn_status tileattn_set_thread_runtime(const tileattn_thread_runtime* runtime) {
  return capi::guarded(__func__, [&] {
    if (!runtime) {
      set_thread_runtime(nullptr);
      return;
    }
    capi::require(runtime->name, "runtime->name");
    if (!runtime->run) throw Error("runtime->run is null");
    installed_c_runtime().store(runtime, std::memory_order_release);
    set_thread_runtime(&kCRuntime);
  });
}

const char* tileattn_thread_runtime_name(void) {
  const char* name = thread_runtime();
  if (name == kCRuntime.name)
    if (const tileattn_thread_runtime* c = installed_c_runtime().load(std::memory_order_acquire)) return c->name;
  return name;
}

}  // extern "C"
