// `tileattn run` end to end: inputs written as .npy, the binary run, outputs
// read back and compared with the float64 reference by the tolerance rule
// (testing::compare_with_reference), for every mask kind, GQA, both layouts,
// fp16 and bf16, and the log-sum-exp.
#include <gtest/gtest.h>

#include <cstring>

#include "core/half.hpp"
#include "cli/cli_support.hpp"

namespace tileattn::cli_test {
namespace {

using testing::Case;
using testing::CaseData;
using testing::MaskCase;

// Runs the case through the CLI and compares; `mask_2d` writes the mask as
// one [Nq, Nk] matrix broadcast over batch and heads.
testing::Comparison run_case(const Case& c, const std::string& extra = "", bool mask_2d = false) {
  TempDir dir;
  CaseData d(c);
  write_inputs(d, dir);
  std::string flags = "run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" + (dir / "v.npy") +
                      "' --out '" + (dir / "o.npy") + "' --lse '" + (dir / "lse.npy") + "'";
  flags += std::string(" --layout ") + layout_name(c.layout);
  if (c.dtype == DType::bf16) flags += " --dtype bf16";
  if (c.mask == MaskCase::causal || c.mask == MaskCase::causal_boolean) flags += " --causal";
  if (c.mask == MaskCase::window)
    flags += " --window " + std::to_string(c.window_left) + "," + std::to_string(c.window_right);
  const int64_t nq = c.seqlen_q, nk = c.seqlen_k;
  if (c.mask == MaskCase::boolean || c.mask == MaskCase::causal_boolean || c.mask == MaskCase::additive) {
    const bool boolean = c.mask != MaskCase::additive;
    std::vector<int64_t> shape = {c.batch, c.heads, nq, nk};
    if (mask_2d) {
      shape = {nq, nk};
      d.args.mask.stride = {0, 0, nk, 1};  // the reference then reads the broadcast mask too
    }
    if (boolean) io::write_npy(dir / "m.npy", io::NpyType::boolean, shape, d.bool_mask.data());
    else io::write_npy(dir / "m.npy", io::NpyType::f32, shape, d.add_mask.data());
    flags += " --mask '" + (dir / "m.npy") + "'";
  }
  if (!std::isnan(c.scale)) flags += " --scale " + std::to_string(c.scale);
  // (`extra` may give its own --softcap: the run then differs from the case's reference.)
  if (c.softcap > 0.0f && extra.find("--softcap") == std::string::npos)
    flags += " --softcap " + std::to_string(c.softcap);
  // --alibi takes the standard slopes of Hq heads: the case's Alibi::heads slopes for a power of two.
  if (c.alibi == Case::Alibi::heads) flags += " --alibi";
  // (`extra` may give its own --sinks: the run then differs from the case's reference.)
  if (c.sinks && extra.find("--sinks") == std::string::npos) {
    io::write_npy(dir / "sinks.npy", io::NpyType::f32, {c.heads}, d.sinks.data());
    flags += " --sinks '" + (dir / "sinks.npy") + "'";
  }
  const Result r = run_cli(flags + " " + extra, dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  if (r.status != 0) return {};

  const io::NpyArray o = io::read_npy(dir / "o.npy");
  EXPECT_EQ(o.shape, file_shape(c, c.heads, nq, value_dim(c)));
  EXPECT_EQ(o.type, c.dtype == DType::f16 ? io::NpyType::f16 : io::NpyType::f32);
  const size_t n = size_t(o.elements());
  if (c.dtype == DType::f32) std::memcpy(d.o32.data(), o.f32(), n * 4);
  if (c.dtype == DType::f16) std::memcpy(d.o16.data(), o.f16(), n * 2);
  if (c.dtype == DType::bf16)
    for (size_t i = 0; i < n; ++i) d.o16[i] = detail::float_to_bf16(o.f32()[i]);  // exact: bf16 widened
  const io::NpyArray lse = io::read_npy(dir / "lse.npy");
  EXPECT_EQ(lse.shape, (std::vector<int64_t>{c.batch, c.heads, nq}));
  EXPECT_EQ(lse.type, io::NpyType::f32);
  std::memcpy(d.lse.data(), lse.f32(), size_t(lse.elements()) * 4);
  return testing::compare_with_reference(d);
}

Case base() {
  Case c;
  c.batch = 2;
  c.heads = 2;
  c.kv_heads = 2;
  c.seqlen_q = 45;
  c.seqlen_k = 70;
  c.head_dim = 40;
  c.seed = 77;
  return c;
}

TEST(cliRun, NoMask) {
  const testing::Comparison cmp = run_case(base());
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
}

TEST(cliRun, CausalAndWindow) {
  Case c = base();
  c.mask = MaskCase::causal;
  testing::Comparison cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  c.mask = MaskCase::window;
  c.window_left = 9;
  c.window_right = 4;
  cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
}

TEST(cliRun, BooleanAndAdditiveMasks) {
  for (MaskCase m : {MaskCase::boolean, MaskCase::additive, MaskCase::causal_boolean})
    for (bool mask_2d : {false, true}) {
      Case c = base();
      c.mask = m;
      const testing::Comparison cmp = run_case(c, "", mask_2d);
      EXPECT_TRUE(cmp.ok()) << c.name() << (mask_2d ? " (2-D mask) " : " ") << cmp.describe();
    }
}

TEST(cliRun, GqaBshdScaleAndThreads) {
  Case c = base();
  c.heads = 8;
  c.kv_heads = 2;
  c.layout = Layout::bshd;
  c.mask = MaskCase::causal;
  c.scale = 0.25f;
  const testing::Comparison cmp = run_case(c, "--threads 1");
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
}

TEST(cliRun, Fp16AndBf16) {
  Case c = base();
  c.dtype = DType::f16;
  c.mask = MaskCase::additive;
  testing::Comparison cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  c.dtype = DType::bf16;
  c.layout = Layout::bshd;
  cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
}

// V with its own head dim (MLA's 192 / 128 and 576 / 512), read from V.npy;
// O comes back that wide. --dim-v given equal to it changes nothing.
TEST(cliRun, ValueHeadDimFromTheVFile) {
  Case c = base();
  c.head_dim = 192;
  c.v_head_dim = 128;
  c.mask = MaskCase::causal;
  testing::Comparison cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  c.head_dim = 576;
  c.v_head_dim = 512;
  c.kv_heads = 1;
  c.layout = Layout::bshd;
  c.dtype = DType::bf16;
  cmp = run_case(c, "--dim-v 512");
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
}

// --softcap C on scores beyond C (inputs in [-4, 4]): causal GQA fp32 and
// bf16, an additive mask (added after the cap); and a run without the flag
// fails the capped reference.
TEST(cliRun, Softcap) {
  Case c = base();
  c.heads = 4;
  c.kv_heads = 2;
  c.mask = MaskCase::causal;
  c.softcap = 5.0f;
  c.input_scale = 4.0f;
  testing::Comparison cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  c.dtype = DType::bf16;
  c.mask = MaskCase::additive;
  cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  c.alibi = Case::Alibi::heads;  // and with ALiBi, bshd
  c.layout = Layout::bshd;
  cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  c.alibi = Case::Alibi::none;
  c.layout = Layout::bhsd;
  c.dtype = DType::f32;
  c.mask = MaskCase::none;
  cmp = run_case(c, "--softcap 0");  // the capped case's reference, an uncapped run
  EXPECT_FALSE(cmp.ok()) << cmp.describe();
}

// --sinks S.npy (float32 [Hq]): causal GQA fp32, bf16 bshd with a soft cap
// and ALiBi; a run with other sinks (all 0) fails the case's reference.
TEST(cliRun, Sinks) {
  Case c = base();
  c.heads = 4;
  c.kv_heads = 2;
  c.mask = MaskCase::causal;
  c.sinks = true;
  testing::Comparison cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  c.dtype = DType::bf16;
  c.layout = Layout::bshd;
  c.softcap = 5.0f;
  c.input_scale = 4.0f;
  c.alibi = Case::Alibi::heads;
  cmp = run_case(c);
  EXPECT_TRUE(cmp.ok()) << cmp.describe();
  c = base();
  c.sinks = true;
  TempDir dir;
  const std::vector<float> zeros(size_t(c.heads), 0.0f);
  io::write_npy(dir / "zero_sinks.npy", io::NpyType::f32, {c.heads}, zeros.data());
  cmp = run_case(c, "--sinks '" + (dir / "zero_sinks.npy") + "'");
  EXPECT_FALSE(cmp.ok()) << cmp.describe();
}

// The comparison above can fail: a wrong scale is caught.
TEST(cliRun, WrongResultIsDetected) {
  const testing::Comparison cmp = run_case(base(), "--scale 0.5");
  EXPECT_FALSE(cmp.ok()) << cmp.describe();
}

}  // namespace
}  // namespace tileattn::cli_test
