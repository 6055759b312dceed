// Built instead of isa/amx/ and isa/avx512bf16/ when the compiler has no
// AVX512-BF16 or AMX intrinsics (CMakeLists.txt): no bf16 product rungs
// (isa_available says so), no AMX or vdpbf16ps peak to measure.
#include <stdexcept>

#include "core/isa_entry.hpp"
#include "core/peak_kernels.hpp"

namespace tileattn::detail {

bool request_amx_permission() { return false; }

bool amx_peak_built() { return false; }

double amx_bf16_loop(int64_t, float*) { return 0; }

double bf16_dot_loop_avx512bf16(int64_t, float*) { return 0; }

bool bf16_products_built() { return false; }

// Never reached: isa_available(avx512bf16 / amx) is false in this build.
void forward_item_avx512bf16(const Problem&, const WorkItem&, float*) {
  throw std::logic_error("tileattn: built without the avx512bf16 rung");
}
void forward_item_amx(const Problem&, const WorkItem&, float*) {
  throw std::logic_error("tileattn: built without the amx rung");
}
void backward_item_avx512bf16(const BackwardProblem&, const BackwardItem&, float*) {
  throw std::logic_error("tileattn: built without the avx512bf16 rung");
}
void backward_item_amx(const BackwardProblem&, const BackwardItem&, float*) {
  throw std::logic_error("tileattn: built without the amx rung");
}
void backward_normalizers_avx512bf16(const BackwardProblem&, int64_t, int64_t, const int64_t*, int64_t, float*) {
  throw std::logic_error("tileattn: built without the avx512bf16 rung");
}
void backward_normalizers_amx(const BackwardProblem&, int64_t, int64_t, const int64_t*, int64_t, float*) {
  throw std::logic_error("tileattn: built without the amx rung");
}

}  // namespace tileattn::detail
