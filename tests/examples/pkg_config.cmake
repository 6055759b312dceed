# cmake -DPREFIX=... -DLIBDIR=lib -DCC=... -DSOURCE=... -DWORK=... -DCHECKER=... -P pkg_config.cmake
# Compiles a C99 program with `pkg-config --cflags --libs tileattn` against the
# installed PREFIX, runs it, and has CHECKER compare its result with the C++ API.
set(ENV{PKG_CONFIG_PATH} "${PREFIX}/${LIBDIR}/pkgconfig")
execute_process(COMMAND pkg-config --cflags --libs tileattn OUTPUT_VARIABLE flags
                OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs tileattn failed: ${err}")
endif()
message(STATUS "pkg-config --cflags --libs tileattn: ${flags}")
separate_arguments(flags UNIX_COMMAND "${flags}")
file(MAKE_DIRECTORY "${WORK}")
set(program "${WORK}/pkg_config_consumer")
execute_process(COMMAND "${CC}" -std=c99 -Wall -Werror -pedantic "${SOURCE}" ${flags}
                        "-Wl,-rpath,${PREFIX}/${LIBDIR}" -o "${program}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} with the pkg-config flags failed")
endif()
execute_process(COMMAND "${program}" "${WORK}/result.bin" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${program} failed (${rc})")
endif()
# It must use the installed library, not one from the build tree.
execute_process(COMMAND ldd "${program}" OUTPUT_VARIABLE deps)
if(NOT deps MATCHES "${PREFIX}/${LIBDIR}/libtileattn\\.so")
  message(FATAL_ERROR "${program} does not load the installed libtileattn.so:\n${deps}")
endif()
execute_process(COMMAND "${CHECKER}" "${WORK}/result.bin" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the C result differs from the C++ API")
endif()
