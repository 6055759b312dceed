// Version, CPU and tile queries, and the tuning-configuration handle, through C.
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tileattn/machine.hpp"
#include "tileattn/tileattn.h"

namespace tileattn {
namespace {

// The names in directory `dir` (not . and ..), sorted.
std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CApiVersion, MatchesTheHeaderAndTheProject) {
  int32_t major = -1, minor = -1, patch = -1;
  ASSERT_EQ(tileattn_get_version(&major, &minor, &patch), TILEATTN_OK);
  EXPECT_EQ(major, TILEATTN_VERSION_MAJOR);
  EXPECT_EQ(minor, TILEATTN_VERSION_MINOR);
  EXPECT_EQ(patch, TILEATTN_VERSION_PATCH);
  const std::string expected =
      std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  EXPECT_EQ(std::string(tileattn_version_string()), expected);
  EXPECT_EQ(TILEATTN_ABI_VERSION, TILEATTN_VERSION_MAJOR);
}

TEST(CApiMachine, CpuInfoMatchesCpp) {
  tileattn_cpu_info info;
  ASSERT_EQ(tileattn_cpu_info_init(&info), TILEATTN_OK);
  ASSERT_EQ(tileattn_get_cpu_info(&info), TILEATTN_OK) << tileattn_last_error();
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(info.avx2, f.avx2);
  EXPECT_EQ(info.fma, f.fma);
  EXPECT_EQ(info.avx512f, f.avx512f);
  EXPECT_EQ(info.avx512_bf16, f.avx512_bf16);
  EXPECT_EQ(info.hardware_threads, hardware_threads());
  EXPECT_EQ(info.best_isa, int32_t(best_isa()));
  EXPECT_EQ(info.l1d_bytes, cache_sizes().l1d);
  EXPECT_EQ(info.l2_bytes, cache_sizes().l2);
  EXPECT_EQ(std::string(info.vendor), f.vendor.substr(0, sizeof info.vendor - 1));
  EXPECT_EQ(std::string(info.brand), f.brand.substr(0, sizeof info.brand - 1));
  EXPECT_EQ(info.amx_bf16, f.amx_bf16);
  EXPECT_EQ(info.amx_int8, f.amx_int8);
  EXPECT_EQ(info.family, f.family);
  EXPECT_EQ(info.model, f.model);
  EXPECT_GT(info.family, 0) << "CPUID leaf 1 gives every x86-64 CPU a family";

  tileattn_cpu_info unset{};
  EXPECT_EQ(tileattn_get_cpu_info(&unset), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("struct_size"), std::string::npos);
}

TEST(CApiMachine, IsaQueries) {
  int32_t available = -1;
  ASSERT_EQ(tileattn_isa_available(TILEATTN_ISA_GENERIC, &available), TILEATTN_OK);
  EXPECT_EQ(available, 1);
  ASSERT_EQ(tileattn_isa_available(TILEATTN_ISA_AVX512, &available), TILEATTN_OK);
  EXPECT_EQ(available, int32_t(isa_available(Isa::avx512)));
  EXPECT_EQ(tileattn_isa_available(17, &available), TILEATTN_INVALID_ARGUMENT);

  const char* name = nullptr;
  ASSERT_EQ(tileattn_isa_name(TILEATTN_ISA_AVX2, &name), TILEATTN_OK);
  EXPECT_STREQ(name, "avx2");
  int32_t resolved = -1;
  ASSERT_EQ(tileattn_resolve_isa(TILEATTN_ISA_GENERIC, &resolved), TILEATTN_OK);
  EXPECT_EQ(resolved, TILEATTN_ISA_GENERIC);
  if (!isa_available(Isa::avx512)) {
    EXPECT_EQ(tileattn_resolve_isa(TILEATTN_ISA_AVX512, &resolved), TILEATTN_NOT_SUPPORTED)
        << tileattn_last_error();
    EXPECT_EQ(resolved, TILEATTN_ISA_GENERIC) << "written despite the error";
  }
}

TEST(CApiMachine, TilesMatchCpp) {
  for (int64_t d : {64, 80, 128, 256}) {
    int32_t bq = 0, bkv = 0;
    ASSERT_EQ(tileattn_choose_tiles(TILEATTN_ISA_GENERIC, d, TILEATTN_F16, &bq, &bkv), TILEATTN_OK)
        << tileattn_last_error();
    const TileShape t = choose_tiles(Isa::generic, d, DType::f16);
    EXPECT_EQ(bq, t.block_q);
    EXPECT_EQ(bkv, t.block_kv);
  }
  int32_t bq, bkv;
  EXPECT_EQ(tileattn_choose_tiles(TILEATTN_ISA_GENERIC, 0, TILEATTN_F32, &bq, &bkv), TILEATTN_INVALID_ARGUMENT);
  EXPECT_EQ(tileattn_choose_tiles(TILEATTN_ISA_GENERIC, 64, 3, &bq, &bkv), TILEATTN_INVALID_ARGUMENT);
}

TEST(CApiMachine, DenseStrides) {
  int64_t s[4];
  ASSERT_EQ(tileattn_dense_strides(TILEATTN_LAYOUT_BSHD, 2, 3, 5, 7, s), TILEATTN_OK);
  EXPECT_EQ(s[0], 5 * 3 * 7);
  EXPECT_EQ(s[1], 7);
  EXPECT_EQ(s[2], 3 * 7);
  EXPECT_EQ(s[3], 1);
  ASSERT_EQ(tileattn_dense_strides(TILEATTN_LAYOUT_BHSD, 2, 3, 5, 7, s), TILEATTN_OK);
  EXPECT_EQ(s[0], 3 * 5 * 7);
  EXPECT_EQ(s[1], 5 * 7);
  EXPECT_EQ(tileattn_dense_strides(2, 2, 3, 5, 7, s), TILEATTN_INVALID_ARGUMENT);
  EXPECT_EQ(tileattn_dense_strides(TILEATTN_LAYOUT_BHSD, int64_t(1) << 40, int64_t(1) << 40, 5, 7, s),
            TILEATTN_INVALID_ARGUMENT);
}

// A save that cannot land (the path is a directory) fails and leaves no
// temporary file in the target's directory.
TEST(CApiTuneConfig, FailedSaveLeavesNoTemporaryFile) {
  tileattn_tune_config* config = nullptr;
  ASSERT_EQ(tileattn_tune_config_create(&config), TILEATTN_OK);
  ASSERT_EQ(tileattn_tune_config_set(config, TILEATTN_ISA_AVX2, 128, TILEATTN_BF16, 64, 32), TILEATTN_OK);
  std::string base = ::testing::TempDir() + "tileattn_capi_tune_XXXXXX";
  ASSERT_NE(mkdtemp(base.data()), nullptr);
  const std::string dir = base + "/sub";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  EXPECT_NE(tileattn_tune_config_save(config, dir.c_str()), TILEATTN_OK);
  EXPECT_NE(std::string(tileattn_last_error()).find(dir), std::string::npos) << tileattn_last_error();
  EXPECT_EQ(entries_of(base), std::vector<std::string>{"sub"}) << "a temporary file was left";
  EXPECT_EQ(rmdir(dir.c_str()), 0);
  EXPECT_EQ(rmdir(base.c_str()), 0);
  ASSERT_EQ(tileattn_tune_config_destroy(config), TILEATTN_OK);
}

// A save through a symbolic link replaces the file it names and keeps the
// link; a FIFO is written in place (read by a reader), and loading a FIFO
// does not wait for a writer (a tune file is a regular file or nothing).
TEST(CApiTuneConfig, SaveWritesThroughLinksAndIntoFifos) {
  tileattn_tune_config* config = nullptr;
  ASSERT_EQ(tileattn_tune_config_create(&config), TILEATTN_OK);
  ASSERT_EQ(tileattn_tune_config_set(config, TILEATTN_ISA_AVX2, 64, TILEATTN_F32, 64, 32), TILEATTN_OK);
  std::string base = ::testing::TempDir() + "tileattn_capi_tune_XXXXXX";
  ASSERT_NE(mkdtemp(base.data()), nullptr);
  const std::string real = base + "/real.conf", link = base + "/link.conf", fifo = base + "/fifo.conf";
  ASSERT_EQ(symlink("real.conf", link.c_str()), 0);
  ASSERT_EQ(tileattn_tune_config_save(config, link.c_str()), TILEATTN_OK) << tileattn_last_error();
  struct stat st;
  ASSERT_EQ(lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced by a file";
  tileattn_tune_config* loaded = nullptr;
  ASSERT_EQ(tileattn_tune_config_load(real.c_str(), &loaded), TILEATTN_OK) << tileattn_last_error();
  int64_t count = 0;
  ASSERT_EQ(tileattn_tune_config_count(loaded, &count), TILEATTN_OK);
  EXPECT_EQ(count, 1);
  ASSERT_EQ(tileattn_tune_config_destroy(loaded), TILEATTN_OK);

  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(tileattn_tune_config_load(fifo.c_str(), &loaded), TILEATTN_OK) << tileattn_last_error();
  ASSERT_EQ(tileattn_tune_config_count(loaded, &count), TILEATTN_OK);
  EXPECT_EQ(count, 0);
  ASSERT_EQ(tileattn_tune_config_destroy(loaded), TILEATTN_OK);
  std::string read;
  std::thread reader([&] {
    if (std::FILE* f = std::fopen(fifo.c_str(), "rb")) {
      char buf[256];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) read.append(buf, n);
      std::fclose(f);
    }
  });
  EXPECT_EQ(tileattn_tune_config_save(config, fifo.c_str()), TILEATTN_OK) << tileattn_last_error();
  reader.join();
  EXPECT_NE(read.find("avx2 64 fp32 64x32"), std::string::npos) << read;
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced by a file";
  EXPECT_EQ(entries_of(base), (std::vector<std::string>{"fifo.conf", "link.conf", "real.conf"}));
  for (const std::string& p : {real, link, fifo}) std::remove(p.c_str());
  EXPECT_EQ(rmdir(base.c_str()), 0);
  ASSERT_EQ(tileattn_tune_config_destroy(config), TILEATTN_OK);
}

TEST(CApiTuneConfig, SetSaveLoadRoundTrip) {
  tileattn_tune_config* config = nullptr;
  ASSERT_EQ(tileattn_tune_config_create(&config), TILEATTN_OK);
  ASSERT_EQ(tileattn_tune_config_set(config, TILEATTN_ISA_AVX2, 128, TILEATTN_BF16, 64, 32), TILEATTN_OK);
  ASSERT_EQ(tileattn_tune_config_set(config, TILEATTN_ISA_GENERIC, 64, TILEATTN_F32, 32, 32), TILEATTN_OK);
  ASSERT_EQ(tileattn_tune_config_set(config, TILEATTN_ISA_AVX2, 128, TILEATTN_BF16, 128, 64), TILEATTN_OK);
  EXPECT_EQ(tileattn_tune_config_set(config, TILEATTN_ISA_AUTO, 128, TILEATTN_BF16, 128, 64),
            TILEATTN_INVALID_ARGUMENT);
  EXPECT_EQ(tileattn_tune_config_set(config, TILEATTN_ISA_AVX2, 128, TILEATTN_BF16, 0, 64),
            TILEATTN_INVALID_ARGUMENT);
  int64_t count = 0;
  ASSERT_EQ(tileattn_tune_config_count(config, &count), TILEATTN_OK);
  EXPECT_EQ(count, 2);  // the third set replaced the first entry

  // The process id keeps concurrent suites (CI's sanitizer lane runs beside
  // the main one) from sharing the file.
  const std::string path = ::testing::TempDir() + "tileattn_capi_tune_" + std::to_string(getpid()) + ".conf";
  ASSERT_EQ(tileattn_tune_config_save(config, path.c_str()), TILEATTN_OK) << tileattn_last_error();
  ASSERT_EQ(tileattn_tune_config_destroy(config), TILEATTN_OK);

  tileattn_tune_config* loaded = nullptr;
  ASSERT_EQ(tileattn_tune_config_load(path.c_str(), &loaded), TILEATTN_OK) << tileattn_last_error();
  ASSERT_EQ(tileattn_tune_config_count(loaded, &count), TILEATTN_OK);
  ASSERT_EQ(count, 2);
  int32_t isa, dtype, bq, bkv;
  int64_t head_dim;
  ASSERT_EQ(tileattn_tune_config_get(loaded, 0, &isa, &head_dim, &dtype, &bq, &bkv), TILEATTN_OK);
  EXPECT_EQ(isa, TILEATTN_ISA_AVX2);
  EXPECT_EQ(head_dim, 128);
  EXPECT_EQ(dtype, TILEATTN_BF16);
  EXPECT_EQ(bq, 128);
  EXPECT_EQ(bkv, 64);
  EXPECT_EQ(tileattn_tune_config_get(loaded, 2, &isa, &head_dim, &dtype, &bq, &bkv), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("index 2"), std::string::npos);
  // The file is what the C++ reader (and so choose_tiles) reads.
  const std::vector<TuneEntry> entries = read_tune_file(path);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[1].isa, "generic");
  EXPECT_EQ(entries[1].dtype, "fp32");
  EXPECT_EQ(entries[1].block_q, 32);
  EXPECT_EQ(tileattn_tune_config_destroy(loaded), TILEATTN_OK);
  EXPECT_EQ(tileattn_tune_config_destroy(nullptr), TILEATTN_OK);
  std::remove(path.c_str());
}

TEST(CApiTuneConfig, FilePathBuffer) {
  size_t length = 0;
  EXPECT_EQ(tileattn_tune_file_path(nullptr, 0, &length), TILEATTN_INVALID_ARGUMENT);
  EXPECT_EQ(length, tune_file_path().size());
  std::string buffer(length + 1, 'x');
  ASSERT_EQ(tileattn_tune_file_path(buffer.data(), buffer.size(), &length), TILEATTN_OK);
  EXPECT_STREQ(buffer.c_str(), tune_file_path().c_str());
  char small[2] = {'x', 'x'};
  EXPECT_EQ(tileattn_tune_file_path(small, sizeof small, nullptr), TILEATTN_INVALID_ARGUMENT);
  EXPECT_EQ(small[0], 'x');
}

// A C thread runtime that starts its threads per region and counts regions.
std::atomic<int> c_regions{0};
void c_run(void (*fn)(void*, int, int), void* ctx, int threads) {
  c_regions.fetch_add(1);
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back([=] { fn(ctx, t, threads); });
  fn(ctx, 0, threads);
  for (std::thread& h : helpers) h.join();
}

// A causal forward of 4 heads x 256 rows, D 64, through C on 3 threads.
std::vector<float> c_forward() {
  const int64_t h = 4, n = 256, d = 64;
  std::vector<float> q(size_t(h * n * d)), k(q.size()), v(q.size()), o(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = float(i % 97) / 48.0f - 1.0f;
    k[i] = float(i % 89) / 44.0f - 1.0f;
    v[i] = float(i % 83) / 41.0f - 1.0f;
  }
  tileattn_forward_args a;
  tileattn_forward_args_init(&a);
  a.batch = 1;
  a.heads = a.kv_heads = h;
  a.seqlen_q = a.seqlen_k = n;
  a.head_dim = d;
  int64_t stride[4];
  tileattn_dense_strides(TILEATTN_LAYOUT_BHSD, 1, h, n, d, stride);
  a.q = {q.data(), {stride[0], stride[1], stride[2], stride[3]}};
  a.k = {k.data(), {stride[0], stride[1], stride[2], stride[3]}};
  a.v = {v.data(), {stride[0], stride[1], stride[2], stride[3]}};
  a.o = {o.data(), {stride[0], stride[1], stride[2], stride[3]}};
  a.causal = 1;
  a.threads = 3;
  EXPECT_EQ(tileattn_forward(&a), TILEATTN_OK) << tileattn_last_error();
  return o;
}

TEST(CApiThreads, RegionsRunOnTheInstalledRuntimeWithThePoolsBits) {
  ASSERT_STREQ(tileattn_thread_runtime_name(), "pool");
  const std::vector<float> on_pool = c_forward();
  const tileattn_thread_runtime runtime{"my runtime", c_run};
  ASSERT_EQ(tileattn_set_thread_runtime(&runtime), TILEATTN_OK) << tileattn_last_error();
  EXPECT_STREQ(tileattn_thread_runtime_name(), "my runtime");
  EXPECT_STREQ(thread_runtime(), "C API thread runtime");  // the C++ side's name for it
  c_regions.store(0);
  const std::vector<float> on_runtime = c_forward();
  EXPECT_GE(c_regions.load(), 1) << "the forward did not run on the installed runtime";
  EXPECT_TRUE(on_runtime == on_pool) << "the runtime's threads gave other bits";
  ASSERT_EQ(tileattn_set_thread_runtime(nullptr), TILEATTN_OK);
  EXPECT_STREQ(tileattn_thread_runtime_name(), "pool");
  c_regions.store(0);
  EXPECT_TRUE(c_forward() == on_pool);
  EXPECT_EQ(c_regions.load(), 0);
}

TEST(CApiThreads, ARuntimeWithoutNameOrRunIsRefusedAndChangesNothing) {
  const tileattn_thread_runtime no_run{"no run", nullptr}, no_name{nullptr, c_run};
  EXPECT_EQ(tileattn_set_thread_runtime(&no_run), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("runtime->run"), std::string::npos) << tileattn_last_error();
  EXPECT_EQ(tileattn_set_thread_runtime(&no_name), TILEATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tileattn_last_error()).find("runtime->name"), std::string::npos) << tileattn_last_error();
  EXPECT_STREQ(tileattn_thread_runtime_name(), "pool");
}

}  // namespace
}  // namespace tileattn
