// Memory: a failed allocation is a clear error at the C and CLI boundaries,
// never a crash; the forward's scratch does not grow with the sequence length.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "testing/problem_case.hpp"
#include "tileattn/tileattn.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TILEATTN_SANITIZER_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TILEATTN_SANITIZER_BUILD 1
#endif
#endif

namespace tileattn::reliability {
namespace {

// Kilobytes of a /proc/self/status field (VmRSS, VmHWM, VmSize).
int64_t status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return std::atoll(line.c_str() + prefix.size());
  return -1;
}

// A forward call through the C API whose float64 reference path (isa
// "reference") needs seqlen_q x head_dim doubles, with Q read through a zero
// row stride and O in untouched sparse memory, so the caller's own buffers
// cost almost nothing.
struct HugeReferenceCall {
  int64_t rows = int64_t{1} << 24;
  int64_t dim = 64;
  std::vector<float> q, k, v;
  void* o = nullptr;
  size_t o_bytes = 0;
  tileattn_forward_args args;

  HugeReferenceCall() : q(size_t(dim), 0.5f), k(size_t(4 * dim), 0.25f), v(size_t(4 * dim), 1.0f) {
    o_bytes = size_t(rows * dim * 4);
    o = mmap(nullptr, o_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    tileattn_forward_args_init(&args);
    args.batch = args.heads = args.kv_heads = 1;
    args.seqlen_q = rows;
    args.seqlen_k = 4;
    args.head_dim = dim;
    args.dtype = TILEATTN_F32;
    args.q = {q.data(), {0, 0, 0, 1}};  // every query row is the same row
    args.k = {k.data(), {4 * dim, 4 * dim, dim, 1}};
    args.v = {v.data(), {4 * dim, 4 * dim, dim, 1}};
    args.o = {o, {rows * dim, rows * dim, dim, 1}};
    args.isa = TILEATTN_ISA_REFERENCE;
    args.threads = 1;
  }
  ~HugeReferenceCall() {
    if (o != MAP_FAILED && o) munmap(o, o_bytes);
  }
  bool output_untouched() const {
    // Any page written would hold a nonzero float (results are 1.0).
    const auto* bytes = static_cast<const unsigned char*>(o);
    for (size_t i = 0; i < o_bytes; i += 4096 * 16)
      if (bytes[i] != 0) return false;
    return true;
  }
};

// In a child process whose address space is capped just above what it uses,
// the C API reports TILEATTN_OUT_OF_MEMORY with a clear message and writes
// nothing, instead of crashing.
TEST(Memory, CApiReportsOutOfMemoryUnderAnAddressSpaceLimit) {
#ifdef TILEATTN_SANITIZER_BUILD
  GTEST_SKIP() << "sanitizer runtimes reserve terabytes of address space; RLIMIT_AS cannot "
                  "be applied (this test runs in the plain build)";
#else
  std::fflush(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    HugeReferenceCall call;
    if (call.o == MAP_FAILED) _exit(10);
    // Warm up the library (thread pool, CPU detection) before the cap.
    testing::Case small;
    small.seqlen_q = small.seqlen_k = 8;
    small.head_dim = 16;
    testing::CaseData warm(small);
    // One thread: the parent's pool workers do not exist in this child.
    warm.args.threads = 1;
    attention_forward(warm.args);
    const int64_t used = status_kb("VmSize") * 1024;
    const rlimit cap{rlim_t(used + (int64_t{256} << 20)), rlim_t(used + (int64_t{256} << 20))};
    if (setrlimit(RLIMIT_AS, &cap) != 0) _exit(11);
    const tileattn_status status = tileattn_forward(&call.args);
    const std::string message = tileattn_last_error();
    if (status != TILEATTN_OUT_OF_MEMORY) {
      std::fprintf(stderr, "status %d, message '%s'\n", int(status), message.c_str());
      _exit(12);
    }
    if (message.find("out of memory") == std::string::npos) _exit(13);
    if (!call.output_untouched()) _exit(14);
    _exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus)) << "the child crashed (signal " << WTERMSIG(wstatus) << ")";
  EXPECT_EQ(WEXITSTATUS(wstatus), 0)
      << "10: mmap failed, 11: setrlimit failed, 12: wrong status, 13: unclear message, 14: O written";
#endif
}

#ifdef TILEATTN_CLI
// The CLI turns std::bad_alloc into one line and exit status 2.
TEST(Memory, CliReportsOutOfMemoryForAnAbsurdButValidSize) {
#ifdef TILEATTN_SANITIZER_BUILD
  GTEST_SKIP() << "ulimit -v cannot be applied under a sanitizer runtime";
#else
  // The process id keeps two test runs on one machine (a second checkout's
  // suite) from writing the same file.
  const std::string err = ::testing::TempDir() + "tileattn_oom_stderr_" + std::to_string(getpid()) + ".txt";
  // 2^18 rows x 8 heads x 128 dims x 4 bytes = 1 GiB per tensor, 4 GiB for
  // q, k, v and o: within any machine's memory (bench refuses shapes beyond
  // it before allocating, naming the flags), beyond the 2.4 GiB address-space
  // cap, which makes the failure certain whatever the overcommit policy.
  const std::string command = "ulimit -v 2500000; exec " + std::string(TILEATTN_CLI) +
                              " bench --seq 262144 --heads 8 --dim 128 --no-baseline --reps 1 2> " + err;
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "the CLI crashed";
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::ifstream in(err);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(err.c_str());
  EXPECT_NE(text.find("out of memory"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << "expected one line: " << text;
#endif
}
#endif

// Scratch is a function of the tile sizes and the thread count only: a
// decode step over 2^21 keys peaks at about the same resident memory as one
// over 2^12 keys. K and V are read through a zero row stride (every key the
// same row), so the inputs themselves cost nothing; a buffer that grew with
// the key count (a score row: 8 MiB at 2^21 keys) would show.
TEST(Memory, ForwardScratchDoesNotGrowWithSequenceLength) {
  auto peak_growth_kb = [](int64_t keys) {
    const int64_t dim = 64;
    std::vector<float> q(size_t(4 * dim), 0.5f), k(size_t(dim), 0.25f), v(size_t(dim), 1.0f), o(size_t(4 * dim));
    ForwardArgs a;
    a.shape = {1, 4, 1, 1, keys, dim};
    a.q = {q.data(), {4 * dim, dim, dim, 1}};
    a.k = {k.data(), {0, 0, 0, 1}};
    a.v = {v.data(), {0, 0, 0, 1}};
    a.o = {o.data(), {4 * dim, dim, dim, 1}};
    a.threads = 1;
    attention_forward(a);  // warm-up: lazily created state is not scratch
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS
    const int64_t before = status_kb("VmRSS");
    attention_forward(a);
    const int64_t growth = status_kb("VmHWM") - before;
    EXPECT_NEAR(o[0], 1.0f, 1e-6f);
    return growth;
  };
  const int64_t small = peak_growth_kb(int64_t{1} << 12);
  const int64_t large = peak_growth_kb(int64_t{1} << 21);
  EXPECT_LT(large, small + 4096) << "peak RSS grew by " << large << " KiB over 2^21 keys against " << small
                                 << " KiB over 2^12 keys";
}

// The float64 reference path sizes nothing for a sequence without query rows,
// however many keys it claims (packed K of 2^24 keys, each key row the same 4
// floats): a score row of them would be 144 MiB (found by fuzz_forward).
TEST(Memory, ReferenceSkipsSequencesWithoutQueries) {
  const int32_t keys = int32_t{1} << 24;
  std::vector<int32_t> cu_q{0, 0}, cu_k{0, keys};
  std::vector<float> q(4), o(4, 7.0f), kv(4, 0.5f);
  ForwardArgs a;
  a.shape = {1, 1, 1, 1, keys, 4};
  a.cu_seqlens_q = cu_q.data();
  a.cu_seqlens_k = cu_k.data();
  a.q = {q.data(), {4, 4, 4, 1}};
  a.o = {o.data(), {4, 4, 4, 1}};
  a.k = {kv.data(), {0, 0, 0, 1}};
  a.v = {kv.data(), {0, 0, 0, 1}};
  a.isa = Isa::reference;
  a.threads = 1;
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS
  const int64_t before = status_kb("VmRSS");
  attention_forward(a);
  const int64_t growth = status_kb("VmHWM") - before;
  EXPECT_LT(growth, 16 * 1024) << "peak RSS grew by " << growth << " KiB";
  EXPECT_EQ(o[0], 7.0f) << "the packed row of a sequence without rows was written";
}

}  // namespace
}  // namespace tileattn::reliability
