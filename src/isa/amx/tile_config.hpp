// The AMX tile configuration tileattn uses everywhere: palette 1, tiles 0-7
// each 16 rows of 64 bytes (C: 16 x 16 fp32; A and B: 16 x 32 bf16), the
// 64-byte block _tile_loadconfig reads.
#pragma once

#include <cstdint>

namespace tileattn::detail {

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

static inline const AmxTileConfig& amx_tile_config() {
  static const AmxTileConfig config = [] {
    AmxTileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.bytes_per_row[t] = 64;
      c.rows[t] = 16;
    }
    return c;
  }();
  return config;
}

}  // namespace tileattn::detail
