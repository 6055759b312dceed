// AMX-BF16 peak loop: four 16x16 fp32 accumulator tiles, each updated by
// tdpbf16ps from a 16x32 bf16 A tile and a 16x32 (VNNI) bf16 B tile, i.e.
// 16*16*32 multiply-adds per instruction. Only called when cpu_features()
// reports AMX-BF16 and the OS granted this process the tile data state
// (request_amx_permission, which the amx rung needs too): the yardstick
// `tileattn info` prints next to the FMA peak (amx_bf16_peak_gflops).
// Compiled with the amx rung's flags (CMakeLists.txt), like every
// src/isa/<isa>/ file.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/peak_kernels.hpp"
#include "isa/amx/tile_config.hpp"

namespace tileattn::detail {

namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an XSAVE feature (Linux >= 5.16)
constexpr int kXfeatureTileData = 18;      // XTILEDATA

}  // namespace

bool amx_peak_built() { return true; }

bool request_amx_permission() {
  static std::once_flag once;
  static bool granted = false;
  std::call_once(once, [] { granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) == 0; });
  return granted;
}

double amx_bf16_loop(int64_t iterations, float* sink) {
  if (iterations <= 0 || !request_amx_permission()) return 0;
  _tile_loadconfig(&amx_tile_config());  // tiles 0-3: C (16 x 16 fp32), 4-5: A, 6-7: B (16 x 32 bf16)
  // bf16 1.0 and 2^-10: every sum stays exact and far from overflow.
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) a[i] = 0x3f80, b[i] = 0x3a80;
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  *sink += c[0];
  return double(iterations) * 4 * 16 * 16 * 32 * 2;
}

}  // namespace tileattn::detail
