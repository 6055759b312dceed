// Status codes, the per-thread last-error message and the version queries.
#include <cstring>
#include <cstdio>

#include "capi/guard.hpp"
#include "tileattn/tileattn.h"

namespace tileattn::capi {

namespace {

// A fixed buffer per thread: recording an error must not allocate (it may
// be reporting that allocation failed) and must not throw.
constexpr std::size_t kMessageCapacity = 1024;
thread_local char last_error_message[kMessageCapacity] = "";

}  // namespace

void clear_error() noexcept { last_error_message[0] = '\0'; }

tileattn_status set_error(tileattn_status status, const char* function, const char* message) noexcept {
  std::snprintf(last_error_message, kMessageCapacity, "%s: %s", function,
                message && *message ? message : tileattn_status_string(status));
  return status;
}

}  // namespace tileattn::capi

#define TILEATTN_STRINGIFY_(x) #x
#define TILEATTN_STRINGIFY(x) TILEATTN_STRINGIFY_(x)

extern "C" {

const char* tileattn_last_error(void) { return tileattn::capi::last_error_message; }

const char* tileattn_status_string(tileattn_status status) {
  // A C caller may pass any int; loading it as the C++ enum is undefined for
  // values outside the enumerators' range (UBSan), so read its bytes as an int.
  static_assert(sizeof(tileattn_status) == sizeof(int));
  int value;
  std::memcpy(&value, &status, sizeof value);
  switch (value) {
    case TILEATTN_OK: return "ok";
    case TILEATTN_INVALID_ARGUMENT: return "invalid argument";
    case TILEATTN_NOT_SUPPORTED: return "not supported";
    case TILEATTN_OUT_OF_MEMORY: return "out of memory";
    case TILEATTN_INTERNAL_ERROR: return "internal error";
  }
  return "unknown status";
}

tileattn_status tileattn_get_version(int32_t* major, int32_t* minor, int32_t* patch) {
  return tileattn::capi::guarded(__func__, [&] {
    tileattn::capi::require(major, "major");
    tileattn::capi::require(minor, "minor");
    tileattn::capi::require(patch, "patch");
    *major = TILEATTN_VERSION_MAJOR;
    *minor = TILEATTN_VERSION_MINOR;
    *patch = TILEATTN_VERSION_PATCH;
  });
}

const char* tileattn_version_string(void) {
  return TILEATTN_STRINGIFY(TILEATTN_VERSION_MAJOR) "." TILEATTN_STRINGIFY(
      TILEATTN_VERSION_MINOR) "." TILEATTN_STRINGIFY(TILEATTN_VERSION_PATCH);
}

}  // extern "C"
