// Memory that ends at an inaccessible page, so that a kernel reading or
// writing even one byte past the data it was given crashes the test instead
// of passing silently. With the emulation's masked loads and stores touching
// only active lanes, this checks the AVX-512 kernels' tail handling the way
// the hardware's fault suppression would.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace tileattn::testing {

class GuardedBuffer {
 public:
  // Room for up to `capacity` bytes right before the guard page.
  explicit GuardedBuffer(size_t capacity) {
    page_ = size_t(sysconf(_SC_PAGESIZE));
    data_pages_ = (capacity + page_ - 1) / page_ + 1;
    size_ = (data_pages_ + 1) * page_;
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("GuardedBuffer: mmap failed");
    base_ = static_cast<char*>(p);
    if (mprotect(base_ + data_pages_ * page_, page_, PROT_NONE) != 0)
      throw std::runtime_error("GuardedBuffer: mprotect failed");
  }
  ~GuardedBuffer() { munmap(base_, size_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  // `bytes` bytes whose last one is the last accessible byte.
  template <class T = void>
  T* at_end(size_t bytes) {
    if (bytes > data_pages_ * page_) throw std::length_error("GuardedBuffer: too small");
    return reinterpret_cast<T*>(base_ + data_pages_ * page_ - bytes);
  }

 private:
  size_t page_ = 0, data_pages_ = 0, size_ = 0;
  char* base_ = nullptr;
};

}  // namespace tileattn::testing
