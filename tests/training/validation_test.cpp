// Bad backward / probabilities arguments give an Error naming the argument
// and write nothing; the reference path; bitwise determinism run after run.
#include "backward_support.hpp"

namespace tileattn::testing {
namespace {

BackwardCase plain_case() {
  BackwardCase bc;
  bc.c.heads = 4;
  bc.c.kv_heads = 2;
  bc.c.seqlen_q = 30;
  bc.c.seqlen_k = 40;
  bc.c.head_dim = 16;
  return bc;
}

// Expects attention_backward(args) to throw E mentioning `needle`, with dQ,
// dK and dV untouched (they hold a sentinel).
template <class E>
void expect_rejected(BackwardData& data, const BackwardArgs& args, const std::string& needle) {
  std::fill(data.dq.f32.begin(), data.dq.f32.end(), 123.0f);
  std::fill(data.dk.f32.begin(), data.dk.f32.end(), 123.0f);
  std::fill(data.dv.f32.begin(), data.dv.f32.end(), 123.0f);
  try {
    attention_backward(args);
    ADD_FAILURE() << "accepted; expected an error mentioning '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (const auto* buffer : {&data.dq.f32, &data.dk.f32, &data.dv.f32})
    for (float x : *buffer) ASSERT_EQ(x, 123.0f) << "written despite the error";
}

TEST(BackwardValidation, RejectsBadArgumentsAndWritesNothing) {
  BackwardData data(plain_case(), best_isa());
  {
    BackwardArgs a = data.args;
    a.d_o.data = nullptr;
    expect_rejected<Error>(data, a, "d_o");
  }
  {
    BackwardArgs a = data.args;
    a.lse = nullptr;
    expect_rejected<Error>(data, a, "lse");
  }
  {
    BackwardArgs a = data.args;
    a.dq.data = const_cast<float*>(data.fwd.q32.data());
    expect_rejected<Error>(data, a, "dq: output overlaps input q");
  }
  {
    BackwardArgs a = data.args;
    a.dv.data = a.dk.data;
    expect_rejected<Error>(data, a, "dk: overlaps output dv");
  }
  {
    BackwardArgs a = data.args;
    a.dk.data = const_cast<float*>(data.d_o.f32.data());
    expect_rejected<Error>(data, a, "dk: output overlaps input d_o");
  }
  {
    BackwardArgs a = data.args;
    a.dq.stride[2] = 1;  // rows on top of each other
    expect_rejected<Error>(data, a, "dq: output strides overlap");
  }
  {
    BackwardArgs a = data.args;
    a.forward.shape.kv_heads = 3;
    expect_rejected<Error>(data, a, "kv_heads");
  }
  {
    BackwardArgs a = data.args;
    const int32_t seqlens[1] = {40};
    a.forward.kv.seqlens = seqlens;
    expect_rejected<NotSupported>(data, a, "KV-cache");
  }
  {
    BackwardArgs a = data.args;
    a.forward.shape.v_head_dim = 32;  // O, dO, V and dV laid out 16 wide, described as 32
    // O and dO are read (overlapping reads are allowed); dV, written, overlaps its own rows.
    expect_rejected<Error>(data, a, "dv: output strides overlap");
    a.forward.shape.v_head_dim = 513;
    expect_rejected<Error>(data, a, "v_head_dim must be in 1..512");
  }
}

// Gradients packed as FlashAttention's qkvpacked backward writes them, dq,
// dk and dv interleaved in one [B, N, 3, H, D] buffer (and dk, dv in one [B,
// N, 2, H, D]), share no element: accepted, equal to separate buffers bit
// for bit, every element written.
TEST(BackwardValidation, AcceptsPackedGradients) {
  BackwardCase bc = plain_case();
  bc.c.batch = 2;
  bc.c.kv_heads = bc.c.heads;
  bc.c.seqlen_k = bc.c.seqlen_q;
  BackwardData data(bc, best_isa());
  attention_backward(data.args);
  const int64_t b = bc.c.batch, h = bc.c.heads, n = bc.c.seqlen_q, d = bc.c.head_dim;
  const auto separate = [&](const Buffer& g, const std::array<int64_t, 4>& stride) {
    return dense(g.f32.data(), DType::f32, stride, b, h, n, d);
  };
  for (int parts : {3, 2}) {
    std::vector<float> packed(size_t(b * n * parts * h * d), std::numeric_limits<float>::quiet_NaN());
    const std::array<int64_t, 4> stride{n * parts * h * d, d, parts * h * d, 1};
    BackwardArgs a = data.args;
    int part = 0;
    if (parts == 3) a.dq = OutputView{packed.data() + h * d * part++, stride};
    a.dk = OutputView{packed.data() + h * d * part++, stride};
    a.dv = OutputView{packed.data() + h * d * part++, stride};
    std::vector<float> dq_alone(data.dq.f32.size());
    if (parts == 2) a.dq = OutputView{dq_alone.data(), data.args.dq.stride};
    attention_backward(a);
    EXPECT_EQ(dense(a.dq.data, DType::f32, a.dq.stride, b, h, n, d), separate(data.dq, data.args.dq.stride));
    EXPECT_EQ(dense(a.dk.data, DType::f32, a.dk.stride, b, h, n, d), separate(data.dk, data.args.dk.stride));
    EXPECT_EQ(dense(a.dv.data, DType::f32, a.dv.stride, b, h, n, d), separate(data.dv, data.args.dv.stride));
    if (parts == 3) {
      for (float x : packed) ASSERT_FALSE(std::isnan(x)) << "an element left unwritten";
    }
  }
}

TEST(BackwardValidation, RejectsBadSinkArgumentsAndWritesNothing) {
  BackwardCase bc = plain_case();
  bc.c.sinks = true;
  BackwardData data(bc, best_isa());
  {
    BackwardArgs a = data.args;
    a.forward.sinks = nullptr;  // d_sinks without sinks
    expect_rejected<Error>(data, a, "d_sinks: given without forward.sinks");
  }
  {
    BackwardArgs a = data.args;
    a.d_sinks = data.dv.f32.data() + 5;
    expect_rejected<Error>(data, a, "d_sinks: overlaps output dv");
  }
  {
    BackwardArgs a = data.args;
    a.d_sinks = data.fwd.sinks.data();
    expect_rejected<Error>(data, a, "d_sinks: output overlaps input sinks");
  }
  {
    BackwardArgs a = data.args;
    std::vector<float> sinks = data.fwd.sinks;
    sinks[1] = std::numeric_limits<float>::quiet_NaN();
    a.forward.sinks = sinks.data();
    std::fill(data.d_sinks.begin(), data.d_sinks.end(), 123.0f);
    expect_rejected<Error>(data, a, "sinks[1] must be finite");
    for (float x : data.d_sinks) ASSERT_EQ(x, 123.0f) << "d_sinks written despite the error";
  }
}

TEST(BackwardValidation, ProbabilitiesRefuseLargeShapes) {
  CaseData data(plain_case().c);
  ForwardArgs a = data.args;
  a.shape.seqlen_q = a.shape.seqlen_k = 1 << 14;  // 4 heads x 2^28 entries: refused before any read
  a.shape.batch = 1;
  const auto q_stride = dense_strides(Layout::bhsd, 1, 4, 1 << 14, 16);
  const auto k_stride = dense_strides(Layout::bhsd, 1, 2, 1 << 14, 16);
  a.q.stride = a.o.stride = q_stride;  // views of the bigger shape (never read)
  a.k.stride = a.v.stride = k_stride;
  a.lse = nullptr;
  float probe = 0.0f;
  try {
    attention_probabilities(a, &probe, {0, 0, 0, 1});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("small shapes"), std::string::npos) << e.what();
  }
}

// probs right after V in one buffer, V's rows narrower than K's (MLA-like
// 8 / 4): V's extent is its own head dim, so this is no overlap. (It was
// measured with K's head dim, and a heap that put probs there refused the
// call: a flaky "probs: output overlaps input v" in CI.)
TEST(BackwardValidation, ProbabilitiesRightAfterANarrowerVAreAccepted) {
  std::vector<float> q(2 * 8, 0.25f), k(3 * 8, 0.5f), o(2 * 4), v_then_probs(3 * 4 + 2 * 3, -1.0f);
  ForwardArgs a;
  a.shape = {1, 1, 1, 2, 3, 8, 4};
  a.dtype = DType::f32;
  a.q = {q.data(), dense_strides(Layout::bhsd, 1, 1, 2, 8)};
  a.k = {k.data(), dense_strides(Layout::bhsd, 1, 1, 3, 8)};
  a.v = {v_then_probs.data(), dense_strides(Layout::bhsd, 1, 1, 3, 4)};
  a.o = {o.data(), dense_strides(Layout::bhsd, 1, 1, 2, 4)};
  float* probs = v_then_probs.data() + 3 * 4;
  attention_probabilities(a, probs, {6, 6, 3, 1});
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(probs[i], 1.0f / 3.0f, 1e-6f) << i;  // equal scores
}

TEST(BackwardReferencePath, IsaReferenceWritesTheFloat64Gradients) {
  BackwardData data(plain_case(), best_isa());
  data.args.forward.isa = Isa::reference;
  attention_backward(data.args);
  const training::BackwardReference ref = training::reference_backward(data.args);
  const std::vector<double> dq = dense(data.dq.f32.data(), DType::f32, data.args.dq.stride, 1, 4, 30, 16);
  for (size_t e = 0; e < dq.size(); ++e) ASSERT_EQ(float(dq[e]), float(ref.dq[e]));
}

// Forward and backward, with dropout and key chunks, three runs each with 1
// and 2 threads: every bit the same.
TEST(BackwardDeterminism, BitwiseIdenticalAcrossRunsAndThreadCounts) {
  for (Isa isa : {Isa::generic, Isa::avx2}) {
    if (!isa_available(isa)) continue;
    BackwardCase bc;
    bc.c.heads = 4;
    bc.c.kv_heads = 1;
    bc.c.seqlen_q = 150;
    bc.c.seqlen_k = 1200;  // few (sequence, KV head) pairs: keys are cut into chunks
    bc.c.head_dim = 24;
    bc.c.mask = MaskCase::causal;
    bc.dropout_p = 0.2f;
    std::vector<float> first_o, first_dq, first_dk, first_dv;
    for (int run = 0; run < 3; ++run)
      for (int threads : {1, 2}) {
        BackwardCase with_threads = bc;
        BackwardData data(with_threads, isa);
        data.fwd.args.threads = threads;
        attention_forward(data.fwd.args);
        data.args.forward.threads = threads;
        attention_backward(data.args);
        if (first_o.empty()) {
          first_o = data.fwd.o32;
          first_dq = data.dq.f32;
          first_dk = data.dk.f32;
          first_dv = data.dv.f32;
          continue;
        }
        EXPECT_EQ(std::memcmp(first_o.data(), data.fwd.o32.data(), first_o.size() * 4), 0) << "O";
        EXPECT_EQ(std::memcmp(first_dq.data(), data.dq.f32.data(), first_dq.size() * 4), 0) << "dQ";
        EXPECT_EQ(std::memcmp(first_dk.data(), data.dk.f32.data(), first_dk.size() * 4), 0) << "dK";
        EXPECT_EQ(std::memcmp(first_dv.data(), data.dv.f32.data(), first_dv.size() * 4), 0) << "dV";
      }
  }
}

}  // namespace
}  // namespace tileattn::testing

namespace tileattn::testing {
namespace {

// No query rows (a ring-attention rank holding none, an empty slice built with
// dense_strides, whose strides are then zero): nothing to check for overlap,
// and the key gradients are exactly zero.
TEST(BackwardValidation, EmptyQueryRowsWithDenseStridesGiveZeroKeyGradients) {
  const int64_t heads = 2, kv_heads = 1, nk = 5, d = 8;
  std::vector<float> k(kv_heads * nk * d, 0.5f), v(kv_heads * nk * d, 0.25f);
  std::vector<float> dk(k.size(), 7.0f), dv(v.size(), 7.0f);
  const auto q_strides = dense_strides(Layout::bhsd, 1, heads, 0, d);  // zeros but the last
  const auto k_strides = dense_strides(Layout::bhsd, 1, kv_heads, nk, d);
  float empty = 0.0f;
  BackwardArgs a;
  a.forward.shape = {1, heads, kv_heads, 0, nk, d};
  a.forward.q = {&empty, q_strides};
  a.forward.k = {k.data(), k_strides};
  a.forward.v = {v.data(), k_strides};
  a.o = {&empty, q_strides};
  a.d_o = {&empty, q_strides};
  a.lse = &empty;
  a.dq = {&empty, q_strides};
  a.dk = {dk.data(), k_strides};
  a.dv = {dv.data(), k_strides};
  EXPECT_NO_THROW(attention_backward(a));
  for (float x : dk) ASSERT_EQ(x, 0.0f);
  for (float x : dv) ASSERT_EQ(x, 0.0f);
}

// O is an input of the backward (read for D = rowsum(dO o O), never
// written): a broadcast O (stride 0, one row standing for every row of its
// head) gives the gradients of the dense O holding those rows, bit for bit,
// and an O that lies over dO is read as it is. Both were refused as the
// forward's output ("o: output strides must be positive", "o: output overlaps").
TEST(BackwardValidation, OIsReadAsAnInputBroadcastOrOverlapping) {
  BackwardData data(plain_case(), best_isa());
  const auto o_stride = data.args.o.stride;
  const int64_t rows = data.bc.c.seqlen_q, heads = data.bc.c.heads, dv = data.bc.c.head_dim;
  std::vector<float> o_rows0(data.fwd.o32.size());  // every row of each head = its row 0
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < dv; ++c)
        o_rows0[size_t(h * o_stride[1] + r * o_stride[2] + c * o_stride[3])] =
            data.fwd.o32[size_t(h * o_stride[1] + c * o_stride[3])];
  BackwardArgs dense_args = data.args;
  dense_args.o = InputView{o_rows0.data(), o_stride};
  attention_backward(dense_args);
  const std::vector<float> dq = data.dq.f32, dk = data.dk.f32, dv_grad = data.dv.f32;

  BackwardArgs broadcast = data.args;
  broadcast.o = InputView{data.fwd.o32.data(), {o_stride[0], o_stride[1], 0, o_stride[3]}};
  std::fill(data.dq.f32.begin(), data.dq.f32.end(), 123.0f);
  attention_backward(broadcast);
  EXPECT_EQ(data.dq.f32, dq);
  EXPECT_EQ(data.dk.f32, dk);
  EXPECT_EQ(data.dv.f32, dv_grad);

  // O over dO (the same buffer): D = rowsum(dO o dO), as a dense copy gives it.
  BackwardArgs same = data.args;
  same.o = same.d_o;
  attention_backward(same);
  const std::vector<float> dq_same = data.dq.f32;
  std::vector<float> d_o_copy(data.d_o.f32);
  BackwardArgs copied = data.args;
  copied.o = InputView{d_o_copy.data(), data.args.d_o.stride};
  attention_backward(copied);
  EXPECT_EQ(data.dq.f32, dq_same);
}

}  // namespace
}  // namespace tileattn::testing
