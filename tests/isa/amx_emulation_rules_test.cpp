// The AMX tile model's configuration rules (amx_emulation.hpp): tiles that
// are not configured, or used past a release, stop the test as #UD would;
// loads and stores move exactly the configured rows and bytes per row, at
// the given stride.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#define TILEATTN_AVX512_NAMESPACE amx_rules_test
#include "isa/amx_emulation.hpp"

namespace tileattn::testing {
namespace {

using namespace tileattn::amx_emulation;

// Palette 1 with the given (rows, bytes per row) for tiles 0, 1, 2, ...
struct alignas(64) Config {
  unsigned char bytes[64] = {};
  Config(std::initializer_list<std::pair<int, int>> tiles) {
    bytes[0] = 1;
    int t = 0;
    for (auto [rows, colsb] : tiles) {
      const uint16_t c = uint16_t(colsb);
      std::memcpy(bytes + 16 + 2 * t, &c, 2);
      bytes[48 + t] = uint8_t(rows);
      ++t;
    }
  }
};

TEST(AmxEmulationRulesDeathTest, TileWithoutConfigurationAborts) {
  _tile_release();
  EXPECT_DEATH(_tile_zero(0), "without a tile configuration");
}

TEST(AmxEmulationRulesDeathTest, TileAfterReleaseAborts) {
  const Config config{{16, 64}};
  _tile_loadconfig(config.bytes);
  _tile_release();
  float c[16 * 16] = {};
  EXPECT_DEATH(_tile_loadd(0, c, 64), "without a tile configuration");
}

TEST(AmxEmulationRulesDeathTest, TileBeyondConfigurationAborts) {
  const Config config{{16, 64}, {16, 64}, {16, 64}};
  _tile_loadconfig(config.bytes);
  EXPECT_DEATH(_tile_zero(3), "tile not configured");
  EXPECT_DEATH(_tile_dpbf16ps(0, 1, 5), "tile not configured");
  _tile_release();
}

TEST(AmxEmulationRulesDeathTest, MismatchedShapesAbort) {
  const Config config{{16, 64}, {8, 64}, {16, 64}};  // A has 8 rows, C 16
  _tile_loadconfig(config.bytes);
  EXPECT_DEATH(_tile_dpbf16ps(0, 1, 2), "shapes do not fit");
  const Config k_mismatch{{4, 32}, {4, 16}, {8, 32}};  // A's 4 pairs against B's 8 rows
  _tile_loadconfig(k_mismatch.bytes);
  EXPECT_DEATH(_tile_dpbf16ps(0, 1, 2), "shapes do not fit");
  _tile_release();
}

TEST(AmxEmulationRulesDeathTest, ConfigurationOutsidePaletteAborts) {
  const Config too_wide{{16, 68}};
  EXPECT_DEATH(_tile_loadconfig(too_wide.bytes), "limits");
  const Config too_tall{{17, 64}};
  EXPECT_DEATH(_tile_loadconfig(too_tall.bytes), "limits");
  Config palette_2{{16, 64}};
  palette_2.bytes[0] = 2;
  EXPECT_DEATH(_tile_loadconfig(palette_2.bytes), "palette");
}

TEST(AmxEmulationRules, LoadAndStoreMoveConfiguredRowsAndBytesAtStride) {
  const Config config{{3, 12}};  // 3 rows of 12 bytes
  _tile_loadconfig(config.bytes);
  std::vector<unsigned char> src(200), dst(200, 0xee);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i);
  _tile_loadd(0, src.data() + 5, 40);
  _tile_stored(0, dst.data() + 7, 24);
  for (size_t i = 0; i < dst.size(); ++i) {
    const int64_t at = int64_t(i) - 7, row = at / 24, col = at % 24;
    const bool written = at >= 0 && row < 3 && col < 12;
    EXPECT_EQ(dst[i], written ? uint8_t(5 + row * 40 + col) : 0xee) << "byte " << i;
  }
  // A zeroed tile stores zeros over the same bytes only.
  _tile_zero(0);
  _tile_stored(0, dst.data() + 7, 24);
  for (int row = 0; row < 3; ++row) EXPECT_EQ(dst[size_t(7 + row * 24 + 12)], 0xee);
  EXPECT_EQ(dst[7], 0);
  _tile_release();
}

}  // namespace
}  // namespace tileattn::testing
