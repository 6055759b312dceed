// `tileattn decode`: its JSON fields (docs/inference.md), which of them a
// run has (paged, threads), their relations, and usage errors (exit 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "cli/cli_support.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::cli_test {
namespace {

// A small decode run: 64 cached tokens, 4 steps, 4/2 heads of 32 dims, bf16.
const char* const kSmall = "decode --prompt 64 --steps 4 --heads 4 --kv-heads 2 --dim 32 --recompute-steps 1 --json";

// `command` is the whole command line (kSmall plus flags by default).
Json decode_json(const std::string& flags, const std::string& command = kSmall) {
  TempDir dir;
  const Result r = run_cli(command + " " + flags, dir);
  EXPECT_EQ(r.status, 0) << r.err;
  Json j;
  EXPECT_TRUE(JsonParser(r.out).parse(j)) << "not one JSON value: " << r.out;
  EXPECT_EQ(j.type, Json::object);
  return j;
}

double number(const Json& j, const std::string& key) {
  const Json* v = j.get(key);
  EXPECT_NE(v, nullptr) << "missing field " << key;
  if (v == nullptr) return 0;
  EXPECT_EQ(v->type, Json::number) << key;
  return v->num;
}

TEST(cliDecode, PagedTwoThreadsReportsEveryRatio) {
  const Json j = decode_json("--paged --threads 2");
  EXPECT_TRUE(j.get("paged") && j.get("paged")->flag);
  EXPECT_EQ(number(j, "page_size"), 16);
  EXPECT_EQ(number(j, "threads"), 2);
  // K and V of the last step: 2 x batch 1 x 2 KV heads x (64 + 4) tokens x 32 dims x 2 bytes.
  EXPECT_EQ(number(j, "kv_bytes_per_step"), 2.0 * 2 * 68 * 32 * 2);
  for (const char* key : {"ms_per_token", "tokens_per_s", "kv_gb_per_s", "read_gb_per_s",
                          "fraction_of_bandwidth", "contiguous_ms_per_token", "paged_vs_contiguous",
                          "threads1_ms_per_token", "thread_speedup", "read1_gb_per_s",
                          "read_thread_speedup", "recompute_ms_per_token", "speedup_vs_recompute"})
    EXPECT_GT(number(j, key), 0) << key;
  EXPECT_NEAR(number(j, "tokens_per_s"), 1e3 / number(j, "ms_per_token"), 1e-6 * number(j, "tokens_per_s"));
  EXPECT_EQ(number(j, "recompute_steps"), 1);
  // A cache this small (17 KiB) is not evicted between steps.
  EXPECT_EQ(number(j, "evict_bytes"), 0);
}

// --cold evicts a small cache too (a model's short decode): the same eviction
// buffer, and the memory read it times.
TEST(cliDecode, ColdEvictsASmallCache) {
  const Json j = decode_json("--threads 2 --cold");
  const double l3 = double(std::max<int64_t>(cache_sizes().l3, int64_t{32} << 20));
  EXPECT_EQ(number(j, "evict_bytes"), 2 * l3);
  EXPECT_GT(number(j, "memory_read_gb_per_s"), 0);
  EXPECT_GT(number(j, "thread_speedup"), 0);
}

// From 4 MiB of K/V, every step and read pass starts after reading twice the
// last-level cache (at least 64 MiB).
TEST(cliDecode, LargeCachesAreEvictedBetweenSteps) {
  const Json j = decode_json("--threads 1", "decode --prompt 8192 --steps 2 --heads 2 --kv-heads 2 --dim 64 "
                                            "--recompute-steps 0 --json");
  EXPECT_EQ(number(j, "kv_bytes_per_step"), 2.0 * 2 * 8194 * 64 * 2);
  const double l3 = double(std::max<int64_t>(cache_sizes().l3, int64_t{32} << 20));
  EXPECT_EQ(number(j, "evict_bytes"), 2 * l3);
  EXPECT_GT(number(j, "fraction_of_bandwidth"), 0);
  // The eviction read before each read pass is timed: main memory's read rate.
  EXPECT_GT(number(j, "memory_read_gb_per_s"), 0);
  EXPECT_GT(number(j, "kv_vs_memory_read"), 0);
}

// Without --paged and with one thread the paired ratios are null (present,
// as every documented field is).
TEST(cliDecode, ContiguousOneThreadHasNoPairedRatios) {
  const Json j = decode_json("--threads 1 --dtype fp32");
  EXPECT_TRUE(j.get("paged") && !j.get("paged")->flag);
  ASSERT_NE(j.get("page_size"), nullptr);
  EXPECT_EQ(j.get("page_size")->type, Json::null);
  EXPECT_EQ(number(j, "kv_bytes_per_step"), 2.0 * 2 * 68 * 32 * 4);
  for (const char* key : {"paged_vs_contiguous", "contiguous_ms_per_token", "thread_speedup",
                          "threads1_ms_per_token", "read1_gb_per_s", "read_thread_speedup"}) {
    ASSERT_NE(j.get(key), nullptr) << key << " without --paged / with one thread";
    EXPECT_EQ(j.get(key)->type, Json::null) << key;
  }
  EXPECT_GT(number(j, "fraction_of_bandwidth"), 0);
}

// --kv-dtype: a quantized cache's bytes (int8: elements and the two scales
// per token and KV head; fp8: elements), and a float one sets the dtype.
TEST(cliDecode, KvDtypeQuantizesTheCache) {
  Json j = decode_json("--threads 1 --kv-dtype int8");
  EXPECT_EQ(j.get("kv_dtype")->str, "int8");
  EXPECT_EQ(j.get("dtype")->str, "bf16");
  EXPECT_EQ(number(j, "kv_bytes_per_step"), 2.0 * 2 * 68 * (32 + 4));
  // The same loop on a bf16 cache runs interleaved with it: the issue's
  // quantized / unquantized step time, paired per step.
  EXPECT_GT(number(j, "unquantized_ms_per_token"), 0);
  EXPECT_GT(number(j, "ms_vs_unquantized"), 0);
  j = decode_json("--threads 2 --kv-dtype fp8_e4m3 --paged");
  EXPECT_EQ(j.get("kv_dtype")->str, "fp8_e4m3");
  EXPECT_EQ(number(j, "kv_bytes_per_step"), 2.0 * 2 * 68 * 32);
  for (const char* key : {"paged_vs_contiguous", "thread_speedup", "unquantized_ms_per_token", "ms_vs_unquantized"})
    EXPECT_GT(number(j, key), 0) << key;
  j = decode_json("--threads 1 --kv-dtype fp16");
  EXPECT_EQ(j.get("kv_dtype")->str, "fp16");
  EXPECT_EQ(j.get("dtype")->str, "fp16");
  for (const char* key : {"unquantized_ms_per_token", "ms_vs_unquantized"}) {
    ASSERT_NE(j.get(key), nullptr) << key;
    EXPECT_EQ(j.get(key)->type, Json::null) << key << " of an unquantized cache";
  }
  // A small cache is not evicted: no main-memory read is timed.
  ASSERT_NE(j.get("memory_read_gb_per_s"), nullptr);
  EXPECT_EQ(j.get("memory_read_gb_per_s")->type, Json::null);
}

// MLA's absorbed decode: K 576 wide, V 512, one KV head; the bytes a step
// reads count each at its own width.
TEST(cliDecode, ValueHeadDim) {
  for (const char* paged : {"", "--paged"}) {
    const Json j = decode_json(paged, "decode --prompt 64 --steps 2 --heads 8 --kv-heads 1 --dim 576 --dim-v 512 "
                                      "--recompute-steps 1 --json");
    EXPECT_EQ(number(j, "dim"), 576);
    EXPECT_EQ(number(j, "dim_v"), 512);
    EXPECT_EQ(number(j, "rotary_dim"), 576);  // RoPE over all of --dim by default
    // batch 1 x 1 KV head x (64 + 2) tokens x (576 + 512) dims x 2 bytes.
    EXPECT_EQ(number(j, "kv_bytes_per_step"), 66.0 * (576 + 512) * 2);
    EXPECT_GT(number(j, "speedup_vs_recompute"), 0);
  }
  // MLA rotates 64 of the 576 dims; an odd --dim is fine when the rotated
  // part is even.
  for (const char* dims : {"--dim 576 --dim-v 512 --rotary-dim 64", "--dim 65 --rotary-dim 32"}) {
    const Json j = decode_json("", std::string("decode --prompt 64 --steps 2 --heads 4 --kv-heads 1 ") + dims +
                                       " --recompute-steps 1 --json");
    EXPECT_EQ(number(j, "rotary_dim"), std::string(dims).find("64") != std::string::npos ? 64 : 32) << dims;
    EXPECT_GT(number(j, "ms_per_token"), 0) << dims;
  }
  const Json rounded = decode_json("", "decode --prompt 64 --steps 2 --heads 16 --kv-heads 1 --dim 64 "
                                       "--recompute-steps 1 --bf16-probabilities --json");
  EXPECT_TRUE(rounded.get("bf16_probabilities")->flag);
  // Quantized caches take it too (the few-rows P V on avx512bf16 with VBMI).
  for (const char* kv : {"fp8_e4m3", "int8"}) {
    const Json quantized = decode_json("", std::string("decode --prompt 64 --steps 2 --heads 8 --kv-heads 2 --dim 64 "
                                                       "--dtype bf16 --kv-dtype ") +
                                               kv + " --recompute-steps 1 --bf16-probabilities --json");
    EXPECT_TRUE(quantized.get("bf16_probabilities")->flag) << kv;
    EXPECT_EQ(quantized.get("kv_dtype")->str, kv);
  }
}

// --new-tokens N: each step appends N tokens per sequence (speculative
// verification, chunked prefill); per-token times are the step's over N.
TEST(cliDecode, NewTokensAppendSeveralTokensPerStep) {
  for (const char* flags : {"--threads 2 --new-tokens 8 --paged --page-size 4", "--threads 1 --new-tokens 8 --kv-dtype int8",
                            "--threads 1 --new-tokens 40 --kv-dtype fp8_e4m3 --batch 2"}) {
    const Json j = decode_json(flags);
    const double n = number(j, "new_tokens"), batch = number(j, "batch");
    EXPECT_EQ(n, std::string(flags).find("40") != std::string::npos ? 40 : 8) << flags;
    // The last step's cache: 64 prompt tokens and 4 steps of N, 2 KV heads of
    // 32 + 32 dims (bf16 2 bytes; int8 1 byte and two 4-byte scales; fp8 1 byte).
    const std::string kv = j.get("kv_dtype")->str;
    const double per_token = kv == "bf16" ? 64 * 2 : kv == "int8" ? 64 + 8 : 64;
    EXPECT_EQ(number(j, "kv_bytes_per_step"), batch * 2 * (64 + 4 * n) * per_token) << flags;
    const double step = number(j, "ms_per_step");
    EXPECT_GT(step, 0) << flags;
    EXPECT_NEAR(number(j, "ms_per_token"), step / n, 1e-9 * step) << flags;
    EXPECT_NEAR(number(j, "tokens_per_s"), batch * n * 1e3 / step, 1e-6 * number(j, "tokens_per_s")) << flags;
    EXPECT_GT(number(j, "speedup_vs_recompute"), 0) << flags;
  }
  // Positions past int32 (2^16 steps of 2^16 tokens) name the flag.
  TempDir dir;
  const Result r = run_cli("decode --prompt 16 --steps 65536 --new-tokens 65536 --json", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--new-tokens: --prompt plus --steps x --new-tokens is too long"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  // The default is one token per step.
  const Json one = decode_json("--threads 1");
  EXPECT_EQ(number(one, "new_tokens"), 1);
  EXPECT_EQ(number(one, "ms_per_token"), number(one, "ms_per_step"));
}

TEST(cliDecode, UsageErrorsNameTheFlag) {
  TempDir dir;
  const struct {
    const char* flags;
    const char* names;
  } cases[] = {
      {"--page-size 8", "--page-size"},  // without --paged
      {"--heads 4 --kv-heads 3", "--kv-heads"},  // does not divide --heads
      {"--dim 33", "--dim"},             // RoPE needs an even head dim
      {"--rotary-dim 63", "--rotary-dim"},  // odd
      {"--rotary-dim 256", "--rotary-dim"},  // past --dim 128
      {"--rotary-dim 0", "--rotary-dim"},
      {"--steps 0", "--steps"},
      {"--new-tokens 0", "--new-tokens"},
      {"--new-tokens 65537", "--new-tokens"},
      {"--dtype fp64", "fp64"},
      {"--kv-dtype int4", "--kv-dtype"},
      {"--dtype fp32 --kv-dtype bf16", "--kv-dtype bf16 differs from --dtype fp32"},
      {"--dim 576", "--dim-v"},          // V would be 576 wide
      {"--dim-v 600", "--dim-v"},
      {"--dtype fp32 --bf16-probabilities", "--bf16-probabilities"},
      {"--dtype fp16 --kv-dtype int8 --bf16-probabilities", "--bf16-probabilities"},
  };
  for (const auto& c : cases) {
    const Result r = run_cli(std::string("decode --prompt 16 --steps 2 --json ") + c.flags, dir);
    EXPECT_EQ(r.status, 2) << c.flags;
    EXPECT_NE(r.err.find(c.names), std::string::npos) << c.flags << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.flags << ": " << r.out;
  }
}

// The cache-size limit counts what a paged cache allocates, whole pages: 18
// tokens in one page of 2^31 rows is 2^31 x 8 KV heads x 128 dims per K, far
// past the limit, though 18 rows are not.
TEST(cliDecode, PagedCacheLimitCountsWholePages) {
  TempDir dir;
  const Result r = run_cli("decode --paged --page-size 2147483648 --prompt 16 --steps 2 --json", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "tileattn: decode: the cache would be too large\n");
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// A shape whose buffers exceed the machine's memory (here 183-488 GiB) is a
// usage error naming the flags, before anything is allocated (an allocation
// past memory can succeed and the process then be killed with no message);
// where the recompute loop's Q and O are what is too large, the message says
// how to leave them out.
TEST(cliDecode, BuffersBeyondTheMachinesMemoryAreAUsageError) {
  TempDir dir;
  Result r = run_cli("decode --dtype fp32 --prompt 2000000 --batch 8 --heads 8 --kv-heads 8 --steps 2 --json", dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("decode: --batch 8 --kv-heads 8 --prompt 2000000 --dim 128"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("GiB of buffers, more than this machine's"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--recompute-steps 0 leaves it out"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = run_cli("decode --dtype fp32 --prompt 2000000 --batch 8 --heads 8 --kv-heads 8 --steps 2 --recompute-steps 0",
              dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("more than this machine's"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--recompute-steps 0 leaves"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// One step: the recompute loop defaults to min(2, --steps) steps, since each
// appends one of the generated tokens to a cache of prompt + steps; more
// recompute steps than steps is an error naming the flag.
TEST(cliDecode, OneStepAndRecomputeStepsAtMostSteps) {
  TempDir dir;
  const std::string one = "decode --prompt 16 --steps 1 --heads 2 --kv-heads 1 --dim 16 --threads 1 --json";
  for (const char* paged : {"", " --paged"}) {
    const Result r = run_cli(one + paged, dir);
    ASSERT_EQ(r.status, 0) << paged << ": " << r.err;
    Json j;
    ASSERT_TRUE(JsonParser(r.out).parse(j)) << r.out;
    EXPECT_EQ(number(j, "recompute_steps"), 1) << paged;
    EXPECT_GT(number(j, "speedup_vs_recompute"), 0) << paged;
  }
  const Result r = run_cli(one + " --recompute-steps 2", dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--recompute-steps: must be at most --steps (1)"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// The thread pool's polling window (core/thread_pool.cpp): read at the first
// parallel region; 0 is valid (workers sleep at once), anything else but an
// integer in 0..10^7 is an error naming the variable.
TEST(cliDecode, SpinWindowSetting) {
  TempDir dir;
  const std::string run = std::string(kSmall) + " --threads 2";
  ASSERT_EQ(setenv("TILEATTN_SPIN_US", "0", 1), 0);
  Result r = run_cli(run, dir);
  EXPECT_EQ(r.status, 0) << r.err;
  for (const char* bad : {"abc", "-1", "20000000", "5us"}) {
    ASSERT_EQ(setenv("TILEATTN_SPIN_US", bad, 1), 0);
    r = run_cli(run, dir);
    EXPECT_EQ(r.status, 2) << bad;
    EXPECT_NE(r.err.find("TILEATTN_SPIN_US"), std::string::npos) << bad << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << bad;
  }
  unsetenv("TILEATTN_SPIN_US");
}

}  // namespace
}  // namespace tileattn::cli_test
