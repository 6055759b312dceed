// Per-thread scratch, sized up front and allocated once per call; the main
// loops never allocate.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

#include "tileattn/types.hpp"

namespace tileattn::detail {

class Workspace {
 public:
  Workspace(int64_t floats_per_worker, int workers)
      : stride_((floats_per_worker + 15) / 16 * 16) {
    int64_t bytes = 0;
    if (__builtin_mul_overflow(stride_, int64_t(workers) * 4, &bytes))
      throw Error("workspace: size overflows int64");
    data_ = static_cast<float*>(std::aligned_alloc(64, size_t(bytes > 0 ? bytes : 64)));
    if (!data_)
      throw std::bad_alloc();
  }
  ~Workspace() { std::free(data_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  float* for_worker(int worker) const { return data_ + int64_t(worker) * stride_; }
  int64_t floats_per_worker() const { return stride_; }

 private:
  int64_t stride_;
  float* data_ = nullptr;
};

}  // namespace tileattn::detail
