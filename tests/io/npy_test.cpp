// .npy reader/writer: round trips, every malformed form rejected with a
// message naming the file, and interoperability with NumPy itself.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "io/npy.hpp"
#include "support/python.hpp"

namespace tileattn::io {
namespace {

using Bytes = std::vector<unsigned char>;

// A .npy file with the given version and header text (no padding added).
Bytes make_file(int major, const std::string& header, const Bytes& data) {
  Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', uint8_t(major), 0};
  const std::size_t len = header.size();
  out.push_back(uint8_t(len));
  out.push_back(uint8_t(len >> 8));
  if (major >= 2) {
    out.push_back(uint8_t(len >> 16));
    out.push_back(uint8_t(len >> 24));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::string error_of(const Bytes& file) {
  try {
    parse_npy(file.data(), file.size(), "bad.npy");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Expects rejection, with a message that names the file and contains `part`.
void expect_rejected(const Bytes& file, const std::string& part) {
  const std::string message = error_of(file);
  ASSERT_FALSE(message.empty()) << "accepted a malformed file; expected: " << part;
  EXPECT_EQ(message.rfind("bad.npy: ", 0), 0u) << message;
  EXPECT_NE(message.find(part), std::string::npos) << message;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "npy_test_" + std::to_string(::getpid()) + "_" + name;
}

const std::string kF32Header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";

TEST(ioNpy, RoundTripsEveryTypeAndShape) {
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff, 0x0001};
  const std::vector<uint8_t> flags = {1, 0, 0, 1, 1};
  struct Case {
    NpyType type;
    std::vector<int64_t> shape;
    const void* data;
    std::size_t bytes;
  };
  const Case cases[] = {{NpyType::f32, {2, 3}, f32.data(), 24}, {NpyType::f32, {1, 1, 2, 3}, f32.data(), 24},
                        {NpyType::f16, {4}, f16.data(), 8},     {NpyType::boolean, {5, 1}, flags.data(), 5},
                        {NpyType::f32, {}, f32.data(), 4},      {NpyType::f32, {3, 0, 2}, f32.data(), 0}};
  for (const Case& c : cases) {
    const Bytes file = encode_npy(c.type, c.shape, c.data);
    EXPECT_EQ(file.size() % 64, c.bytes % 64) << "data should start 64-byte aligned";
    const NpyArray back = parse_npy(file.data(), file.size(), "x.npy");
    EXPECT_EQ(back.type, c.type);
    EXPECT_EQ(back.shape, c.shape);
    ASSERT_EQ(back.bytes.size(), c.bytes);
    // memcmp of an empty vector's null data() is undefined even for 0 bytes (UBSan).
    if (c.bytes > 0) {
      EXPECT_EQ(0, std::memcmp(back.bytes.data(), c.data, c.bytes));
    }
  }
}

TEST(ioNpy, ReadsVersions2And3AndU1AsBool) {
  const Bytes data = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24};
  for (int major : {1, 2, 3}) {
    const NpyArray a = parse_npy(make_file(major, kF32Header, data).data(), make_file(major, kF32Header, data).size(), "v.npy");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.bytes, data);
  }
  const Bytes u1 = make_file(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }\n", {0, 7, 1});
  const NpyArray a = parse_npy(u1.data(), u1.size(), "u1.npy");
  EXPECT_EQ(a.type, NpyType::boolean);
  // Key order and quotes as other writers may produce them.
  const Bytes reordered =
      make_file(1, "{\"shape\": (1,), \"fortran_order\": False, \"descr\": \"<f2\"}", {0, 0x3c});
  EXPECT_EQ(parse_npy(reordered.data(), reordered.size(), "r.npy").type, NpyType::f16);
}

TEST(ioNpy, RejectsEveryMalformedForm) {
  const Bytes data(24, 0);
  expect_rejected(Bytes{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!'}, "bad magic");
  expect_rejected(Bytes{0x93, 'N', 'U'}, "truncated");
  expect_rejected(Bytes{}, "bad.npy");
  Bytes file = make_file(1, kF32Header, data);
  file.resize(file.size() - 1);
  expect_rejected(file, "truncated");
  file = make_file(1, kF32Header, data);
  file.push_back(0);
  expect_rejected(file, "size mismatch");
  file = make_file(1, kF32Header, data);
  file.resize(20);  // inside the header
  expect_rejected(file, "truncated");
  // A header length that lies: larger than the file, larger than any sane header.
  file = make_file(1, kF32Header, data);
  file[8] = 0xff;
  file[9] = 0xff;
  expect_rejected(file, "header claims");
  file = make_file(2, kF32Header, data);
  file[11] = 0x7f;
  expect_rejected(file, "1 MiB limit");
  file = make_file(4, kF32Header, data);
  expect_rejected(file, "version 4.0");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data),
                  "fortran_order=True");
  expect_rejected(make_file(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", data),
                  "unsupported dtype '<f8'");
  expect_rejected(make_file(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", data),
                  "unsupported dtype '>f4'");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", data),
                  "overflows");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", data),
                  "overflows");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000,), }", data),
                  "truncated");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }", data),
                  "malformed");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", data), "tuple");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': False}", data), "needs 'descr'");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", data),
                  "unexpected or repeated key 'x'");
  expect_rejected(make_file(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", data),
                  "repeated key");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} junk", data),
                  "text after");
  expect_rejected(make_file(1, "{'descr': '<f4', 'fortran_order': Fals", data), "malformed");
  expect_rejected(make_file(1, "not a dict at all", data), "malformed");
  expect_rejected(make_file(1, std::string("{'descr': '<f4'\0", 16), data), "NUL");
}

TEST(ioNpy, MissingFileIsAnErrorNamingIt) {
  try {
    read_npy("/nonexistent/dir/q.npy");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/q.npy: cannot open"), std::string::npos) << e.what();
  }
}

// Devices and FIFOs are refused before anything is read: /dev/zero would
// otherwise grow memory until it ran out, and opening a FIFO would block.
TEST(ioNpy, RefusesFilesThatAreNotRegular) {
  char dir_template[] = "/tmp/tileattn_npy_fifoXXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string fifo = std::string(dir_template) + "/q.npy";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {std::string("/dev/zero"), fifo}) {
    try {
      read_npy(path);
      ADD_FAILURE() << path << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": not a regular file"), std::string::npos) << e.what();
    }
  }
  std::remove(fifo.c_str());
  rmdir(dir_template);
}

TEST(ioNpy, WritesAtomicallyAndStagedFilesVanishUnlessCommitted) {
  const std::string path = temp_path("atomic.npy");
  const std::vector<float> values = {1, 2, 3};
  write_npy(path, NpyType::f32, {3}, values.data());
  EXPECT_EQ(read_npy(path).shape, std::vector<int64_t>{3});
  const std::string uncommitted = temp_path("never.npy");
  {
    StagedFiles files;
    files.stage(uncommitted, encode_npy(NpyType::f32, {3}, values.data()));
  }
  EXPECT_FALSE(std::ifstream(uncommitted).good());
  EXPECT_THROW(write_npy("/nonexistent/dir/o.npy", NpyType::f32, {3}, values.data()), Error);
  std::remove(path.c_str());
}

// NumPy is the other side of every file the CLI reads or writes.
bool have_numpy() { return tileattn::testing::run_python("import numpy") == 0; }

TEST(ioNpy, InteroperatesWithNumpy) {
  ASSERT_TRUE(have_numpy()) << tileattn::testing::test_python()
                            << " with numpy is required for this test (scripts/setup.sh installs it)";
  const std::string dir = temp_path("numpy_");
  const std::string script =
      "import numpy as np; p='" + dir + "';"
      "np.save(p+'f4.npy', np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 5.5);"
      "np.save(p+'f2.npy', np.array([[1.0, -2.5], [65504, 1e-7]], dtype=np.float16));"
      "np.save(p+'b1.npy', np.array([True, False, True]));"
      "np.save(p+'scalar.npy', np.float32(7));"
      "np.save(p+'f8.npy', np.zeros(2));"
      "np.save(p+'fortran.npy', np.asfortranarray(np.ones((2, 3), dtype=np.float32)));"
      "np.lib.format.write_array(open(p+'v2.npy','wb'), np.ones(3, dtype=np.float32), version=(2, 0));"
      "np.lib.format.write_array(open(p+'v3.npy','wb'), np.ones(3, dtype=np.float32), version=(3, 0))";
  ASSERT_EQ(tileattn::testing::run_python(script), 0);

  const NpyArray f4 = read_npy(dir + "f4.npy");
  EXPECT_EQ(f4.shape, (std::vector<int64_t>{2, 3, 4}));
  for (int i = 0; i < 24; ++i) EXPECT_EQ(f4.f32()[i], float(i) - 5.5f);
  const NpyArray f2 = read_npy(dir + "f2.npy");
  EXPECT_EQ(f2.type, NpyType::f16);
  EXPECT_EQ(f2.f16()[0], 0x3c00);
  EXPECT_EQ(f2.f16()[1], 0xc100);
  EXPECT_EQ(f2.f16()[2], 0x7bff);
  const NpyArray b1 = read_npy(dir + "b1.npy");
  EXPECT_EQ(b1.type, NpyType::boolean);
  EXPECT_EQ(b1.bytes, (Bytes{1, 0, 1}));
  EXPECT_TRUE(read_npy(dir + "scalar.npy").shape.empty());
  EXPECT_EQ(read_npy(dir + "v2.npy").elements(), 3);
  EXPECT_EQ(read_npy(dir + "v3.npy").elements(), 3);
  EXPECT_THROW(read_npy(dir + "f8.npy"), Error);
  EXPECT_THROW(read_npy(dir + "fortran.npy"), Error);

  // And NumPy reads what we write.
  const std::vector<float> values = {0.5f, -1.0f, 2.0f, 4.0f, 8.0f, 16.0f};
  write_npy(dir + "ours.npy", NpyType::f32, {3, 2}, values.data());
  const std::vector<uint16_t> halves = {0x3c00, 0x4000};
  write_npy(dir + "ours16.npy", NpyType::f16, {2}, halves.data());
  const std::string check = "import numpy as np; p='" + dir +
                            "'; a=np.load(p+'ours.npy'); h=np.load(p+'ours16.npy');"
                            "assert a.dtype==np.float32 and a.shape==(3,2) and a[2,1]==16 and a.sum()==29.5;"
                            "assert h.dtype==np.float16 and list(h)==[1.0, 2.0]";
  EXPECT_EQ(tileattn::testing::run_python(check), 0);
  for (const char* f : {"f4", "f2", "b1", "scalar", "f8", "fortran", "v2", "v3", "ours", "ours16"})
    std::remove((dir + f + ".npy").c_str());
}

}  // namespace
}  // namespace tileattn::io
