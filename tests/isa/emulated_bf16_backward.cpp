#include "isa/emulated_bf16_backward.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "isa/emulated_bf16_kernels.hpp"

#include "core/isa_entry.hpp"
#include "training/backward_problem.hpp"

namespace tileattn::detail::bf16_emulated::dot_backward {
using Kernels = Bf16DotKernels;
#include "core/backward_mainloop.hpp"
}  // namespace tileattn::detail::bf16_emulated::dot_backward

namespace tileattn::detail::bf16_emulated::amx_backward {
using Kernels = AmxKernels;
#include "core/backward_mainloop.hpp"
}  // namespace tileattn::detail::bf16_emulated::amx_backward

namespace tileattn::testing {

void emulated_bf16_backward(const BackwardArgs& args, Isa isa) {
  namespace emulated = detail::bf16_emulated;
  if (isa != Isa::avx512bf16 && isa != Isa::amx) std::abort();
  detail::validate(args);
  if (args.forward.dtype != DType::bf16) std::abort();
  if (isa == Isa::amx)
    detail::run_backward_passes(args, true, isa, emulated::amx_backward::run_backward_item,
                                emulated::amx_backward::run_backward_normalizers);
  else
    detail::run_backward_passes(args, true, isa, emulated::dot_backward::run_backward_item,
                                emulated::dot_backward::run_backward_normalizers);
}

}  // namespace tileattn::testing

#ifdef _IMMINTRIN_H_INCLUDED
#error "the emulated bf16 translation units must not include <immintrin.h>"
#endif
