// Fuzzes attention_forward: bytes become a ForwardArgs (fuzz_problem.hpp:
// small sizes, arbitrary strides, flags, masks, variable-length batches, KV
// seqlens, paged block tables, soft cap, ALiBi, sinks, batch_index /
// row_start) over buffers this harness owns, each sized to exactly the bytes
// its view may touch (so ASan sees any access outside a view).
//
// Properties checked, beyond "no sanitizer finding":
//  - the call either succeeds or throws tileattn::Error / NotSupported;
//  - on a throw, no output byte changed (o, lse);
//  - on success, no byte of o or lse outside its view changed, and no input changed;
//  - a view whose byte extent overflows int64 is always refused;
//  - an output that aliases q is refused, or nothing was written;
//  - on success with moderate inputs (finite, |x| <= 100, a boolean mask or
//    none, |scale| <= 1e6, moderate score modifiers), o is finite;
//  - on success, a rerun on every hardware thread (fuzz_threads.hpp) gives
//    the same bits of o and lse.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "fuzz_problem.hpp"
#include "fuzz_threads.hpp"
#include "fuzz_views.hpp"
#include "tileattn/attention.hpp"

namespace {

using tileattn::DType;
using tileattn::ForwardArgs;
using tileattn::MaskSpec;
using namespace fuzzviews;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_forward: property violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  ForwardProblem p(in, /*need_lse=*/false);
  ForwardArgs& a = p.args;
  const auto& s = a.shape;
  ViewBuffer &q = p.q, &k = p.k, &v = p.v, &o = p.o, &lse = p.lse, &mask = p.mask;
  // Read last, so that the corpus files written before it keep every earlier
  // choice: fp32_output, O's buffer made again with 4-byte elements.
  int64_t o_esize = p.esize;
  if (in.ConsumeBool()) {
    a.fp32_output = true;
    o_esize = 4;
    o = make_view_buffer(p.o_sizes.data(), a.o.stride.data(), 4, o_esize);
    a.o.data = o.data();
  }
  if (p.alias_o_to_q) a.o.data = q.data();

  if (p.unallocated() && !p.overflow()) {
    // A caller with that much memory would be fine; here only validation runs
    // (it reads cu_seqlens, seqlens and the block table, never the tensors).
    try {
      tileattn::validate(a);
    } catch (const tileattn::Error&) {
    } catch (const tileattn::NotSupported&) {
    }
    return 0;
  }

  const std::vector<unsigned char> q_before = q.bytes, k_before = k.bytes, v_before = v.bytes,
                                   mask_before = mask.bytes, slopes_before = p.modifiers.slopes.bytes,
                                   sinks_before = p.modifiers.sinks.bytes;
  bool threw = false;
  try {
    tileattn::attention_forward(a);
  } catch (const tileattn::Error&) {
    threw = true;
  } catch (const tileattn::NotSupported&) {
    threw = true;
  }
  // Overflowing views with no work (nothing to touch) may pass: only then.
  if ((q.overflow || o.overflow) && !threw && s.batch > 0 && p.max_nq > 0)
    fail("an overflowing q or o view was accepted");
  if (k.bytes != k_before || v.bytes != v_before || mask.bytes != mask_before ||
      p.modifiers.slopes.bytes != slopes_before || p.modifiers.sinks.bytes != sinks_before)
    fail("an input was written");
  if (p.alias_o_to_q) {
    if (!threw && q.bytes != q_before) fail("o aliasing q was accepted and written");
    return 0;
  }
  if (q.bytes != q_before) fail("q was written");
  if (threw) {
    if (!untouched(o)) fail("o written although the call threw");
    if (!untouched(lse)) fail("lse written although the call threw");
    return 0;
  }
  // Success: nothing outside the views was written.
  if (written_outside(o, p.o_sizes.data(), a.o.stride.data(), 4, o_esize)) fail("o written outside its view");
  if (written_outside(lse, p.l_sizes.data(), a.lse_stride.data(), 3, 4)) fail("lse written outside its view");

  // Moderate inputs give a finite o. Each output is a convex combination of
  // values (|v| <= 100), times 1 / (1 - dropout_p) <= 1000 where kept: f16
  // (largest 65504) only without dropout. The buffer's sentinel bytes outside
  // the view read as small finite numbers.
  const bool inputs_moderate =
      moderate(q, a.dtype, 100.0f) && moderate(k, a.dtype, 100.0f) && moderate(v, a.dtype, 100.0f) &&
      (a.mask.kind == MaskSpec::Kind::none || a.mask.kind == MaskSpec::Kind::boolean) &&
      (std::isnan(a.scale) || std::fabs(a.scale) <= 1e6f) && p.modifiers.moderate &&
      (a.dtype != DType::f16 || a.dropout_p == 0.0f);
  if (inputs_moderate && !o.overflow && !moderate(o, tileattn::output_dtype(a), std::numeric_limits<float>::max()))
    fail("o is not finite although every input is moderate");

  // The same bits on every hardware thread (the float64 reference runs on one).
  if (a.isa != tileattn::Isa::reference && !o.overflow && !lse.overflow) {
    const std::vector<unsigned char> o_first = o.bytes, lse_first = lse.bytes;
    std::fill(o.bytes.begin(), o.bytes.end(), kSentinel);
    std::fill(lse.bytes.begin(), lse.bytes.end(), kSentinel);
    ForwardArgs rerun = a;
    rerun.threads = kRerunThreads;
    bool spread = false;
    try {
      spread = run_on_every_thread([&] { tileattn::attention_forward(rerun); });
    } catch (...) {
      fail("the rerun on every thread threw");
    }
    if (!spread) fail("the rerun ran on fewer threads than it had items for");
    if (o.bytes != o_first || lse.bytes != lse_first) fail("another thread count gave other bits");
  }
  return 0;
}
