// Bad input to `tileattn run`: exit status 2, one line on stderr starting
// "tileattn: ", and no output file (nor a temporary one) left behind.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <limits>

#include "cli/cli_support.hpp"
#include "support/python.hpp"

namespace tileattn::cli_test {
namespace {

class cliRunErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<float> q(1 * 2 * 5 * 8, 0.5f), k(1 * 2 * 7 * 8, 0.25f);
    io::write_npy(dir / "q.npy", io::NpyType::f32, {1, 2, 5, 8}, q.data());
    io::write_npy(dir / "k.npy", io::NpyType::f32, {1, 2, 7, 8}, k.data());
    io::write_npy(dir / "v.npy", io::NpyType::f32, {1, 2, 7, 8}, k.data());
  }
  std::string inputs(const std::string& q = "q.npy", const std::string& k = "k.npy",
                     const std::string& v = "v.npy") const {
    return "run --q '" + (dir / q) + "' --k '" + (dir / k) + "' --v '" + (dir / v) + "' --out '" +
           (dir / "o.npy") + "' --lse '" + (dir / "lse.npy") + "'";
  }
  // Runs and checks the failure contract; returns the message.
  std::string expect_failure(const std::string& args, const std::string& part) {
    const std::vector<std::string> before = dir.files();
    const Result r = run_cli(args, dir);
    EXPECT_EQ(r.status, 2) << args;
    const std::vector<std::string> lines = r.err_lines();
    EXPECT_EQ(lines.size(), 1u) << r.err;
    const std::string line = lines.empty() ? "" : lines[0];
    EXPECT_EQ(line.rfind("tileattn: ", 0), 0u) << line;
    EXPECT_NE(line.find(part), std::string::npos) << "expected '" << part << "' in: " << line;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(dir.files(), before) << "files were created by a failed run";
    return line;
  }
  TempDir dir;
};

TEST_F(cliRunErrors, SucceedsOnTheGoodInputs) {
  // The fixture itself is valid: the failures below come from the one change each makes.
  const Result r = run_cli(inputs(), dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(io::read_npy(dir / "o.npy").shape, (std::vector<int64_t>{1, 2, 5, 8}));
}

TEST_F(cliRunErrors, MissingFile) { expect_failure(inputs("nope.npy"), "nope.npy: cannot open"); }

TEST_F(cliRunErrors, TruncatedFile) {
  std::string bytes = slurp(dir / "k.npy");
  std::ofstream(dir / "short.npy", std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  expect_failure(inputs("q.npy", "short.npy"), "short.npy: truncated");
}

TEST_F(cliRunErrors, GarbageFile) {
  std::ofstream(dir / "junk.npy") << "this is not numpy data";
  expect_failure(inputs("junk.npy"), "junk.npy: not a .npy file");
}

TEST_F(cliRunErrors, MismatchedAndUnsupportedDtypes) {
  const std::vector<uint16_t> k16(1 * 2 * 7 * 8, 0x3c00);
  io::write_npy(dir / "k16.npy", io::NpyType::f16, {1, 2, 7, 8}, k16.data());
  expect_failure(inputs("q.npy", "k16.npy"), "must have the same dtype");
  const std::vector<uint8_t> flags(1 * 2 * 5 * 8, 1);
  io::write_npy(dir / "qb.npy", io::NpyType::boolean, {1, 2, 5, 8}, flags.data());
  expect_failure(inputs("qb.npy"), "qb.npy: a bool or uint8 array (|b1, |u1: mask types) is not a valid attention input");
  ASSERT_EQ(tileattn::testing::run_python("import numpy as np; np.save('" + (dir / "q64.npy") +
                                          "', np.zeros((1, 2, 5, 8)))"),
            0);
  expect_failure(inputs("q64.npy"), "unsupported dtype '<f8'");
}

TEST_F(cliRunErrors, ShapeMismatches) {
  const std::vector<float> x(1 * 2 * 7 * 16, 0.0f);
  io::write_npy(dir / "k16d.npy", io::NpyType::f32, {1, 2, 7, 16}, x.data());
  expect_failure(inputs("q.npy", "k16d.npy", "k16d.npy"), "head_dim must match");
  io::write_npy(dir / "k6.npy", io::NpyType::f32, {1, 2, 6, 8}, x.data());
  expect_failure(inputs("q.npy", "k.npy", "k6.npy"), "does not fit");
  io::write_npy(dir / "k3.npy", io::NpyType::f32, {1, 3, 7, 8}, x.data());
  expect_failure(inputs("q.npy", "k3.npy", "k3.npy"), "must divide");
  io::write_npy(dir / "q3d.npy", io::NpyType::f32, {2, 5, 8}, x.data());
  expect_failure(inputs("q3d.npy"), "expected 4 dimensions");
  // No query heads, or a head dim of 0: the message names the file.
  io::write_npy(dir / "q0.npy", io::NpyType::f32, {1, 0, 5, 8}, x.data());
  expect_failure(inputs("q0.npy"), (dir / "q0.npy") + ": 0 query heads, shape (1, 0, 5, 8)");
  io::write_npy(dir / "qd0.npy", io::NpyType::f32, {1, 2, 5, 0}, x.data());
  io::write_npy(dir / "kd0.npy", io::NpyType::f32, {1, 2, 7, 0}, x.data());
  expect_failure(inputs("qd0.npy", "kd0.npy"), (dir / "qd0.npy") + ": head dim must be >= 1, got shape (1, 2, 5, 0)");
  io::write_npy(dir / "mask.npy", io::NpyType::boolean, {5, 6}, x.data());
  expect_failure(inputs() + " --mask '" + (dir / "mask.npy") + "'", "mask shape (5, 6)");
}

TEST_F(cliRunErrors, BadFlagsAndNumbers) {
  expect_failure(inputs() + " --scale nan", "--scale");
  expect_failure(inputs() + " --scale inf", "--scale");
  expect_failure(inputs() + " --scale 1.5x", "--scale");
  expect_failure(inputs() + " --softcap -1", "--softcap");
  expect_failure(inputs() + " --softcap nan", "--softcap");
  expect_failure(inputs() + " --softcap inf", "--softcap");
  // Values the library takes as fp32 that would round to 0 there (softcap or dropout off, scale 0).
  expect_failure(inputs() + " --softcap 1e-46", "--softcap: 1e-46 rounds to 0 in fp32");
  expect_failure(inputs() + " --scale -1e-50", "--scale: -1e-50 rounds to 0 in fp32");
  expect_failure(inputs() + " --dropout 1e-60", "--dropout: 1e-60 rounds to 0 in fp32");
  {
    const std::vector<float> three(3, 0.5f), two_bad{0.5f, std::numeric_limits<float>::infinity()};
    io::write_npy(dir / "s3.npy", io::NpyType::f32, {3}, three.data());
    io::write_npy(dir / "sbad.npy", io::NpyType::f32, {2}, two_bad.data());
    expect_failure(inputs() + " --sinks '" + (dir / "s3.npy") + "'", "--sinks");
    expect_failure(inputs() + " --sinks '" + (dir / "sbad.npy") + "'", "sinks[1] must be finite");
    expect_failure(inputs() + " --sinks '" + (dir / "s3.npy") + "' --dsinks '" + (dir / "ds.npy") + "'",
                   "--dsinks is a backward output");
  }
  expect_failure(inputs() + " --threads abc", "--threads");
  expect_failure(inputs() + " --threads 0", "--threads");
  expect_failure(inputs() + " --window 5", "--window");
  expect_failure(inputs() + " --window 3,-2", "--window");
  expect_failure(inputs() + " --layout hsdb", "--layout: expected bhsd or bshd, got 'hsdb'");
  expect_failure(inputs() + " --dtype fp64", "--dtype: expected fp32, fp16 or bf16, got 'fp64'");
  // Range limits print as numbers people read, not 31-digit expansions of 1e30.
  expect_failure(inputs() + " --scale 2e30", "--scale: must be in [-1e+30, 1e+30], got 2e30");
  expect_failure(inputs() + " --frobnicate", "unknown flag '--frobnicate'");
  expect_failure(inputs() + " --causal=yes", "--causal: takes no value");
  expect_failure(inputs() + " --scale", "--scale: missing value");
  // A flag where a value belongs is the value left out (it once wrote a file named "--causal").
  expect_failure(inputs() + " --scale --causal", "--scale: missing value (got the flag '--causal'");
  expect_failure("run --q '" + (dir / "q.npy") + "'", "--k is required");
}

TEST_F(cliRunErrors, UnwritableOutputLeavesNothing) {
  const Result r = run_cli("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" +
                               (dir / "v.npy") + "' --out '" + (dir / "missing_dir/o.npy") + "' --lse '" +
                               (dir / "lse.npy") + "'",
                           dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err_lines().size(), 1u) << r.err;
  // Neither output appears when one of them cannot be written.
  EXPECT_FALSE(std::ifstream(dir / "lse.npy").good());
  EXPECT_EQ(dir.files().size(), 3u);
}

// A target that rename() would refuse (here a directory named like the
// output) is found before any output is renamed: no output appears, and an
// existing one keeps its bytes.
TEST_F(cliRunErrors, CommitChecksEveryTargetBeforeRenaming) {
  ASSERT_EQ(mkdir((dir / "lse.npy").c_str(), 0755), 0);
  expect_failure(inputs(), "lse.npy: cannot write (is a directory)");
  std::ofstream(dir / "o.npy") << "old";
  expect_failure(inputs(), "lse.npy: cannot write (is a directory)");
  EXPECT_EQ(slurp(dir / "o.npy"), "old");
  // The backward stages dQ, dK and dV first: none of them may be renamed either.
  ASSERT_EQ(mkdir((dir / "dv.npy").c_str(), 0755), 0);
  expect_failure("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" + (dir / "v.npy") +
                     "' --out '" + (dir / "o.npy") + "' --dout '" + (dir / "q.npy") + "' --dq '" +
                     (dir / "dq.npy") + "' --dk '" + (dir / "dk.npy") + "' --dv '" + (dir / "dv.npy") + "'",
                 "dv.npy: cannot write (is a directory)");
  EXPECT_EQ(slurp(dir / "o.npy"), "old");
}

// An output that is a symbolic link is written through it: the file it names
// gets the result and the link stays a link (rename() over the link once
// replaced it with a regular file).
TEST_F(cliRunErrors, OutputThroughASymbolicLink) {
  std::ofstream(dir / "real.npy") << "old";
  ASSERT_EQ(symlink("real.npy", (dir / "link.npy").c_str()), 0);
  const Result r = run_cli("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" +
                               (dir / "v.npy") + "' --out '" + (dir / "link.npy") + "'",
                           dir);
  ASSERT_EQ(r.status, 0) << r.err;
  struct stat st;
  ASSERT_EQ(lstat((dir / "link.npy").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced";
  EXPECT_EQ(io::read_npy(dir / "real.npy").shape, (std::vector<int64_t>{1, 2, 5, 8}));
  // A link and the file it names are one output: two flags naming them is an error.
  expect_failure("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" + (dir / "v.npy") +
                     "' --out '" + (dir / "link.npy") + "' --lse '" + (dir / "real.npy") + "'",
                 "--out and --lse name the same file");
  // A link to a file not there yet creates it; one into a missing directory fails, writing nothing.
  ASSERT_EQ(symlink("new.npy", (dir / "ahead.npy").c_str()), 0);
  const Result created = run_cli("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" +
                                     (dir / "v.npy") + "' --out '" + (dir / "ahead.npy") + "'",
                                 dir);
  ASSERT_EQ(created.status, 0) << created.err;
  EXPECT_EQ(io::read_npy(dir / "new.npy").shape, (std::vector<int64_t>{1, 2, 5, 8}));
  ASSERT_EQ(symlink("nowhere/x.npy", (dir / "dangling.npy").c_str()), 0);
  expect_failure("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" + (dir / "v.npy") +
                     "' --out '" + (dir / "dangling.npy") + "'",
                 "nowhere/x.npy: cannot write");
}

// An output that is not a regular file (here a FIFO; /dev/null alike) is
// written in place: rename() over it once replaced /dev/null with a regular
// file. A FIFO, not /dev/null, so that a regression cannot damage the machine.
TEST_F(cliRunErrors, OutputToAFifoIsWrittenInPlace) {
  const std::string fifo = dir / "pipe.npy";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // the CLI's open then does not block
  ASSERT_GE(reader, 0);
  const Result r = run_cli("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" +
                               (dir / "v.npy") + "' --out '" + fifo + "'",
                           dir);
  std::string bytes(4096, '\0');
  const ssize_t n = read(reader, bytes.data(), bytes.size());
  close(reader);
  ASSERT_EQ(r.status, 0) << r.err;
  struct stat st;
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  ASSERT_GT(n, 10);
  EXPECT_EQ(bytes.substr(1, 5), "NUMPY");
}

// A report that cannot be written is a failure: /dev/full as stdout.
TEST(cliOutput, FailedStdoutWriteIsExitTwo) {
  const std::string command = std::string("'") + TILEATTN_CLI + "' info --json >/dev/full 2>/dev/null";
  const int raw = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(raw));
  EXPECT_EQ(WEXITSTATUS(raw), 2);
}

// Two output flags naming one file would silently lose an output: exit 2,
// naming both flags, before anything is written; also when the two paths
// are spelled differently.
TEST_F(cliRunErrors, TwoOutputsNamingOneFile) {
  const std::string in = "run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" +
                         (dir / "v.npy") + "'";
  expect_failure(in + " --out '" + (dir / "same.npy") + "' --lse '" + (dir / "same.npy") + "'",
                 "--out and --lse name the same file");
  const std::string g = dir / "g.npy";
  expect_failure(in + " --out '" + (dir / "o.npy") + "' --dout '" + (dir / "q.npy") + "' --dq '" + g +
                     "' --dk '" + g + "' --dv '" + g + "'",
                 "--dq and --dk name the same file");
  expect_failure(in + " --out '" + (dir / "o.npy") + "' --dout '" + (dir / "q.npy") + "' --dq '" + g +
                     "' --dk '" + (dir / "dk.npy") + "' --dv '" + (dir / "./g.npy") + "'",
                 "--dq and --dv name the same file");
  ASSERT_EQ(mkdir((dir / "sub").c_str(), 0755), 0);
  expect_failure(in + " --out '" + (dir / "o.npy") + "' --lse '" + (dir / "sub/../o.npy") + "'",
                 "--out and --lse name the same file");
  std::ofstream(dir / "o.npy") << "old";  // an existing file, reached two ways
  expect_failure(in + " --out '" + (dir / "sub/../o.npy") + "' --lse '" + (dir / "o.npy") + "'",
                 "--out and --lse name the same file");
  EXPECT_EQ(slurp(dir / "o.npy"), "old");
}

// An output naming an input file (spelled the same, reached another way, or
// a link to it) would silently replace the input: exit 2 naming both flags,
// inputs untouched.
TEST_F(cliRunErrors, OutputNamingAnInputFile) {
  const std::string in = "run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" +
                         (dir / "v.npy") + "'";
  const std::string q_bytes = slurp(dir / "q.npy"), k_bytes = slurp(dir / "k.npy");
  expect_failure(in + " --out '" + (dir / "q.npy") + "'", "--out '" + (dir / "q.npy") + "' is the input file of --q");
  expect_failure(in + " --out '" + (dir / "o.npy") + "' --lse '" + (dir / "./k.npy") + "'",
                 "--lse '" + (dir / "./k.npy") + "' is the input file of --k");
  ASSERT_EQ(symlink((dir / "v.npy").c_str(), (dir / "v_link.npy").c_str()), 0);
  expect_failure(in + " --out '" + (dir / "v_link.npy") + "'", "is the input file of --v");
  const std::string g = dir / "g.npy";
  expect_failure(in + " --out '" + (dir / "o.npy") + "' --dout '" + (dir / "q.npy") + "' --dq '" +
                     (dir / "dq.npy") + "' --dk '" + (dir / "dk.npy") + "' --dv '" + (dir / "q.npy") + "'",
                 "--dv '" + (dir / "q.npy") + "' is the input file of --q");
  std::ofstream(dir / "do.npy") << slurp(dir / "q.npy");
  expect_failure(in + " --out '" + (dir / "o.npy") + "' --dout '" + (dir / "do.npy") + "' --dq '" +
                     (dir / "do.npy") + "' --dk '" + (dir / "dk.npy") + "' --dv '" + (dir / "dv.npy") + "'",
                 "--dq '" + (dir / "do.npy") + "' is the input file of --dout");
  EXPECT_EQ(slurp(dir / "q.npy"), q_bytes);
  EXPECT_EQ(slurp(dir / "k.npy"), k_bytes);
}

// Staged outputs have short names of their own: an output name of 250
// characters (NAME_MAX is 255) is written; one over the limit fails before
// any output is renamed, leaving nothing behind.
TEST_F(cliRunErrors, OutputNamesNearTheLengthLimit) {
  const std::string long_name = std::string(246, 'o') + ".npy";
  Result r = run_cli("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" + (dir / "v.npy") +
                         "' --out '" + (dir / long_name) + "'",
                     dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(io::read_npy(dir / long_name).shape, (std::vector<int64_t>{1, 2, 5, 8}));
  std::remove((dir / long_name).c_str());
  const std::string too_long = std::string(256, 'l') + ".npy";
  expect_failure("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" + (dir / "v.npy") +
                     "' --out '" + (dir / "o.npy") + "' --lse '" + (dir / too_long) + "'",
                 "File name too long");
}

TEST_F(cliRunErrors, BackwardFlags) {
  const std::string grads = " --dq '" + (dir / "dq.npy") + "' --dk '" + (dir / "dk.npy") + "' --dv '" +
                            (dir / "dv.npy") + "'";
  expect_failure(inputs() + " --dout '" + (dir / "q.npy") + "' --dq '" + (dir / "dq.npy") + "'",
                 "--dk is missing");
  expect_failure(inputs() + " --dout '" + (dir / "k.npy") + "'" + grads, "must be that of");
  expect_failure(inputs() + " --dout '" + (dir / "nope.npy") + "'" + grads, "nope.npy: cannot open");
  expect_failure(inputs() + " --dropout 1.5", "--dropout");
  expect_failure(inputs() + " --dropout 0.1 --seed -4", "--seed");
  // A seed without dropout would be ignored: refused. Dropout without a seed
  // takes seed 0 (the help says so): the same mask as --seed 0.
  expect_failure(inputs() + " --seed 3", "--seed: only with --dropout");
  Result r = run_cli(inputs() + " --dropout 0.5", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string unseeded = slurp(dir / "o.npy");
  r = run_cli(inputs() + " --dropout 0.5 --seed 0", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(dir / "o.npy"), unseeded);
  r = run_cli(inputs() + " --dropout 0.5 --seed 1", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(slurp(dir / "o.npy"), unseeded) << "seed 1 drew the same mask as seed 0";
}

// Converting an input to --dtype must not turn a finite value into inf (fp16
// holds |x| <= 65504; 65520 and up round to inf): exit 2 naming the flag, the
// file and the value, nothing written. Values that round to 65504 still run,
// and an inf already in the input keeps its documented meaning (the rows that
// see it give NaN).
TEST_F(cliRunErrors, ConversionOverflowIsRefused) {
  std::vector<float> x(1 * 2 * 7 * 8, 0.25f);
  x[17] = 3.9e6f;
  io::write_npy(dir / "big.npy", io::NpyType::f32, {1, 2, 7, 8}, x.data());
  std::vector<float> qx(1 * 2 * 5 * 8, 0.5f);
  qx[3] = -65520.0f;
  io::write_npy(dir / "qbig.npy", io::NpyType::f32, {1, 2, 5, 8}, qx.data());
  expect_failure(inputs("qbig.npy") + " --dtype fp16",
                 "--q: " + (dir / "qbig.npy") + " holds -65520 (element 3), outside fp16's range (65504)");
  expect_failure(inputs("q.npy", "big.npy") + " --dtype fp16",
                 "--k: " + (dir / "big.npy") + " holds 3.9e+06 (element 17), outside fp16's range");
  expect_failure(inputs("q.npy", "k.npy", "big.npy") + " --dtype fp16", "--v: " + (dir / "big.npy") + " holds 3.9e+06");
  std::vector<float> dout(1 * 2 * 5 * 8, 0.5f);
  dout[39] = 1e5f;
  io::write_npy(dir / "dobig.npy", io::NpyType::f32, {1, 2, 5, 8}, dout.data());
  expect_failure("run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" + (dir / "v.npy") +
                     "' --out '" + (dir / "o.npy") + "' --dout '" + (dir / "dobig.npy") + "' --dq '" +
                     (dir / "dq.npy") + "' --dk '" + (dir / "dk.npy") + "' --dv '" + (dir / "dv.npy") +
                     "' --dtype fp16",
                 "--dout: " + (dir / "dobig.npy") + " holds 100000 (element 39)");
  // bf16 has fp32's exponent: only values within half a bf16 step of FLT_MAX overflow.
  x[17] = std::numeric_limits<float>::max();
  io::write_npy(dir / "huge.npy", io::NpyType::f32, {1, 2, 7, 8}, x.data());
  expect_failure(inputs("q.npy", "huge.npy") + " --dtype bf16", "--k: " + (dir / "huge.npy") + " holds 3.40282e+38");
  expect_failure(inputs("q.npy", "huge.npy") + " --dtype bf16", "outside bf16's range");
  // Runs: 65519 rounds to 65504 in fp16, 3.9e6 is within bf16's range, and inf stays inf.
  x[17] = 65519.0f;
  io::write_npy(dir / "edge.npy", io::NpyType::f32, {1, 2, 7, 8}, x.data());
  x[17] = std::numeric_limits<float>::infinity();
  io::write_npy(dir / "inf.npy", io::NpyType::f32, {1, 2, 7, 8}, x.data());
  for (const std::string& ok : {inputs("q.npy", "k.npy", "edge.npy") + " --dtype fp16",
                                inputs("q.npy", "big.npy") + " --dtype bf16",
                                inputs("q.npy", "k.npy", "inf.npy") + " --dtype fp16"}) {
    const Result r = run_cli(ok, dir);
    EXPECT_EQ(r.status, 0) << ok << ": " << r.err;
    std::remove((dir / "o.npy").c_str());
    std::remove((dir / "lse.npy").c_str());
  }
}

// V with its own head dim: --dim-v must match V.npy's, V's head dim is at
// most 512; dO is O's shape (V's head dim), dV comes back V's shape.
TEST_F(cliRunErrors, ValueHeadDim) {
  const std::vector<float> x(1 * 2 * 7 * 600, 0.25f);
  io::write_npy(dir / "v16.npy", io::NpyType::f32, {1, 2, 7, 16}, x.data());
  {
    const Result r = run_cli(inputs("q.npy", "k.npy", "v16.npy"), dir);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(io::read_npy(dir / "o.npy").shape, (std::vector<int64_t>{1, 2, 5, 16}));
    std::remove((dir / "o.npy").c_str());
    std::remove((dir / "lse.npy").c_str());
  }
  expect_failure(inputs("q.npy", "k.npy", "v16.npy") + " --dim-v 8", "--dim-v 8 differs from the head dim");
  io::write_npy(dir / "v600.npy", io::NpyType::f32, {1, 2, 7, 600}, x.data());
  expect_failure(inputs("q.npy", "k.npy", "v600.npy"), "v_head_dim must be in 1..512");
  const std::vector<float> o16(1 * 2 * 5 * 16, 0.5f);
  io::write_npy(dir / "do16.npy", io::NpyType::f32, {1, 2, 5, 16}, o16.data());
  const std::string grads = " --dq '" + (dir / "dq.npy") + "' --dk '" + (dir / "dk.npy") + "' --dv '" +
                            (dir / "dv.npy") + "'";
  expect_failure(inputs("q.npy", "k.npy", "v16.npy") + " --dout '" + (dir / "q.npy") + "'" + grads,
                 "must be that of O (1, 2, 5, 16)");
  const Result r = run_cli(inputs("q.npy", "k.npy", "v16.npy") + " --dout '" + (dir / "do16.npy") + "'" + grads, dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(io::read_npy(dir / "dq.npy").shape, (std::vector<int64_t>{1, 2, 5, 8}));
  EXPECT_EQ(io::read_npy(dir / "dk.npy").shape, (std::vector<int64_t>{1, 2, 7, 8}));
  EXPECT_EQ(io::read_npy(dir / "dv.npy").shape, (std::vector<int64_t>{1, 2, 7, 16}));
}

}  // namespace
}  // namespace tileattn::cli_test
