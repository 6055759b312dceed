// The C boundary: every tileattn_ function runs its body inside guarded(),
// which turns any C++ exception into a status code plus the calling thread's
// last-error message, so that no exception ever reaches C code.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <string>

#include "tileattn/tileattn.h"
#include "tileattn/types.hpp"

namespace tileattn::capi {

// Resets the calling thread's message to "".
void clear_error() noexcept;
// Records "<function>: <message>" (truncated, never allocates) and returns status.
tileattn_status set_error(tileattn_status status, const char* function, const char* message) noexcept;

template <class Body>
tileattn_status guarded(const char* function, Body&& body) noexcept {
  clear_error();
  try {
    body();
    return TILEATTN_OK;
  } catch (const NotSupported& e) {
    return set_error(TILEATTN_NOT_SUPPORTED, function, e.what());
  } catch (const Error& e) {
    return set_error(TILEATTN_INVALID_ARGUMENT, function, e.what());
  } catch (const std::bad_alloc&) {
    return set_error(TILEATTN_OUT_OF_MEMORY, function, "out of memory");
  } catch (const std::exception& e) {
    return set_error(TILEATTN_INTERNAL_ERROR, function, e.what());
  } catch (...) {
    return set_error(TILEATTN_INTERNAL_ERROR, function, "unknown exception");
  }
}

// Throws Error("<name> is null") for a null pointer argument.
inline void require(const void* pointer, const char* name) {
  if (!pointer) throw Error(std::string(name) + " is null");
}

// Reads a caller's versioned struct (see "ABI stability rules" in tileattn.h):
// fields the caller's (older) struct lacks keep the defaults in `result`; a
// newer struct is accepted only when every byte this library does not know
// is zero. `v1_size` is the size of the struct's first released version.
template <class T>
void read_versioned(const T* user, const char* name, std::size_t v1_size, T& result) {
  require(user, name);
  const std::size_t size = user->struct_size;
  if (size < v1_size)
    throw Error(std::string(name) + "->struct_size is " + std::to_string(size) + ", expected at least " +
                std::to_string(v1_size) + " (initialize the struct with its _init function)");
  if (size > sizeof(T)) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(user);
    for (std::size_t i = sizeof(T); i < size; ++i)
      if (bytes[i] != 0)
        throw NotSupported(std::string(name) + " sets fields that this library version (" +
                           std::to_string(sizeof(T)) + "-byte struct) does not know; upgrade tileattn");
  }
  std::memcpy(static_cast<void*>(&result), user, size < sizeof(T) ? size : sizeof(T));
  result.struct_size = sizeof(T);
}

// Writes a library-filled struct into the caller's, no further than the
// caller's struct_size.
template <class T>
void write_versioned(const T& filled, T* user, const char* name, std::size_t v1_size) {
  require(user, name);
  const std::size_t size = user->struct_size;
  if (size < v1_size)
    throw Error(std::string(name) + "->struct_size is " + std::to_string(size) + ", expected at least " +
                std::to_string(v1_size) + " (initialize the struct with its _init function)");
  std::memcpy(static_cast<void*>(user), &filled, size < sizeof(T) ? size : sizeof(T));
  user->struct_size = size;
}

// An argument struct of this library's size: every byte 0, struct_size set
// (the start of each struct's defaults).
template <class T>
T zeroed_struct() {
  T result;
  std::memset(static_cast<void*>(&result), 0, sizeof result);
  result.struct_size = sizeof result;
  return result;
}

inline constexpr std::size_t kMaxStructSize = 65536;

// Fills a caller's versioned struct of `size` bytes (its sizeof, which the
// header's *_init macros pass; the *_init functions themselves pass this
// library's): the defaults of the fields this library
// knows, zeros past them in a longer (newer) struct, struct_size = size.
// Nothing past `size` is written; below `v1_size` nothing at all.
template <class T>
void init_versioned(T* user, std::size_t size, std::size_t v1_size, const T& defaults, const char* name) {
  require(user, name);
  if (size < v1_size)
    throw Error("struct_size is " + std::to_string(size) + ", expected at least " + std::to_string(v1_size) +
                " (sizeof the struct of the first release)");
  // Far past any struct a later release could append to: a size that is not one.
  if (size > kMaxStructSize)
    throw Error("struct_size is " + std::to_string(size) + ", more than " + std::to_string(kMaxStructSize) +
                " (not the size of an argument struct)");
  std::memset(static_cast<void*>(user), 0, size);
  std::memcpy(static_cast<void*>(user), &defaults, size < sizeof(T) ? size : sizeof(T));
  user->struct_size = size;
}

// Size of a struct up to and including `member`: the size of its first
// version when `member` is that version's last field.
#define TILEATTN_CAPI_SIZE_THROUGH(type, member) (offsetof(type, member) + sizeof(((type*)nullptr)->member))

}  // namespace tileattn::capi
