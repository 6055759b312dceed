// Tile-shape choice: data, not code (STYLE.md). The register tile is fixed in
// each ISA's kernels; the cache-level tile is picked here per machine.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <sys/stat.h>

#include "core/problem.hpp"
#include "io/npy.hpp"
#include "tileattn/machine.hpp"

namespace tileattn {

namespace {

bool parse_tiles(const std::string& text, int& block_q, int& block_kv) {
  int q = 0, kv = 0;
  char x = 0, extra = 0;
  if (std::sscanf(text.c_str(), "%d%c%d%c", &q, &x, &kv, &extra) != 3 || (x != 'x' && x != 'X'))
    return false;
  if (q < 1 || q > 1024 || kv < 1 || kv > 1024) return false;
  block_q = q;
  block_kv = kv;
  return true;
}

}  // namespace

namespace detail {

int64_t tile_working_set_bytes(int64_t block_q, int64_t block_kv, int64_t head_dim, int64_t v_head_dim) {
  const int64_t dp = round_up(head_dim, kPanelWidth), dvp = round_up(v_head_dim, kPanelWidth);
  const int64_t kvp = round_up(block_kv, kPanelWidth);
  // Q (block_q, D_pad), acc (block_q, Dv_pad), K^T (D_pad, kv_pad), V (kv_pad, Dv_pad), S (block_q, kv_pad)
  return 4 * (block_q * (dp + dvp) + kvp * (dp + dvp) + block_q * kvp);
}

}  // namespace detail

std::string tune_file_path() {
  if (const char* env = std::getenv("TILEATTN_TUNE_FILE"); env && *env) return env;
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/tileattn/tune.conf";
  return "tileattn-tune.conf";
}

std::vector<TuneEntry> read_tune_file(const std::string& path) {
  std::vector<TuneEntry> entries;
  // Only a regular file (or a link to one): opening a FIFO would wait for a writer.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return entries;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    TuneEntry e;
    std::string tiles;
    if (!(fields >> e.isa >> e.head_dim >> e.dtype >> tiles)) continue;
    if (!parse_tiles(tiles, e.block_q, e.block_kv)) continue;
    entries.push_back(e);
  }
  return entries;
}

void write_tune_file(const std::string& path, const std::vector<TuneEntry>& entries) {
  if (path.empty()) throw Error("tune file: empty path");
  std::ostringstream text;
  text << "# tileattn tune file: isa head_dim dtype block_qxblock_kv (written by `tileattn tune`)\n";
  for (const TuneEntry& e : entries)
    text << e.isa << ' ' << e.head_dim << ' ' << e.dtype << ' ' << e.block_q << 'x' << e.block_kv << '\n';
  const std::string bytes = text.str();
  // As every output of the library: written beside the target and renamed
  // over it (a link written through, a device or FIFO in place); on a failure
  // the target stays as it was and no temporary file is left.
  try {
    io::StagedFiles files;
    files.stage(path, std::vector<unsigned char>(bytes.begin(), bytes.end()));
    files.commit();
  } catch (const Error& e) {
    throw Error(std::string("tune file: ") + e.what());
  }
}

TileShape choose_tiles(Isa isa, int64_t head_dim, DType dtype, int64_t v_head_dim) {
  if (head_dim < 1 || head_dim > kMaxHeadDim)
    throw Error("head_dim must be in 1.." + std::to_string(kMaxHeadDim) + ", got " + std::to_string(head_dim));
  if (v_head_dim <= 0) v_head_dim = head_dim;
  const auto working_set_bytes = [&](int64_t block_q, int64_t block_kv) {
    return detail::tile_working_set_bytes(block_q, block_kv, head_dim, v_head_dim);
  };
  TileShape t;
  if (const char* env = std::getenv("TILEATTN_TILES"); env && *env) {
    if (!parse_tiles(env, t.block_q, t.block_kv))
      throw Error(std::string("TILEATTN_TILES: expected QxKV such as 64x128, got '") + env + "'");
    t.reason = "TILEATTN_TILES";
    return t;
  }
  static const std::vector<TuneEntry> tuned = read_tune_file(tune_file_path());
  for (const TuneEntry& e : tuned) {
    if (v_head_dim == head_dim && e.isa == isa_name(kernel_isa(isa, dtype)) && e.head_dim == head_dim &&
        e.dtype == dtype_name(dtype)) {
      t.block_q = e.block_q;
      t.block_kv = e.block_kv;
      t.reason = "tune file " + tune_file_path();
      return t;
    }
  }
  // Cache model: the tallest query tile whose per-step working set (Q and
  // accumulator tiles, K^T and V tiles, scores) fits L2. Tall query tiles win
  // because every K/V tile is streamed in, converted and transposed once per
  // query tile: on a Zen 3 (512 KiB L2, AVX2, 2 threads, N = 2048, cycles per
  // query-key pair over full tiles, min of 10%) 256x64 beat 128x64 by 4% at
  // D = 64, 5-10% at D = 128 and 7% at D = 256, and 128x64 beat the old
  // half-of-L2 choice 64x32 by 6% at D = 256. `tileattn tune` measures instead.
  struct Candidate {
    int block_q, block_kv;
  };
  static const Candidate candidates[] = {{256, 64}, {192, 64}, {128, 64}, {64, 64},
                                         {64, 32},  {32, 32},  {16, 16}};
  const int64_t budget = cache_sizes().l2;
  for (const Candidate& c : candidates) {
    if (working_set_bytes(c.block_q, c.block_kv) <= budget) {
      t.block_q = c.block_q;
      t.block_kv = c.block_kv;
      t.reason = "cache model: working set " +
                 std::to_string(working_set_bytes(c.block_q, c.block_kv) / 1024) +
                 " KiB <= L2 = " + std::to_string(budget / 1024) + " KiB";
      return t;
    }
  }
  t.block_q = 16;
  t.block_kv = 16;
  t.reason = "cache model: smallest candidate";
  return t;
}

}  // namespace tileattn
