// `tileattn run` with --dropout and the backward flags: O must equal the
// library's own forward with the same dropout seed (bit for bit), and dQ, dK,
// dV must match the float64 reference gradients by the tolerance rule.
#include <gtest/gtest.h>

#include <cstring>

#include "cli/cli_support.hpp"
#include "training/backward_support.hpp"

namespace tileattn::cli_test {
namespace {

void run_backward_case(const testing::BackwardCase& bc) {
  TempDir dir;
  testing::BackwardData data(bc, resolve_isa(Isa::automatic));  // runs the in-process forward
  const testing::Case& c = bc.c;
  write_inputs(data.fwd, dir);
  const auto q_shape = file_shape(c, c.heads, c.seqlen_q), k_shape = file_shape(c, c.kv_heads, c.seqlen_k);
  const bool half = c.dtype == DType::f16;
  io::write_npy(dir / "do.npy", half ? io::NpyType::f16 : io::NpyType::f32, q_shape, data.d_o.data(c.dtype));
  std::string flags = "run --q '" + (dir / "q.npy") + "' --k '" + (dir / "k.npy") + "' --v '" + (dir / "v.npy") +
                      "' --out '" + (dir / "o.npy") + "' --dout '" + (dir / "do.npy") + "' --dq '" +
                      (dir / "dq.npy") + "' --dk '" + (dir / "dk.npy") + "' --dv '" + (dir / "dv.npy") + "'" +
                      " --layout " + layout_name(c.layout) + " --dropout " + std::to_string(bc.dropout_p) +
                      " --seed " + std::to_string(bc.dropout_seed);
  if (c.mask == testing::MaskCase::causal) flags += " --causal";
  if (c.softcap > 0.0f) flags += " --softcap " + std::to_string(c.softcap);
  if (c.sinks) {
    io::write_npy(dir / "sinks.npy", io::NpyType::f32, {c.heads}, data.fwd.sinks.data());
    flags += " --sinks '" + (dir / "sinks.npy") + "' --dsinks '" + (dir / "dsinks.npy") + "'";
  }
  const Result r = run_cli(flags, dir);
  ASSERT_EQ(r.status, 0) << r.err;

  const std::size_t element = half ? 2 : 4;
  auto read_into = [&](const std::string& name, void* target, const std::vector<int64_t>& shape) {
    const io::NpyArray a = io::read_npy(dir / name);
    ASSERT_EQ(a.shape, shape) << name;
    ASSERT_EQ(a.type, half ? io::NpyType::f16 : io::NpyType::f32) << name;
    std::memcpy(target, a.bytes.data(), a.bytes.size());
  };
  const io::NpyArray o = io::read_npy(dir / "o.npy");
  ASSERT_EQ(o.bytes.size(), std::size_t(o.elements()) * element);
  EXPECT_EQ(0, std::memcmp(o.bytes.data(), data.fwd.args.o.data, o.bytes.size()))
      << "O differs from the library's forward with the same dropout seed";
  read_into("dq.npy", data.dq.data(c.dtype), q_shape);
  read_into("dk.npy", data.dk.data(c.dtype), k_shape);
  read_into("dv.npy", data.dv.data(c.dtype), k_shape);
  if (c.sinks) {
    const io::NpyArray ds = io::read_npy(dir / "dsinks.npy");
    ASSERT_EQ(ds.shape, (std::vector<int64_t>{c.heads}));
    ASSERT_EQ(ds.type, io::NpyType::f32);
    std::memcpy(data.d_sinks.data(), ds.f32(), size_t(c.heads) * 4);  // checked with the other gradients
  }
  testing::expect_gradients_match_reference(data, bc.name());
}

TEST(cliRun, BackwardWithDropout) {
  testing::BackwardCase bc;
  bc.c.batch = 2;
  bc.c.heads = 4;
  bc.c.kv_heads = 2;
  bc.c.seqlen_q = 37;
  bc.c.seqlen_k = 50;
  bc.c.head_dim = 24;
  bc.c.mask = testing::MaskCase::causal;
  bc.c.seed = 5;
  bc.dropout_p = 0.25f;
  bc.dropout_seed = 11;
  run_backward_case(bc);
  bc.c.dtype = DType::f16;
  bc.c.layout = Layout::bshd;
  run_backward_case(bc);
}

TEST(cliRun, BackwardWithSoftcap) {
  testing::BackwardCase bc;
  bc.c.heads = 4;
  bc.c.kv_heads = 2;
  bc.c.seqlen_q = 37;
  bc.c.seqlen_k = 50;
  bc.c.head_dim = 24;
  bc.c.mask = testing::MaskCase::causal;
  bc.c.softcap = 5.0f;
  bc.c.input_scale = 4.0f;
  bc.c.seed = 13;
  run_backward_case(bc);
}

TEST(cliRun, BackwardWithSinks) {
  testing::BackwardCase bc;
  bc.c.batch = 2;
  bc.c.heads = 4;
  bc.c.kv_heads = 2;
  bc.c.seqlen_q = 37;
  bc.c.seqlen_k = 50;
  bc.c.head_dim = 24;
  bc.c.mask = testing::MaskCase::causal;
  bc.c.sinks = true;
  bc.c.seed = 17;
  run_backward_case(bc);
  bc.c.dtype = DType::f16;
  bc.c.layout = Layout::bshd;
  run_backward_case(bc);
}

TEST(cliRun, BackwardWithoutDropout) {
  testing::BackwardCase bc;
  bc.c.seqlen_q = 20;
  bc.c.seqlen_k = 33;
  bc.c.head_dim = 16;
  bc.c.seed = 9;
  run_backward_case(bc);
}

}  // namespace
}  // namespace tileattn::cli_test
