#include <cpuid.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/peak_kernels.hpp"
#include "core/thread_pool.hpp"
#include "tileattn/machine.hpp"

namespace tileattn {

namespace {

uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect_features() {
  CpuFeatures f;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return f;
  unsigned max_leaf = eax;
  char vendor[13] = {};
  __builtin_memcpy(vendor, &ebx, 4);
  __builtin_memcpy(vendor + 4, &edx, 4);
  __builtin_memcpy(vendor + 8, &ecx, 4);
  f.vendor = vendor;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const int base_family = int((eax >> 8) & 0xf), base_model = int((eax >> 4) & 0xf);
  f.family = base_family == 0xf ? base_family + int((eax >> 20) & 0xff) : base_family;
  f.model = base_family == 0xf || base_family == 0x6 ? (int((eax >> 16) & 0xf) << 4) + base_model : base_model;
  bool osxsave = (ecx >> 27) & 1;
  bool fma = (ecx >> 12) & 1, f16c = (ecx >> 29) & 1, avx = (ecx >> 28) & 1;
  uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  bool ymm_state = (xcr0 & 0x6) == 0x6;        // SSE + AVX state saved by the OS
  bool zmm_state = (xcr0 & 0xe6) == 0xe6;      // plus opmask and ZMM state
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    bool avx2 = (ebx >> 5) & 1;
    f.avx2 = avx && avx2 && ymm_state;
    f.fma = fma && ymm_state;
    f.f16c = f16c && ymm_state;
    f.avx512f = ((ebx >> 16) & 1) && zmm_state;
    f.avx512dq = ((ebx >> 17) & 1) && zmm_state;
    f.avx512bw = ((ebx >> 30) & 1) && zmm_state;
    f.avx512vl = ((ebx >> 31) & 1) && zmm_state;
    f.avx512_vnni = ((ecx >> 11) & 1) && zmm_state;
    f.avx512_vbmi = ((ecx >> 1) & 1) && zmm_state;
    f.avx512_fp16 = ((edx >> 23) & 1) && zmm_state;
    const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
    f.amx_bf16 = ((edx >> 22) & 1) && ((edx >> 24) & 1) && tile_state;
    f.amx_int8 = ((edx >> 25) & 1) && ((edx >> 24) & 1) && tile_state;
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    f.avx512_bf16 = ((a1 >> 5) & 1) && zmm_state;
  }
  __get_cpuid(0x80000000, &eax, &ebx, &ecx, &edx);
  if (eax >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &eax, &ebx, &ecx, &edx);
      __builtin_memcpy(brand + 16 * i, &eax, 4);
      __builtin_memcpy(brand + 16 * i + 4, &ebx, 4);
      __builtin_memcpy(brand + 16 * i + 8, &ecx, 4);
      __builtin_memcpy(brand + 16 * i + 12, &edx, 4);
    }
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  }
  return f;
}

// "48K" / "1024K" / "32M" from sysfs.
int64_t parse_cache_size(const std::string& text) {
  if (text.empty()) return 0;
  int64_t value = std::strtoll(text.c_str(), nullptr, 10);
  char unit = text.back() == '\n' && text.size() > 1 ? text[text.size() - 2] : text.back();
  if (unit == 'K') value *= 1024;
  if (unit == 'M') value *= 1024 * 1024;
  return value;
}

CacheSizes detect_caches() {
  CacheSizes c;
  c.source = "default";
  bool found = false;
  for (int index = 0; index < 8; ++index) {
    std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    if (!level_file || !type_file || !size_file) continue;
    int level = 0;
    std::string type, size;
    level_file >> level;
    type_file >> type;
    size_file >> size;
    int64_t bytes = parse_cache_size(size);
    if (bytes <= 0) continue;
    if (level == 1 && type == "Data") c.l1d = bytes, found = true;
    if (level == 2) c.l2 = bytes, found = true;
    if (level == 3) c.l3 = bytes, found = true;
  }
  if (found) c.source = "sysfs";
  return c;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect_features();
  return features;
}

const CacheSizes& cache_sizes() {
  static const CacheSizes caches = detect_caches();
  return caches;
}

int hardware_threads() { return detail::hardware_threads(); }

bool isa_available(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::generic:
    case Isa::reference: return true;
    case Isa::avx2: return f.avx2 && f.fma && f.f16c;
    case Isa::avx512: return f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.f16c;
    case Isa::avx512bf16: return detail::bf16_products_built() && isa_available(Isa::avx512) && f.avx512_bf16;
    case Isa::amx: return detail::bf16_products_built() && isa_available(Isa::avx512bf16) && amx_bf16_usable();
    case Isa::automatic: return true;
  }
  return false;
}

Isa best_isa() {
  if (isa_available(Isa::amx)) return Isa::amx;
  // vdpbf16ps runs at twice the FP32 FMA rate on AMD Zen 4 (223 against 114
  // GFLOP/s per core) but at half of it on the AMX Xeon of 2026-12-02 (53-71
  // against 102-148 on 2 threads, `tileattn info`), where the avx512bf16 bf16
  // forward took 2.2x the avx512 one: chosen automatically on AMD only,
  // forceable anywhere it runs (TILEATTN_ISA=avx512bf16).
  if (isa_available(Isa::avx512bf16) && cpu_features().vendor == "AuthenticAMD") return Isa::avx512bf16;
  if (isa_available(Isa::avx512)) return Isa::avx512;
  if (isa_available(Isa::avx2)) return Isa::avx2;
  return Isa::generic;
}

Isa bf16_isa() { return resolve_isa(Isa::automatic); }

Isa kernel_isa(Isa isa, DType dtype) {
  const bool bf16_rung = isa == Isa::amx || isa == Isa::avx512bf16;
  return bf16_rung && dtype != DType::bf16 ? Isa::avx512 : isa;  // detail::tile_product's rule
}

Isa resolve_isa(Isa requested) {
  if (int(requested) < 0 || int(requested) >= kIsaCount)  // not a value of the enum
    throw Error("isa: unknown value " + std::to_string(int(requested)));
  if (requested == Isa::automatic) {
    const char* env = std::getenv("TILEATTN_ISA");
    if (env && *env) requested = parse_isa(env);
    if (requested == Isa::automatic) return best_isa();
  }
  if (!isa_available(requested)) {
    throw NotSupported(std::string("isa: ") + isa_name(requested) +
                       " is not supported by this CPU (best available: " + isa_name(best_isa()) +
                       ")");
  }
  return requested;
}

}  // namespace tileattn
