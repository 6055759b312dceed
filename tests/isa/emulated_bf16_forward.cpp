#include "isa/emulated_bf16_forward.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "isa/emulated_bf16_kernels.hpp"

#include "core/forward_plan.hpp"
#include "core/isa_entry.hpp"
#include "core/problem.hpp"
#include "core/thread_pool.hpp"
#include "core/validate.hpp"
#include "core/workspace.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::detail::bf16_emulated::dot_loop {
using Kernels = Bf16DotKernels;
#include "core/mainloop.hpp"
}  // namespace tileattn::detail::bf16_emulated::dot_loop

namespace tileattn::detail::bf16_emulated::amx_loop {
using Kernels = AmxKernels;
#include "core/mainloop.hpp"
}  // namespace tileattn::detail::bf16_emulated::amx_loop

namespace tileattn::testing {

// attention_forward's steps (forward.cpp) with the emulated item functions.
bool emulated_bf16_forward(const ForwardArgs& args, Isa isa) {
  if (isa != Isa::avx512bf16 && isa != Isa::amx) std::abort();
  detail::validate(args);
  const int threads = detail::effective_threads(args.threads);
  detail::Problem p = detail::plan_forward(args, isa, threads);
  const bool few_rows = int64_t(p.heads_per_item) * p.block_q <= detail::bf16_emulated::Kernels::kFewRowsMax;
  if (few_rows && !isa_available(Isa::avx2)) return false;
  detail::run_forward_plan(p, threads,
                           isa == Isa::amx ? detail::bf16_emulated::amx_loop::run_forward_item
                                           : detail::bf16_emulated::dot_loop::run_forward_item);
  return true;
}


void emulated_fp8_rows_on_fp32(bool on) { detail::bf16_emulated::Bf16DotKernels::fp8_rows_on_fp32 = on; }

int64_t emulated_byte_permute_count() { return avx512_emulation::byte_permute_count.load(); }
int64_t emulated_bf16_dot_count() { return avx512_emulation::bf16_dot_count.load(); }

}  // namespace tileattn::testing

#ifdef _IMMINTRIN_H_INCLUDED
#error "the emulated bf16 translation units must not include <immintrin.h>"
#endif
