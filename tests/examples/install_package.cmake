# cmake -DBUILD_DIR=... -DPREFIX=... -DLIBDIR=lib -DCLI=ON|OFF -P install_package.cmake
# Installs the build into a fresh PREFIX and checks what landed there: headers,
# libraries with their SONAME, the CLI, the CMake package, the pkg-config
# file, and that the shared library exports only the public API.
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()

set(expected
  include/tileattn/tileattn.h include/tileattn/attention.hpp include/tileattn/types.hpp
  ${LIBDIR}/libtileattn.a ${LIBDIR}/libtileattn.so
  ${LIBDIR}/cmake/tileattn/tileattnConfig.cmake ${LIBDIR}/cmake/tileattn/tileattnConfigVersion.cmake
  ${LIBDIR}/cmake/tileattn/tileattnTargets.cmake ${LIBDIR}/pkgconfig/tileattn.pc)
if(CLI)
  list(APPEND expected bin/tileattn)
endif()
foreach(f ${expected})
  if(NOT EXISTS "${PREFIX}/${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# The SONAME carries the ABI version.
execute_process(COMMAND readelf -d "${PREFIX}/${LIBDIR}/libtileattn.so" OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT dynamic MATCHES "Library soname: \\[libtileattn\\.so\\.[0-9]+\\]")
  message(FATAL_ERROR "libtileattn.so has no versioned SONAME:\n${dynamic}")
endif()

# Symbol hygiene: every defined dynamic symbol is public tileattn API.
execute_process(COMMAND nm -D --defined-only -C "${PREFIX}/${LIBDIR}/libtileattn.so"
                OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on the installed library")
endif()
string(REPLACE "\n" ";" symbols "${symbols}")
set(count 0)
set(bad "")
foreach(line ${symbols})
  string(REGEX REPLACE "^[0-9a-f]* *[A-Za-z] " "" name "${line}")
  if(name STREQUAL "TILEATTN_0")  # the version node itself
    continue()
  endif()
  math(EXPR count "${count} + 1")
  if(name MATCHES "^tileattn::(detail|capi|io)::")
    list(APPEND bad "${name}")
  elseif(NOT name MATCHES "^(tileattn_[a-z0-9_]+|tileattn::.*|(typeinfo|typeinfo name|vtable) for tileattn::.*)@@TILEATTN_0$")
    list(APPEND bad "${name}")
  endif()
endforeach()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "libtileattn.so exports symbols outside the public API:\n  ${bad}")
endif()
if(count LESS 20)
  message(FATAL_ERROR "libtileattn.so exports only ${count} symbols: the C API is missing")
endif()
message(STATUS "installed to ${PREFIX}; ${count} exported symbols, all public API")
