// A queued block of a bf16 tile product: the unit of work the main loop's
// bf16 operands hand to the tile kernels, run a 32-k step at a time between
// pieces of the softmax's exponentials (mainloop.hpp).
#pragma once

#include <cstdint>

namespace tileattn::detail {

// One queued block of a bf16 tile product (mainloop.hpp's Bf16Operands): C
// (32 rows, `cols` <= 32 columns at c) (+)= A (32 rows) B (the column panels
// from b) [+ A_lo B] over k, in bf16_kernels.hpp's pair layout.
struct Bf16Block {
  const uint16_t* a;
  const uint16_t* a_lo;  // null: none
  int64_t lda;
  const uint16_t* b;
  int64_t b_panel;
  float* c;
  int64_t ldc;
  int64_t k;
  int cols;  // 16 or 32
  bool accumulate;
  // Elements from one 32-k step of A (and of A_lo) to the next: 32 where A's
  // rows are contiguous, 64 where A and A_lo interleave 32-element pieces in
  // one row (P written in place over the scores, mainloop.hpp).
  int64_t a_step = 32;
};

}  // namespace tileattn::detail
