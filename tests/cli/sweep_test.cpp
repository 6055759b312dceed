// `tileattn bench --sweep` and the one-case flags it drives (--impl, --decode,
// --peak-gflops): flag checking, the row schema in CSV and JSON, exact FLOP
// counts, per-process peak memory, skipped rows, and the progress bar (only
// on a terminal).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <sstream>

#include "cli/cli_support.hpp"
#include "core/band.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::cli_test {
namespace {

const char* const kColumns =
    "impl,label,status,reason,pass,seq,q_len,kv_len,dim,mask,window_left,window_right,dtype,batch,heads,"
    "kv_heads,threads,reps,ms,gflops,fraction_of_peak,peak_gflops,peak_rss_mb,flops,detail";

Json parse_or_fail(const std::string& text) {
  Json j;
  EXPECT_TRUE(JsonParser(text).parse(j)) << "not one JSON value: " << text.substr(0, 500);
  return j;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> split_csv_simple(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) cells.push_back(cell), cell.clear();
    else cell += c;
  }
  cells.push_back(cell);
  return cells;
}

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Visible pairs of a window (bottom-right aligned), pair by pair, by the band
// rule the library uses (src/core/band.hpp).
double pairs(int nq, int nk, int left, int right) {
  const detail::Band band = detail::make_band(false, left, right);
  double total = 0;
  for (int i = 0; i < nq; ++i)
    for (int j = 0; j < nk; ++j) total += detail::band_keeps(band, nk - nq, i, j);
  return total;
}

TEST(cliSweep, BadFlagsNameTheFlagAndWriteNothing) {
  TempDir dir;
  const std::string out = dir / "r.json";
  struct Bad {
    std::string args, flag;
  };
  for (const Bad& b : std::vector<Bad>{{"--seqs 0", "--seqs"},
                                       {"--seqs 64,x", "--seqs"},
                                       {"--seqs 64,64", "--seqs"},
                                       {"--dims 513", "--dims: must be in 1..512 in a sweep"},
                                       {"--masks none,diagonal", "--masks"},
                                       {"--dtypes fp64", "--dtypes"},
                                       {"--passes forward,forward", "--passes"},
                                       {"--impls torch", "--impls"},
                                       {"--heads 6 --kv-heads 4", "--kv-heads"},
                                       {"--seq 64", "--seq"},
                                       {"--causal", "--causal"},
                                       // One-case options the sweep's cases do not run with.
                                       {"--softcap 30", "--softcap: not with --sweep"},
                                       {"--alibi", "--alibi: not with --sweep"},
                                       {"--sinks /nonexistent.npy", "--sinks: not with --sweep"},
                                       {"--bf16-probabilities", "--bf16-probabilities: not with --sweep"},
                                       {"--dim-v 32", "--dim-v: not with --sweep"},
                                       {"--bf16-peak-gflops 10", "--bf16-peak-gflops: not with --sweep"},
                                       {"--max-naive-mb -1", "--max-naive-mb"}}) {
    const Result r = run_cli("bench --sweep " + b.args + " --out '" + out + "'", dir);
    EXPECT_EQ(r.status, 2) << b.args;
    ASSERT_EQ(r.err_lines().size(), 1u) << b.args << ": " << r.err;
    EXPECT_NE(r.err.find(b.flag), std::string::npos) << r.err;
    EXPECT_FALSE(exists(out)) << b.args;
  }
  Result r = run_cli("bench --sweep --seqs 32 --out '" + (dir / "r.txt") + "'", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--out"), std::string::npos);
  r = run_cli("bench --sweep --seqs 32 --out /nonexistent-folder/r.json", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--out"), std::string::npos);
  // Sweep-only flags need --sweep; contradictory one-case flags are refused.
  r = run_cli("bench --seqs 64", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("only with --sweep"), std::string::npos);
  r = run_cli("bench --impl openblas --no-baseline", dir);
  EXPECT_EQ(r.status, 2);
  r = run_cli("bench --impl cublas", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--impl"), std::string::npos);
  r = run_cli("bench --decode --backward", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(dir.files().empty());
}

TEST(cliSweep, CsvHasOneRowPerImplementationAndCaseWithExactFlops) {
  TempDir dir;
  const std::string out = dir / "r.csv";
  const Result r = run_cli("bench --sweep --seqs 32,48 --dims 16 --masks none,window --window 8,0 "
                           "--passes forward,decode --heads 2 --kv-heads 1 --threads 1 --reps 1 "
                           "--peak-gflops 10 --out '" + out + "'",
                           dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "") << "no progress bar when stderr is not a terminal";
  const std::vector<std::string> lines = lines_of(slurp(out));
  ASSERT_EQ(lines.size(), 1u + 2 * 2 * 2 * 2);  // header + seqs x masks x passes x impls
  EXPECT_EQ(lines[0], kColumns);
  const std::vector<std::string> columns = split_csv_simple(kColumns);
  auto col = [&](const std::vector<std::string>& cells, const std::string& name) {
    for (std::size_t i = 0; i < columns.size(); ++i)
      if (columns[i] == name) return cells.at(i);
    ADD_FAILURE() << "no column " << name;
    return std::string();
  };
  int tileattn_rows = 0, naive_rows = 0;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> cells = split_csv_simple(lines[i]);
    ASSERT_EQ(cells.size(), columns.size()) << lines[i];
    EXPECT_EQ(col(cells, "status"), "ok") << lines[i];
    tileattn_rows += col(cells, "impl") == "tileattn";
    naive_rows += col(cells, "impl") == "naive-openblas";
    const int n = std::stoi(col(cells, "seq")), d = std::stoi(col(cells, "dim"));
    const bool decode = col(cells, "pass") == "decode";
    const bool window = col(cells, "mask") == "window";
    EXPECT_EQ(std::stoi(col(cells, "q_len")), decode ? 1 : n);
    const double expected = 4.0 * d * 2 * pairs(decode ? 1 : n, n, window ? 8 : -1, window ? 0 : -1);
    EXPECT_EQ(std::stod(col(cells, "flops")), expected) << lines[i];
    const double ms = std::stod(col(cells, "ms")), gflops = std::stod(col(cells, "gflops"));
    EXPECT_NEAR(gflops, expected / ms * 1e-6, 1e-3 * gflops);
    EXPECT_NEAR(std::stod(col(cells, "fraction_of_peak")), gflops / 10, 1e-3 * gflops);
    EXPECT_EQ(col(cells, "peak_gflops"), "10");
    EXPECT_GT(std::stod(col(cells, "peak_rss_mb")), 1);
  }
  EXPECT_EQ(tileattn_rows, 8);
  EXPECT_EQ(naive_rows, 8);
}

// Head dims past 256 up to V's limit of 512 (the sweep runs V at Q/K's head dim).
TEST(cliSweep, HeadDimsUpTo512) {
  TempDir dir;
  const Result r = run_cli("bench --sweep --seqs 16 --dims 320,512 --masks none --impls tileattn,openblas --heads 1 "
                           "--threads 1 --reps 1 --peak-gflops 10 --json",
                           dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json doc = parse_or_fail(r.out);
  ASSERT_EQ(doc.get("rows")->items.size(), 4u);
  for (const Json& row : doc.get("rows")->items) {
    EXPECT_EQ(row.get("status")->str, "ok") << row.get("reason")->str;
    EXPECT_EQ(row.get("flops")->num, 4.0 * row.get("dim")->num * 16 * 16);
  }
}

// A case that fails (here: 8 TiB of buffers, more than any machine's memory) is a
// row with status "error" and its reason; the other rows and the document
// are still written, and the sweep exits 1 (docs/cli.md).
TEST(cliSweep, AFailedCaseIsAnErrorRowAndExitStatus1) {
  TempDir dir;
  const Result r = run_cli("bench --sweep --seqs 16,16777216 --dims 512 --batch 64 --heads 1 --masks none "
                           "--impls tileattn --threads 1 --reps 1 --peak-gflops 10 --out '" + (dir / "r.json") + "'",
                           dir);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("1 case(s) failed"), std::string::npos) << r.err;
  const Json doc = parse_or_fail(slurp(dir / "r.json"));
  ASSERT_EQ(doc.get("rows")->items.size(), 2u);
  EXPECT_EQ(doc.get("rows")->items[0].get("status")->str, "ok");
  EXPECT_EQ(doc.get("rows")->items[1].get("status")->str, "error");
  EXPECT_NE(doc.get("rows")->items[1].get("reason")->str.find("more than this machine's"), std::string::npos);
}

// JSON is UTF-8: an argument in another encoding (a file name with the byte
// 0xff) is written as U+FFFD, well-formed UTF-8 (e acute) as it is.
TEST(cliSweep, JsonStaysUtf8WhateverBytesTheArgumentsHold) {
  TempDir dir;
  const std::string out = dir / "r_\xff_\xc3\xa9.json";
  const Result r = run_cli("bench --sweep --seqs 16 --dims 16 --masks none --impls tileattn --heads 1 --threads 1 "
                           "--reps 1 --peak-gflops 10 --json --out '" + out + "'",
                           dir);
  ASSERT_EQ(r.status, 0) << r.err;
  for (const std::string& text : {r.out, slurp(out)}) {
    EXPECT_EQ(text.find('\xff'), std::string::npos) << text;
    EXPECT_NE(text.find("r_\\ufffd_\xc3\xa9.json"), std::string::npos) << text;
    const Json doc = parse_or_fail(text);
    EXPECT_EQ(doc.get("rows")->items.size(), 1u);
  }
}

TEST(cliSweep, JsonDocumentSkippedBaselineAndPerProcessMemory) {
  TempDir dir;
  const std::string out = dir / "r.json";
  // N = 1024 fp32: the naive scores are 4 MiB, above --max-naive-mb 2: skipped.
  const Result r = run_cli("bench --sweep --seqs 256,1024 --dims 32 --masks causal --heads 1 --threads 1 "
                           "--reps 1 --max-naive-mb 2 --json --out '" + out + "'",
                           dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const Json doc = parse_or_fail(r.out);
  const Json file = parse_or_fail(slurp(out));
  ASSERT_NE(doc.get("rows"), nullptr);
  EXPECT_EQ(doc.get("schema")->str, "tileattn-bench-sweep/1");
  EXPECT_GT(doc.get("machine")->get("peak_gflops")->num, 0);
  EXPECT_TRUE(doc.get("machine")->get("peak_measured")->flag);
  const std::vector<Json>& rows = doc.get("rows")->items;
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(file.get("rows")->items.size(), 4u);
  for (const Json& row : rows) {
    ASSERT_EQ(row.fields.size(), split_csv_simple(kColumns).size());
    const bool naive = row.get("impl")->str == "naive-openblas";
    const bool big = row.get("seq")->num == 1024;
    if (naive && big) {
      EXPECT_EQ(row.get("status")->str, "skipped");
      EXPECT_NE(row.get("reason")->str.find("--max-naive-mb"), std::string::npos);
      EXPECT_EQ(row.get("ms")->type, Json::null);
    } else {
      EXPECT_EQ(row.get("status")->str, "ok");
      EXPECT_EQ(row.get("reason")->type, Json::null);
    }
  }
}

TEST(cliSweep, NaiveBaselinePeakMemoryHoldsItsScoreMatrix) {
  TempDir dir;
  // N = 2048: the naive baseline's one N x N fp32 matrix is 16 MiB; tileattn's
  // q, k, v, o are 4 x 2048 x 64 x 4 B = 2 MiB. Each runs in its own process.
  const Result r = run_cli("bench --sweep --seqs 2048 --dims 64 --masks none --heads 1 --threads 1 --reps 1 --json",
                           dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json doc = parse_or_fail(r.out);
  double tileattn_mb = 0, naive_mb = 0;
  for (const Json& row : doc.get("rows")->items)
    (row.get("impl")->str == "tileattn" ? tileattn_mb : naive_mb) = row.get("peak_rss_mb")->num;
  EXPECT_GT(naive_mb, tileattn_mb + 12) << "tileattn " << tileattn_mb << " MB, naive " << naive_mb << " MB";
}

TEST(cliSweep, ProgressBarOnATerminalOnly) {
  TempDir dir;
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "script(1) is not installed";
  // script(1) gives the command a pseudo-terminal; its output is what the terminal showed.
  const std::string sweep = std::string("'") + TILEATTN_CLI + "' bench --sweep --seqs 32,64 --dims 16 --masks none "
                            "--heads 1 --threads 1 --reps 1";
  const std::string shown = dir / "shown.txt";
  ASSERT_EQ(std::system(("script -qec \"" + sweep + "\" /dev/null > '" + shown + "' 2>&1").c_str()), 0);
  const std::string screen = slurp(shown);
  EXPECT_NE(screen.find("[forward] case 1/4"), std::string::npos) << screen;
  EXPECT_NE(screen.find("case 4/4"), std::string::npos) << screen;
  EXPECT_NE(screen.find("elapsed"), std::string::npos);
  EXPECT_NE(screen.find("left ~"), std::string::npos);
  // --json keeps the terminal quiet too.
  ASSERT_EQ(std::system(("script -qec \"" + sweep + " --json\" /dev/null > '" + shown + "' 2>&1").c_str()), 0);
  EXPECT_EQ(slurp(shown).find("elapsed"), std::string::npos);
}

TEST(cliBenchOneCase, ImplAndDecodeAndGivenPeak) {
  TempDir dir;
  Result r = run_cli("bench --heads 2 --seq 64 --dim 16 --reps 1 --threads 1 --impl openblas --peak-gflops 7 --json",
                     dir);
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = parse_or_fail(r.out);
  EXPECT_EQ(j.get("impl")->str, "openblas");
  // The kernel is not timed with --impl openblas: its fields are null.
  for (const char* key : {"ms", "gflops", "fraction_of_peak", "rep_ms", "reps", "block_q", "block_kv", "tile_reason",
                          "tune_file", "bf16_peak_gflops", "fraction_of_bf16_peak", "peak_rss_mb"}) {
    ASSERT_NE(j.get(key), nullptr) << key;
    EXPECT_EQ(j.get(key)->type, Json::null) << key;
  }
  EXPECT_EQ(j.get("peak_gflops")->num, 7);
  ASSERT_NE(j.get("baseline_ms"), nullptr);
  EXPECT_EQ(j.get("baseline_ms")->type, Json::number);

  r = run_cli("bench --heads 4 --kv-heads 2 --kv-seq 300 --dim 32 --reps 2 --threads 1 --decode --window 50,0 --json", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  j = parse_or_fail(r.out);
  EXPECT_TRUE(j.get("decode")->flag);
  EXPECT_EQ(j.get("seq")->num, 1);
  EXPECT_EQ(j.get("kv_seq")->num, 300);
  EXPECT_EQ(j.get("flops")->num, 4.0 * 32 * 51 * 4);  // the query sees keys 249..299
  EXPECT_EQ(j.get("ms")->type, Json::number);
  EXPECT_EQ(j.get("baseline_ms")->type, Json::number);
  // The tiles reported are the decode call's own: one query row, and the key
  // tile the library plans for that very call (not the prefill's 256x64).
  EXPECT_EQ(j.get("block_q")->num, 1);
  EXPECT_NE(j.get("tile_reason")->str.find("this call"), std::string::npos) << j.get("tile_reason")->str;
  {
    int32_t lengths[1] = {300};
    KvCacheArgs ca;
    ca.batch = 1;
    ca.heads = 4;
    ca.kv_heads = 2;
    ca.head_dim = 32;
    ca.dtype = DType::f32;
    ca.seqlen_q = 1;
    std::vector<float> q32(4 * 32), o32(4 * 32), k32(2 * 300 * 32), v32(2 * 300 * 32);
    ca.q = {q32.data(), dense_strides(Layout::bhsd, 1, 4, 1, 32)};
    ca.o = {o32.data(), dense_strides(Layout::bhsd, 1, 4, 1, 32)};
    ca.k_cache = {k32.data(), dense_strides(Layout::bhsd, 1, 2, 300, 32)};
    ca.v_cache = {v32.data(), dense_strides(Layout::bhsd, 1, 2, 300, 32)};
    ca.capacity = 300;
    ca.cache_seqlens = lengths;
    ca.window_left = 50;
    ca.window_right = 0;
    ca.threads = 1;
    EXPECT_EQ(j.get("block_kv")->num, forward_tiles(kvcache_forward_args(ca, lengths)).block_kv);
  }
  // --seq has no meaning for one query token: refused, naming both flags.
  r = run_cli("bench --decode --seq 5 --kv-seq 64 --reps 1 --no-baseline --json", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--seq: not with --decode"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace
}  // namespace tileattn::cli_test
