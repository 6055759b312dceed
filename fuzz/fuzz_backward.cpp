// Fuzzes attention_backward: bytes become a forward problem exactly as in
// fuzz_forward (fuzz_problem.hpp; with an LSE view always), the forward
// computes O and LSE where it accepts the call, and what the input has left
// chooses dO and the strides of dQ, dK and dV (the inputs' own, or arbitrary
// ones as pick_strides makes them) and d_sinks where sinks are given. Every
// gradient view has its own buffer sized to the bytes it may touch.
//
// Properties checked, beyond "no sanitizer finding":
//  - the call either succeeds or throws tileattn::Error / NotSupported;
//  - no input changed: q, k, v, o, lse, dO, mask, ALiBi slopes, sinks;
//  - on a throw, no gradient byte changed (dq, dk, dv, d_sinks);
//  - on success, no byte of a gradient outside its view changed;
//  - a view whose byte extent overflows int64 is refused when the call has
//    work (a batch, queries and keys);
//  - on success, a rerun on every hardware thread (fuzz_threads.hpp) gives
//    the same bits of every gradient.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fuzz_problem.hpp"
#include "fuzz_threads.hpp"
#include "fuzz_views.hpp"
#include "tileattn/attention.hpp"
#include "tileattn/backward.hpp"

namespace {

using tileattn::BackwardArgs;
using tileattn::ForwardArgs;
using namespace fuzzviews;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_backward: property violated: %s\n", what);
  std::abort();
}

// A gradient's buffer with the view it holds.
struct Gradient {
  ViewBuffer* buf;
  const int64_t* sizes;
  const int64_t* strides;
  int rank;
  int64_t esize;
  const char* written_outside;  // the failure message
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  ForwardProblem p(in, /*need_lse=*/true);
  ForwardArgs& a = p.args;  // o stays on its own buffer (p.alias_o_to_q is fuzz_forward's test)
  if (p.unallocated()) return 0;  // validation without the tensors: fuzz_forward

  // O and LSE: the forward's where it accepts the call; where it refuses,
  // the sentinel bytes (small finite numbers) stay, and the backward is
  // called all the same (it must refuse what the forward refused for a view).
  try {
    tileattn::attention_forward(a);
  } catch (const tileattn::Error&) {
  } catch (const tileattn::NotSupported&) {
  }

  BackwardArgs b;
  b.forward = a;
  b.forward.o = {};  // the backward reads O and LSE from b.o and b.lse
  b.forward.lse = nullptr;
  b.o = {p.o.data(), a.o.stride};
  b.lse = reinterpret_cast<const float*>(p.lse.data());
  b.lse_stride = a.lse_stride;
  ViewBuffer d_o = make_view_buffer(p.o_sizes.data(), a.o.stride.data(), 4, p.esize);
  fill_values(in, d_o, a.dtype);
  b.d_o = {d_o.data(), a.o.stride};
  const auto gradient_strides = [&](const std::array<int64_t, 4>& sizes, const std::array<int64_t, 4>& like) {
    return in.ConsumeBool() ? like : pick_strides(in, sizes.data());
  };
  b.dq.stride = gradient_strides(p.q_sizes, a.q.stride);
  b.dk.stride = gradient_strides(p.k_sizes, a.k.stride);
  b.dv.stride = gradient_strides(p.v_sizes, a.v.stride);
  ViewBuffer dq = make_view_buffer(p.q_sizes.data(), b.dq.stride.data(), 4, p.esize);
  ViewBuffer dk = make_view_buffer(p.k_sizes.data(), b.dk.stride.data(), 4, p.esize);
  ViewBuffer dv = make_view_buffer(p.v_sizes.data(), b.dv.stride.data(), 4, p.esize);
  if (d_o.too_large || dq.too_large || dk.too_large || dv.too_large) return 0;
  b.dq.data = dq.data();
  b.dk.data = dk.data();
  b.dv.data = dv.data();
  ViewBuffer d_sinks;  // fp32 [heads], dense
  const int64_t sink_sizes[1] = {a.shape.heads}, sink_strides[1] = {1};
  if (a.sinks && in.ConsumeBool()) {
    d_sinks = make_view_buffer(sink_sizes, sink_strides, 1, 4);
    b.d_sinks = reinterpret_cast<float*>(d_sinks.data());
  }
  // Read last, so that the corpus files written before it keep every earlier
  // choice: fp32_gradients, the gradients' buffers made again with 4-byte
  // elements.
  int64_t grad_esize = p.esize;
  if (in.ConsumeBool()) {
    b.fp32_gradients = true;
    grad_esize = 4;
    dq = make_view_buffer(p.q_sizes.data(), b.dq.stride.data(), 4, grad_esize);
    dk = make_view_buffer(p.k_sizes.data(), b.dk.stride.data(), 4, grad_esize);
    dv = make_view_buffer(p.v_sizes.data(), b.dv.stride.data(), 4, grad_esize);
    if (dq.too_large || dk.too_large || dv.too_large) return 0;
    b.dq.data = dq.data();
    b.dk.data = dk.data();
    b.dv.data = dv.data();
  }
  const Gradient gradients[] = {
      {&dq, p.q_sizes.data(), b.dq.stride.data(), 4, grad_esize, "dq written outside its view"},
      {&dk, p.k_sizes.data(), b.dk.stride.data(), 4, grad_esize, "dk written outside its view"},
      {&dv, p.v_sizes.data(), b.dv.stride.data(), 4, grad_esize, "dv written outside its view"},
      {&d_sinks, sink_sizes, sink_strides, 1, 4, "d_sinks written outside its view"}};

  const ViewBuffer* inputs[] = {&p.q, &p.k, &p.v, &p.o, &p.lse, &d_o, &p.mask, &p.modifiers.slopes,
                                &p.modifiers.sinks};
  std::vector<std::vector<unsigned char>> inputs_before;
  for (const ViewBuffer* x : inputs) inputs_before.push_back(x->bytes);
  bool threw = false;
  try {
    tileattn::attention_backward(b);
  } catch (const tileattn::Error&) {
    threw = true;
  } catch (const tileattn::NotSupported&) {
    threw = true;
  }
  for (size_t i = 0; i < std::size(inputs); ++i)
    if (inputs[i]->bytes != inputs_before[i]) fail("the backward wrote an input");
  if (threw) {
    for (const Gradient& g : gradients)
      if (!untouched(*g.buf)) fail("a gradient written although the backward threw");
    return 0;
  }
  const bool overflow = p.overflow() || d_o.overflow || dq.overflow || dk.overflow || dv.overflow;
  if (overflow && a.shape.batch > 0 && p.max_nq > 0 && p.max_nk > 0) fail("an overflowing view was accepted");
  if (overflow) return 0;
  for (const Gradient& g : gradients)
    if (written_outside(*g.buf, g.sizes, g.strides, g.rank, g.esize)) fail(g.written_outside);

  // The same bits on every hardware thread (the float64 reference runs on one).
  if (a.isa != tileattn::Isa::reference) {
    std::vector<std::vector<unsigned char>> first;
    for (const Gradient& g : gradients) {
      first.push_back(g.buf->bytes);
      std::fill(g.buf->bytes.begin(), g.buf->bytes.end(), kSentinel);
    }
    BackwardArgs rerun = b;
    rerun.forward.threads = kRerunThreads;
    bool spread = false;
    try {
      spread = run_on_every_thread([&] { tileattn::attention_backward(rerun); });
    } catch (...) {
      fail("the rerun on every thread threw");
    }
    if (!spread) fail("the rerun ran on fewer threads than it had items for");
    for (size_t i = 0; i < std::size(gradients); ++i)
      if (gradients[i].buf->bytes != first[i]) fail("another thread count gave other gradient bits");
  }
  return 0;
}
