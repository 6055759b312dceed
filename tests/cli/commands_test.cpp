// info, bench, check, tune, decode and usage: exit statuses and the JSON
// contracts of DESIGN.md (one object on stdout, every documented field).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "cli/args.hpp"
#include <sys/stat.h>

#include "cli/cli_support.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::cli_test {
namespace {

Json parse_or_fail(const std::string& text) {
  Json j;
  EXPECT_TRUE(JsonParser(text).parse(j)) << "not one JSON value: " << text;
  EXPECT_EQ(j.type, Json::object);
  return j;
}

void expect_fields(const Json& j, const std::vector<std::string>& keys, Json::Type type) {
  for (const std::string& key : keys) {
    const Json* v = j.get(key);
    ASSERT_NE(v, nullptr) << "missing field " << key;
    EXPECT_EQ(v->type, type) << key;
  }
}

TEST(cliUsage, HelpAndUnknownCommands) {
  TempDir dir;
  Result r = run_cli("--help", dir);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("usage: tileattn"), std::string::npos);
  r = run_cli("", dir);
  EXPECT_EQ(r.status, 2);
  r = run_cli("frobnicate", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "tileattn: unknown command 'frobnicate' (see tileattn --help)\n");
  for (const char* command : {"info", "run", "bench", "check", "tune"}) {
    r = run_cli(std::string(command) + " --help", dir);
    EXPECT_EQ(r.status, 0) << command;
    EXPECT_NE(r.out.find(std::string("usage: tileattn ") + command), std::string::npos) << r.out;
  }
  // run --help documents what the output dtype is.
  EXPECT_NE(run_cli("run --help", dir).out.find("float16 for --dtype fp16"), std::string::npos);
  // decode's own behaviour is tested with the inference work; here only that it is dispatched.
  r = run_cli("decode --frobnicate", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err_lines().size(), 1u) << r.err;
}

// docs/cli.md names every flag that a command's --help names (it once left out
// all of `run`'s and most of `bench`'s, `check`'s and `decode`'s).
TEST(cliDocs, EveryFlagOfEveryCommandIsInCliMd) {
  TempDir dir;
  const std::string doc = slurp(TILEATTN_CLI_DOC);
  ASSERT_FALSE(doc.empty()) << TILEATTN_CLI_DOC;
  auto flag_char = [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return std::islower(u) || std::isdigit(u) || c == '-';
  };
  auto documented = [&](const std::string& flag) {
    for (std::size_t at = doc.find(flag); at != std::string::npos; at = doc.find(flag, at + 1))
      if (at + flag.size() == doc.size() || !flag_char(doc[at + flag.size()])) return true;
    return false;
  };
  for (const char* command : {"info", "run", "bench", "check", "tune", "decode"}) {
    const Result r = run_cli(std::string(command) + " --help", dir);
    ASSERT_EQ(r.status, 0) << command;
    int flags = 0;
    for (std::size_t at = r.out.find("--"); at != std::string::npos; at = r.out.find("--", at + 2)) {
      std::size_t end = at + 2;
      if (end >= r.out.size() || !std::islower(static_cast<unsigned char>(r.out[end]))) continue;
      while (end < r.out.size() && flag_char(r.out[end])) ++end;
      const std::string flag = r.out.substr(at, end - at);
      ++flags;
      EXPECT_TRUE(documented(flag)) << "tileattn " << command << " " << flag << " is not in docs/cli.md";
      at = end - 2;
    }
    EXPECT_GT(flags, 0) << command;
  }
}

// Bad values name the flag they came in ("--dtype: ...", not "dtype: ..."),
// and range limits print as short numbers.
TEST(cliUsage, ValueErrorsNameTheFlag) {
  TempDir dir;
  Isa missing = Isa::automatic;
  for (Isa isa : {Isa::amx, Isa::avx512bf16, Isa::avx512, Isa::avx2})
    if (!isa_available(isa)) missing = isa;
  const std::string missing_isa = missing == Isa::automatic ? "" : isa_name(missing);
  for (const auto& [command, message] : std::vector<std::pair<std::string, std::string>>{
           {"bench --dtype fp8 --no-baseline", "--dtype: expected fp32, fp16 or bf16, got 'fp8'"},
           {"decode --dtype fp8", "--dtype: expected fp32, fp16 or bf16, got 'fp8'"},
           {"tune --dtypes fp32,fp8", "--dtypes: expected fp32, fp16 or bf16, got 'fp8'"},
           {"bench --peak-gflops 2e9", "--peak-gflops: must be in [0.001, 1e+09], got 2e9"},
           {"check --isa " + missing_isa, "--isa: " + missing_isa + " is not supported by this CPU"}}) {
    if (command == "check --isa ") continue;  // this CPU has every path
    const Result r = run_cli(command, dir);
    EXPECT_EQ(r.status, 2) << command;
    EXPECT_EQ(r.err.rfind("tileattn: " + message, 0), 0u) << command << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << command;
  }
}

// A shape whose buffers exceed the machine's memory is a usage error naming
// the flags, given before anything is allocated ("out of memory" before).
TEST(cliBench, ShapesBeyondMemoryNameTheirFlags) {
  TempDir dir;
  for (const auto& [command, flags] : std::vector<std::pair<std::string, std::string>>{
           {"bench --batch 2147483648 --heads 2 --seq 16 --dim 16", "--batch 2147483648 --heads 2 --kv-heads 2 --seq 16 --dim 16"},
           {"bench --heads 1000000 --seq 1000000 --dim 16 --backward", "--heads 1000000 --kv-heads 1000000 --seq 1000000"},
           {"bench --decode --heads 32 --kv-heads 8 --kv-seq 100000000", "--kv-heads 8 --kv-seq 100000000 --dim 128"}}) {
    const Result r = run_cli(command + " --no-baseline --json", dir);
    EXPECT_EQ(r.status, 2) << command;
    EXPECT_EQ(r.err.rfind("tileattn: bench: ", 0), 0u) << command << ": " << r.err;
    EXPECT_NE(r.err.find(flags), std::string::npos) << command << ": " << r.err;
    EXPECT_NE(r.err.find("GiB of memory"), std::string::npos) << command << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << command;
  }
}

TEST(cliInfo, JsonHasTheMachineAndPeak) {
  TempDir dir;
  const Result r = run_cli("info --json", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json j = parse_or_fail(r.out);
  expect_fields(j, {"isa", "cpu_vendor", "tune_file", "scratch_formula"}, Json::string);
  expect_fields(j, {"l1d_bytes", "l2_bytes", "l3_bytes", "threads", "peak_gflops", "peak_gflops_1thread"},
                Json::number);
  expect_fields(j, {"cpu_features", "tiles", "isa_available"}, Json::array);
  EXPECT_GT(j.get("peak_gflops")->num, 0.5);
  EXPECT_GT(j.get("peak_gflops_1thread")->num, 0.5);
  // The AMX-BF16 peak: measured where AMX is usable (the CPU lists it and
  // the OS granted the tile state), else 0.
  expect_fields(j, {"amx_bf16_peak_gflops"}, Json::number);
  expect_fields(j, {"amx_bf16_usable"}, Json::boolean);
  bool listed = false;
  for (const Json& f : j.get("cpu_features")->items) listed = listed || f.str == "amx_bf16";
  const bool usable = j.get("amx_bf16_usable")->flag;
  if (!listed) {
    EXPECT_FALSE(usable);
  }
  if (usable) {
    EXPECT_GT(j.get("amx_bf16_peak_gflops")->num, j.get("peak_gflops_1thread")->num);
  } else {
    EXPECT_EQ(j.get("amx_bf16_peak_gflops")->num, 0.0);
  }
  // 5 head dims x 3 dtypes, each with its shape, scratch and reason.
  const Json& tiles = *j.get("tiles");
  ASSERT_EQ(tiles.items.size(), 15u);
  for (const Json& t : tiles.items) {
    expect_fields(t, {"head_dim", "block_q", "block_kv", "scratch_per_thread_bytes"}, Json::number);
    expect_fields(t, {"dtype", "reason"}, Json::string);
    EXPECT_GT(t.get("scratch_per_thread_bytes")->num, 0);
  }
  // One of the two says what the baseline has: its core, or why it cannot load.
  ASSERT_TRUE(j.get("openblas_core") != nullptr);
  ASSERT_TRUE(j.get("openblas_error") != nullptr);
  EXPECT_NE(j.get("openblas_core")->type == Json::string, j.get("openblas_error")->type == Json::string);
}

TEST(cliInfo, ShowsTheTuneFileReason) {
  TempDir dir;
  std::ofstream(dir / "tune.conf") << "avx2 64 fp32 32x128\ngeneric 64 fp32 32x128\navx512 64 fp32 32x128\n";
  const std::string env = "TILEATTN_TUNE_FILE='" + (dir / "tune.conf") + "' ";
  const std::string command = env + "'" + TILEATTN_CLI + "' info --json >'" + (dir / "out.json") + "'";
  ASSERT_EQ(std::system(command.c_str()), 0);
  const Json j = parse_or_fail(slurp(dir / "out.json"));
  bool found = false;
  for (const Json& t : j.get("tiles")->items)
    if (t.get("head_dim")->num == 64 && t.get("dtype")->str == "fp32") {
      found = true;
      EXPECT_EQ(t.get("block_q")->num, 32);
      EXPECT_EQ(t.get("block_kv")->num, 128);
      EXPECT_NE(t.get("reason")->str.find("tune file"), std::string::npos);
    }
  EXPECT_TRUE(found);
  EXPECT_EQ(j.get("tune_entries")->num, 3);
  EXPECT_EQ(j.get("tune_tiles_applied")->num, 1);  // d=64 fp32 on this CPU's path
}

// Tiles from the tune file change every later run: bench names the file
// (JSON and human) when its tiles came from it, and says null otherwise.
TEST(cliBench, NamesTheTuneFileWhenItsTilesApply) {
  TempDir dir;
  std::ofstream(dir / "tune.conf") << "avx2 32 fp32 32x128\ngeneric 32 fp32 32x128\navx512 32 fp32 32x128\n";
  const std::string bench = "bench --heads 2 --seq 64 --dim 32 --reps 1 --threads 1 --no-baseline";
  const std::string env = "TILEATTN_TUNE_FILE='" + (dir / "tune.conf") + "' ";
  Result r = run_cli(bench + " --json", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = parse_or_fail(r.out);
  ASSERT_NE(j.get("tune_file"), nullptr);
  EXPECT_EQ(j.get("tune_file")->type, Json::null);
  const std::string command = env + "'" + TILEATTN_CLI + "' " + bench + " --json >'" + (dir / "out.json") + "'";
  ASSERT_EQ(std::system(command.c_str()), 0);
  j = parse_or_fail(slurp(dir / "out.json"));
  EXPECT_EQ(j.get("tune_file")->str, dir / "tune.conf");
  EXPECT_EQ(j.get("block_q")->num, 32);
  const std::string human = env + "'" + TILEATTN_CLI + "' " + bench + " >'" + (dir / "out.txt") + "'";
  ASSERT_EQ(std::system(human.c_str()), 0);
  const std::string text = slurp(dir / "out.txt");
  const std::size_t line = text.find("\ntune_file:");
  ASSERT_NE(line, std::string::npos) << text;
  EXPECT_NE(text.substr(line, text.find('\n', line + 1) - line)
                .find(dir / "tune.conf" + " (written by `tileattn tune`; delete it to undo)"),
            std::string::npos)
      << text;
}

TEST(cliBench, JsonHasEveryDesignField) {
  TempDir dir;
  const Result r = run_cli("bench --batch 1 --heads 4 --kv-heads 2 --seq 64 --kv-seq 100 --dim 32 --causal "
                           "--reps 1 --threads 1 --json",
                           dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json j = parse_or_fail(r.out);
  expect_fields(j, {"ms", "gflops", "fraction_of_peak", "peak_rss_mb", "peak_gflops", "flops", "baseline_ms",
                    "speedup_vs_baseline", "baseline_gflops", "baseline_peak_rss_mb", "batch", "heads", "kv_heads",
                    "seq", "kv_seq", "dim", "threads", "reps", "block_q", "block_kv"},
                Json::number);
  expect_fields(j, {"isa", "dtype", "baseline_core"}, Json::string);
  expect_fields(j, {"rep_ms"}, Json::array);
  expect_fields(j, {"causal", "baseline"}, Json::boolean);
  EXPECT_TRUE(j.get("baseline") && j.get("baseline")->flag);
  expect_fields(j, {"baseline_error"}, Json::null);
  EXPECT_EQ(j.get("rep_ms")->items.size(), 1u);
  // Causal, bottom-right aligned: query i sees keys 0..i+36, so 64*37 + 63*64/2 pairs.
  EXPECT_EQ(j.get("flops")->num, 4.0 * 32 * (64 * 37 + 2016) * 4);
  EXPECT_NEAR(j.get("gflops")->num, j.get("flops")->num / j.get("ms")->num * 1e-6, 1e-3 * j.get("gflops")->num);
  EXPECT_NEAR(j.get("fraction_of_peak")->num, j.get("gflops")->num / j.get("peak_gflops")->num, 1e-6);
  EXPECT_NEAR(j.get("speedup_vs_baseline")->num, j.get("baseline_ms")->num / j.get("ms")->num,
              1e-6 * j.get("speedup_vs_baseline")->num);
  EXPECT_GT(j.get("peak_rss_mb")->num, 0);
}

// --dim-v: V's head dim apart from Q/K's; flops count 2 (D + DV) per pair,
// the baseline runs with it too; the backward takes it.
TEST(cliBench, ValueHeadDim) {
  TempDir dir;
  const Result r = run_cli("bench --heads 2 --kv-heads 1 --seq 64 --dim 192 --dim-v 128 --reps 1 --threads 1 --json", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json j = parse_or_fail(r.out);
  EXPECT_EQ(j.get("dim")->num, 192);
  EXPECT_EQ(j.get("dim_v")->num, 128);
  EXPECT_EQ(j.get("flops")->num, 2.0 * (192 + 128) * 64 * 64 * 2);
  EXPECT_GT(j.get("speedup_vs_baseline") ? j.get("speedup_vs_baseline")->num : 1.0, 0);
  for (const char* flags : {"--dim 576", "--dim 64 --dim-v 513", "--dim 577 --dim-v 512"}) {
    const Result bad = run_cli(std::string("bench --heads 2 --seq 64 --reps 1 --threads 1 --no-baseline ") + flags, dir);
    EXPECT_EQ(bad.status, 2) << flags;
    EXPECT_NE(bad.err.find("--dim"), std::string::npos) << flags << ": " << bad.err;
  }
  const Result backward =
      run_cli("bench --heads 2 --seq 64 --dim 64 --dim-v 32 --reps 1 --threads 1 --no-baseline --backward --json", dir);
  ASSERT_EQ(backward.status, 0) << backward.err;
  const Json b = parse_or_fail(backward.out);
  EXPECT_EQ(b.get("dim_v")->num, 32);
  // The backward's own tiles (backward_tiles), not the forward's.
  EXPECT_EQ(b.get("tile_reason")->str.rfind("backward", 0), 0u) << b.get("tile_reason")->str;
}

// bf16 inputs on a bf16 rung also report the matrix unit's peak and the
// fraction of it; other paths give null there.
TEST(cliBench, Bf16RungsReportTheirUnitsPeak) {
  TempDir dir;
  for (const char* dtype : {"bf16", "fp32"}) {
    const Result r = run_cli(std::string("bench --heads 2 --seq 64 --dim 32 --reps 1 --threads 1 --no-baseline --json "
                                         "--dtype ") + dtype, dir);
    ASSERT_EQ(r.status, 0) << r.err;
    const Json j = parse_or_fail(r.out);
    const std::string isa = j.get("isa")->str;
    const bool bf16_rung = (isa == "amx" || isa == "avx512bf16") && std::string(dtype) == "bf16";
    ASSERT_NE(j.get("bf16_peak_gflops"), nullptr);
    ASSERT_NE(j.get("fraction_of_bf16_peak"), nullptr);
    if (bf16_rung) {
      ASSERT_EQ(j.get("bf16_peak_gflops")->type, Json::number) << isa;
      EXPECT_GT(j.get("bf16_peak_gflops")->num, 0);
      EXPECT_NEAR(j.get("fraction_of_bf16_peak")->num, j.get("gflops")->num / j.get("bf16_peak_gflops")->num, 1e-6);
    } else {
      EXPECT_EQ(j.get("bf16_peak_gflops")->type, Json::null) << isa << " " << dtype;
    }
  }
}

// A decode step that stacks more query heads of a KV group than the few-rows
// products take (MLA: 128) runs the packed products, on the matrix unit for
// bf16 on a bf16 rung: that unit's peak is its yardstick, and a rate above
// the FMA peak is no warning. At most 8 stacked heads take the FMA products.
TEST(cliBench, DecodeOnThePackedProductsReportsTheBf16Peak) {
  TempDir dir;
  for (const int group : {16, 8}) {
    const Result r = run_cli("bench --decode --heads " + std::to_string(group) +
                                 " --kv-heads 1 --kv-seq 256 --dim 32 --dtype bf16 --reps 1 --threads 1 "
                                 "--no-baseline --peak-gflops 0.001 --bf16-peak-gflops 1000000 --json",
                             dir);
    ASSERT_EQ(r.status, 0) << r.err;
    const Json j = parse_or_fail(r.out);
    const std::string isa = j.get("isa")->str;
    if ((isa == "amx" || isa == "avx512bf16") && group > 8) {
      ASSERT_EQ(j.get("bf16_peak_gflops")->type, Json::number) << isa;
      EXPECT_EQ(j.get("bf16_peak_gflops")->num, 1000000);
      EXPECT_EQ(r.err, "") << group;
    } else {
      EXPECT_EQ(j.get("bf16_peak_gflops")->type, Json::null) << isa << " " << group;
      EXPECT_NE(r.err.find("fraction_of_peak is not meaningful"), std::string::npos) << r.err;
    }
  }
}

TEST(cliBench, NoBaselineStaysWithinInputsPlusOutputs) {
  TempDir dir;
  // q, k, v, o: 4 x 8 heads x 2048 x 128 x 4 bytes = 32 MiB.
  const Result r = run_cli("bench --heads 8 --seq 2048 --dim 128 --reps 1 --no-baseline --json", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json j = parse_or_fail(r.out);
  EXPECT_LT(j.get("peak_rss_mb")->num, 32 + 64);
  // The baseline's fields are there, null, as when OpenBLAS is missing.
  expect_fields(j, {"baseline_ms", "speedup_vs_baseline", "baseline_gflops", "baseline_core", "baseline_reps",
                    "baseline_peak_rss_mb", "baseline_error"},
                Json::null);
  ASSERT_NE(j.get("baseline"), nullptr);
  EXPECT_FALSE(j.get("baseline")->flag);
}

// Without a loadable OpenBLAS (here an empty file named libopenblas.so.0
// found first) the baseline's fields are null, baseline_error says why, and a
// sweep's baseline row says "missing".
TEST(cliBench, MissingOpenBlasGivesNullBaselineFields) {
  TempDir dir;
  std::ofstream(dir / "libopenblas.so.0").close();
  const char* old_path = std::getenv("LD_LIBRARY_PATH");
  const std::string saved = old_path ? old_path : "";
  ASSERT_EQ(setenv("LD_LIBRARY_PATH", dir.path().c_str(), 1), 0);
  const Result r = run_cli("bench --heads 1 --seq 16 --dim 16 --reps 1 --threads 1 --peak-gflops 10 --json", dir);
  const Result sweep = run_cli("bench --sweep --seqs 16 --dims 16 --masks none --heads 1 --threads 1 --reps 1 "
                               "--peak-gflops 10 --json",
                               dir);
  if (old_path) setenv("LD_LIBRARY_PATH", saved.c_str(), 1);
  else unsetenv("LD_LIBRARY_PATH");
  ASSERT_EQ(r.status, 0) << r.err;
  const Json j = parse_or_fail(r.out);
  expect_fields(j, {"baseline_ms", "speedup_vs_baseline", "baseline_gflops", "baseline_core", "baseline_reps",
                    "baseline_peak_rss_mb"},
                Json::null);
  expect_fields(j, {"baseline_error"}, Json::string);
  EXPECT_NE(j.get("baseline_error")->str.find("libopenblas.so.0"), std::string::npos);
  EXPECT_TRUE(j.get("baseline") && !j.get("baseline")->flag);
  ASSERT_EQ(sweep.status, 0) << sweep.err;
  const Json doc = parse_or_fail(sweep.out);
  ASSERT_NE(doc.get("rows"), nullptr);
  for (const Json& row : doc.get("rows")->items)
    EXPECT_EQ(row.get("status")->str, row.get("impl")->str == "tileattn" ? "ok" : "missing");
}

TEST(cliBench, BadFlagsAndBackward) {
  TempDir dir;
  Result r = run_cli("bench --seq 0", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err_lines().size(), 1u);
  r = run_cli("bench --heads 8 --kv-heads 3", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--kv-heads"), std::string::npos);
  r = run_cli("bench --seq 0 --backward", dir);
  EXPECT_EQ(r.status, 2);
}

// --softcap reaches the JSON, forward, backward and decode; a bad value is refused.
TEST(cliBench, Softcap) {
  TempDir dir;
  for (const char* pass : {" --seq 64", " --seq 64 --backward", " --kv-seq 64 --decode"}) {
    const Result r = run_cli(std::string("bench --heads 2 --dim 32 --reps 1 --threads 1 --no-baseline "
                                         "--causal --softcap 30 --json") + pass, dir);
    ASSERT_EQ(r.status, 0) << pass << ": " << r.err;
    const Json j = parse_or_fail(r.out);
    EXPECT_EQ(j.get("softcap")->num, 30.0);
    EXPECT_FALSE(j.get("alibi")->flag);
  }
  const Result alibi = run_cli("bench --heads 2 --seq 64 --dim 32 --reps 1 --threads 1 --no-baseline --alibi --json", dir);
  ASSERT_EQ(alibi.status, 0) << alibi.err;
  EXPECT_TRUE(parse_or_fail(alibi.out).get("alibi")->flag);
  const Result r = run_cli("bench --heads 2 --seq 64 --dim 32 --softcap -2", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--softcap"), std::string::npos) << r.err;
}

// --bf16-probabilities: bf16 inputs only (forward, backward or decode), named
// in the JSON; with another dtype it is refused (exit 2, naming it).
TEST(cliBench, Bf16Probabilities) {
  TempDir dir;
  const std::string base = "bench --heads 2 --dim 32 --reps 1 --threads 1 --no-baseline --json ";
  Result r = run_cli(base + "--seq 64 --dtype bf16 --bf16-probabilities", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(parse_or_fail(r.out).get("bf16_probabilities")->flag);
  r = run_cli(base + "--seq 64 --dtype bf16", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(parse_or_fail(r.out).get("bf16_probabilities")->flag);
  for (const char* pass : {"--seq 64 --backward", "--kv-seq 64 --decode"}) {
    r = run_cli(base + "--dtype bf16 " + pass + " --bf16-probabilities", dir);
    ASSERT_EQ(r.status, 0) << pass << ": " << r.err;
    EXPECT_TRUE(parse_or_fail(r.out).get("bf16_probabilities")->flag) << pass;
  }
  for (const char* bad : {"--seq 64 --dtype fp32", "--kv-seq 64 --dtype fp16 --decode"}) {
    r = run_cli(base + bad + " --bf16-probabilities", dir);
    EXPECT_EQ(r.status, 2) << bad;
    EXPECT_NE(r.err.find("--bf16-probabilities"), std::string::npos) << bad << ": " << r.err;
  }
}

// --sinks S.npy reaches the JSON, forward, backward and decode; a file of
// the wrong length or with a non-finite sink is refused (exit 2, naming it).
TEST(cliBench, Sinks) {
  TempDir dir;
  const std::vector<float> sinks{1.0f, -0.5f}, three{1.0f, 2.0f, 3.0f}, bad{1.0f, NAN};
  io::write_npy(dir / "s.npy", io::NpyType::f32, {2}, sinks.data());
  io::write_npy(dir / "s3.npy", io::NpyType::f32, {3}, three.data());
  io::write_npy(dir / "bad.npy", io::NpyType::f32, {2}, bad.data());
  const std::string base = "bench --heads 2 --dim 32 --reps 1 --threads 1 --no-baseline --causal ";
  for (const char* pass : {" --seq 64", " --seq 64 --backward", " --kv-seq 64 --decode"}) {
    Result r = run_cli(base + "--json --sinks '" + (dir / "s.npy") + "'" + pass, dir);
    ASSERT_EQ(r.status, 0) << pass << ": " << r.err;
    EXPECT_TRUE(parse_or_fail(r.out).get("sinks")->flag) << pass;
    r = run_cli(base + "--json" + pass, dir);
    ASSERT_EQ(r.status, 0) << pass << ": " << r.err;
    EXPECT_FALSE(parse_or_fail(r.out).get("sinks")->flag) << pass;
  }
  Result r = run_cli(base + "--seq 64 --sinks '" + (dir / "s3.npy") + "'", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--sinks"), std::string::npos) << r.err;
  r = run_cli(base + "--seq 64 --sinks '" + (dir / "bad.npy") + "'", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("sinks[1] must be finite"), std::string::npos) << r.err;
}

// Power-of-two head counts: 2^(-8 (h + 1) / n); 12 heads: the 8 of 8, then
// 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (every other slope of 16).
TEST(cliAlibi, StandardSlopes) {
  const std::vector<float> four = cli::standard_alibi_slopes(4);
  EXPECT_EQ(four, (std::vector<float>{0.25f, 0.0625f, 0.015625f, 0.00390625f}));
  const std::vector<float> twelve = cli::standard_alibi_slopes(12);
  ASSERT_EQ(twelve.size(), 12u);
  EXPECT_EQ(twelve[0], 0.5f);
  EXPECT_EQ(twelve[7], 0.00390625f);
  EXPECT_FLOAT_EQ(twelve[8], std::exp2(-0.5f));
  EXPECT_FLOAT_EQ(twelve[11], std::exp2(-3.5f));
}

TEST(cliBench, BackwardCountsTenDFlopsPerPair) {
  TempDir dir;
  const Result r = run_cli("bench --heads 2 --seq 48 --kv-seq 48 --dim 16 --window 5,-1 --reps 1 --backward --json", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json j = parse_or_fail(r.out);
  EXPECT_TRUE(j.get("backward")->flag);
  // Window left 5, right unbounded: query i sees keys max(0, i-5)..47.
  double pairs = 0;
  for (int i = 0; i < 48; ++i) pairs += 48 - std::max(0, i - 5);
  EXPECT_EQ(j.get("flops")->num, 10.0 * 16 * pairs * 2);
  expect_fields(j, {"ms", "gflops", "fraction_of_peak", "baseline_ms", "speedup_vs_baseline"}, Json::number);
}

TEST(cliCheck, PassesOnThisMachineAndReportsEachCase) {
  TempDir dir;
  const Result r = run_cli("check --isa auto --json", dir);
  EXPECT_EQ(r.status, 0) << r.out.substr(0, 2000);
  const Json j = parse_or_fail(r.out);
  EXPECT_TRUE(j.get("ok")->flag);
  EXPECT_EQ(j.get("failed")->num, 0);
  const Json& cases = *j.get("cases");
  EXPECT_GT(cases.items.size(), 50u);
  EXPECT_EQ(j.get("passed")->num, double(cases.items.size()));
  for (const Json& c : cases.items) {
    expect_fields(c, {"max_error", "tolerance", "lse_error", "lse_tolerance", "ratio"}, Json::number);
    expect_fields(c, {"name", "isa", "dtype"}, Json::string);
    expect_fields(c, {"error"}, Json::null);  // a case that threw names the exception there
    EXPECT_LE(c.get("max_error")->num, c.get("tolerance")->num) << c.get("name")->str;
    EXPECT_LE(c.get("ratio")->num, 1.0) << c.get("name")->str;
  }
  EXPECT_EQ(run_cli("check --isa sparc", dir).status, 2);
}

// The rule bites: outputs scaled by 1.001 fail every fp32 case, by 1.01 every
// case (fp16 and bf16 included).
TEST(cliCheck, PerturbedOutputsFailEveryCase) {
  TempDir dir;
  for (const double perturb : {1e-3, 1e-2}) {
    const std::string flag = perturb == 1e-3 ? "0.001" : "0.01";
    const Result r = run_cli("check --isa auto --json --perturb " + flag, dir);
    EXPECT_EQ(r.status, 1) << r.err;
    const Json j = parse_or_fail(r.out);
    EXPECT_FALSE(j.get("ok")->flag);
    EXPECT_EQ(j.get("perturb")->num, perturb);
    std::set<std::string> dtypes;
    for (const Json& c : j.get("cases")->items) {
      const std::string dtype = c.get("dtype")->str;
      dtypes.insert(dtype);
      if (dtype == "fp32" || perturb == 1e-2) {
        EXPECT_FALSE(c.get("ok")->flag) << "perturb " << perturb << ": " << c.get("name")->str << " passed";
        EXPECT_GT(c.get("max_error")->num, c.get("tolerance")->num) << c.get("name")->str;
      }
    }
    EXPECT_EQ(dtypes, (std::set<std::string>{"fp32", "fp16", "bf16"}));
  }
  const Result bad = run_cli("check --perturb lots", dir);
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--perturb"), std::string::npos) << bad.err;
}

// The error for an unknown --isa lists every value the help offers, "all" too.
TEST(cliCheck, UnknownIsaListsEveryChoice) {
  TempDir dir;
  const Result r = run_cli("check --isa bogus", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err_lines().size(), 1u) << r.err;
  EXPECT_NE(r.err.find("--isa: expected all, auto, generic, avx2, avx512, avx512bf16 or amx, got 'bogus'"), std::string::npos)
      << r.err;
}

// A fraction of peak above 1 is impossible: bench still prints its JSON (on
// stdout, alone) and warns on stderr. A peak of 0.001 GFLOP/s forces it.
TEST(cliBench, WarnsWhenTheFractionOfPeakIsAboveOne) {
  TempDir dir;
  const Result r = run_cli("bench --heads 2 --seq 64 --dim 32 --reps 1 --threads 1 --no-baseline --peak-gflops 0.001 --json", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json j = parse_or_fail(r.out);
  EXPECT_GT(j.get("fraction_of_peak")->num, 1);
  EXPECT_NE(r.err.find("warning: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fraction_of_peak is not meaningful"), std::string::npos) << r.err;
}

// --bf16-peak-gflops stands in for the AMX / vdpbf16ps peak of bf16 inputs on
// a bf16 rung (which machines without AMX or AVX512-BF16 do not run: there
// the field is null whatever is given); out of range, an error naming it.
TEST(cliBench, GivenBf16PeakIsTheOneReported) {
  TempDir dir;
  const Result r = run_cli("bench --heads 2 --seq 64 --dim 32 --dtype bf16 --reps 1 --threads 1 --no-baseline "
                           "--peak-gflops 1000000 --bf16-peak-gflops 0.5 --json",
                           dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json j = parse_or_fail(r.out);
  const std::string isa = j.get("isa")->str;
  if (isa == "amx" || isa == "avx512bf16") {
    EXPECT_EQ(j.get("bf16_peak_gflops")->num, 0.5);
    const double gflops = j.get("gflops")->num;  // the JSON prints 9 significant digits
    EXPECT_NEAR(j.get("fraction_of_bf16_peak")->num, gflops / 0.5, 1e-7 * gflops / 0.5);
  } else {
    EXPECT_EQ(j.get("bf16_peak_gflops")->type, Json::null) << isa;
  }
  const Result bad = run_cli("bench --heads 2 --seq 64 --dim 32 --reps 1 --bf16-peak-gflops 0 --json", dir);
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--bf16-peak-gflops"), std::string::npos) << bad.err;
  EXPECT_TRUE(bad.out.empty()) << bad.out;
}

// Each fraction is checked against its own yardstick: on a bf16 rung a rate
// above the bf16 peak warns (not only one above max(FMA peak, bf16 peak)),
// and a rate above the FMA peak does not (the bf16 products do not run on the FMAs).
TEST(cliBench, WarnsWhenTheFractionOfTheBf16PeakIsAboveOne) {
  const char* rung = isa_available(Isa::amx) ? "amx" : isa_available(Isa::avx512bf16) ? "avx512bf16" : nullptr;
  if (!rung) GTEST_SKIP() << "no bf16 rung on this CPU";
  ASSERT_EQ(setenv("TILEATTN_ISA", rung, 1), 0);
  struct Unset {
    ~Unset() { unsetenv("TILEATTN_ISA"); }
  } unset_at_exit;
  TempDir dir;
  const std::string bench = "bench --heads 2 --seq 64 --dim 32 --dtype bf16 --reps 1 --threads 1 --no-baseline --json ";
  Result r = run_cli(bench + "--peak-gflops 1000000 --bf16-peak-gflops 0.001", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = parse_or_fail(r.out);
  EXPECT_GT(j.get("fraction_of_bf16_peak")->num, 1);
  EXPECT_NE(r.err.find("warning: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fraction_of_bf16_peak is not meaningful"), std::string::npos) << r.err;
  r = run_cli(bench + "--peak-gflops 0.001 --bf16-peak-gflops 1000000", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  j = parse_or_fail(r.out);
  EXPECT_GT(j.get("fraction_of_peak")->num, 1);
  EXPECT_EQ(r.err, "");
}

// The help names the candidates the command times (6 block_q x 4 block_kv).
TEST(cliTune, HelpListsTheTimedCandidates) {
  TempDir dir;
  const Result r = run_cli("tune --help", dir);
  ASSERT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("block_q in {32,64,96,128,192,256} x block_kv in {32,64,128,256}"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("To undo: delete the file"), std::string::npos) << r.out;
}

// An --out that cannot be written is refused before the timing starts (it
// once ran every candidate, printed them, and failed at the rename leaving
// "<out>.tmp"); --dims reaches the library's largest head dim.
TEST(cliTune, RefusesADirectoryBeforeTiming) {
  TempDir dir;
  ASSERT_EQ(mkdir((dir / "d").c_str(), 0755), 0);
  const Result r = run_cli("tune --dims 16 --out '" + (dir / "d") + "'", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--out: '" + (dir / "d") + "' is a directory"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"d"}));  // no d.tmp
  // Tuned calls have V's head dim equal to Q/K's: 513..576 are refused
  // before any timing, and no directory of --out is made.
  for (const char* dims : {"577", "16,513"}) {
    const Result big = run_cli(std::string("tune --dims ") + dims + " --out '" + (dir / "new/t.conf") + "'", dir);
    EXPECT_EQ(big.status, 2) << dims;
    EXPECT_NE(big.err.find("--dims"), std::string::npos) << big.err;
    EXPECT_NE(big.err.find("512"), std::string::npos) << big.err;
    EXPECT_EQ(dir.files(), (std::vector<std::string>{"d"})) << dims;
  }
}

// A head dim or dtype listed twice would be timed twice and written as two
// entries for one key: refused before any timing, naming the flag.
TEST(cliTune, RefusesDuplicates) {
  TempDir dir;
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--dims 16,32,16", "--dims: 16 given twice"},
           {"--dims 16 --dtypes fp32,bf16,fp32", "--dtypes: fp32 given twice"},
           {"--dims 16 --dtypes fp16,half", "--dtypes: fp16 given twice"}}) {
    const Result r = run_cli("tune " + flags + " --out '" + (dir / "t.conf") + "' --json", dir);
    EXPECT_EQ(r.status, 2) << flags;
    EXPECT_EQ(r.err, "tileattn: " + message + "\n") << flags;
    EXPECT_TRUE(r.out.empty()) << flags;
    EXPECT_TRUE(dir.files().empty()) << flags;
  }
}

TEST(cliTune, WritesTheWinnersThatInfoThenUses) {
  TempDir dir;
  const Result r = run_cli("tune --dims 16 --dtypes fp32 --out '" + (dir / "tune.conf") + "' --json", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const Json j = parse_or_fail(r.out);
  EXPECT_EQ(j.get("results")->items.size(), 24u);  // 6 block_q x 4 block_kv candidates (cmd_tune.cpp)
  ASSERT_EQ(j.get("winners")->items.size(), 1u);
  const Json& w = j.get("winners")->items[0];
  // The entry names the code that ran: avx512 for fp32 on the bf16 rungs (kernel_isa).
  EXPECT_EQ(w.get("isa")->str, j.get("isa")->str == "amx" || j.get("isa")->str == "avx512bf16" ? "avx512" : j.get("isa")->str);
  const std::string expected_line = w.get("isa")->str + " 16 fp32 " + std::to_string(int(w.get("block_q")->num)) +
                                    "x" + std::to_string(int(w.get("block_kv")->num));
  EXPECT_NE(slurp(dir / "tune.conf").find(expected_line), std::string::npos) << slurp(dir / "tune.conf");
}

}  // namespace
}  // namespace tileattn::cli_test
