// The DLPack C exchange API table (DLPack 1.3, "DLPackExchangeAPI"): a
// framework publishes it as the capsule type(tensor).__dlpack_c_exchange_api__
// named "dlpack_exchange_api", so a consumer reads a tensor in one C call
// instead of calling tensor.__dlpack__() (a Python method: ~5 us per tensor in
// torch 2.15 here). Declared from the DLPack specification's struct layout;
// only the function this package calls is typed, the other entries are kept
// as pointers of the same size so the offsets match.
#pragma once

#include <cstdint>

#include <nanobind/ndarray.h>  // nanobind::dlpack::dltensor has DLTensor's layout

namespace tileattn::python {

inline constexpr const char* kDlpackExchangeCapsule = "dlpack_exchange_api";
inline constexpr int32_t kDlpackCpu = 1;  // DLDeviceType kDLCPU

struct DlpackExchangeApi {
  // DLPackExchangeAPIHeader
  uint32_t version_major;
  uint32_t version_minor;
  const void* prev_api;
  // Entries in the specification's order.
  const void* managed_tensor_allocator;
  const void* managed_tensor_from_py_object_no_sync;
  const void* managed_tensor_to_py_object_no_sync;
  // Fills `out` with a non-owning view of `py_object` (valid while the object
  // lives and is not resized); 0 on success, -1 with a Python exception set.
  // May be null.
  int (*dltensor_from_py_object_no_sync)(void* py_object, nanobind::dlpack::dltensor* out);
  const void* current_work_stream;
};

}  // namespace tileattn::python
