# The emulated AVX-512 forward main loop, compiled once for the test files
# that run it.
target_sources(isa_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR}/emulated_avx512_forward.cpp)

# Its Kernels take the few-rows (decode) products from the AVX2 ones compiled
# natively: a file of its own with the AVX2 flags, because the emulated
# translation units must not include <immintrin.h>.
set(isa_native_few_rows ${CMAKE_CURRENT_LIST_DIR}/native_few_rows_kernels.cpp)
target_sources(isa_tests PRIVATE ${isa_native_few_rows})
set_source_files_properties(${isa_native_few_rows} PROPERTIES COMPILE_OPTIONS "${TILEATTN_AVX2_FLAGS}")

# The AVX-512 few-rows products called directly (avx512_few_rows_test.cpp),
# compiled with the AVX-512 flags in a file of their own.
set(isa_native_avx512_few_rows ${CMAKE_CURRENT_LIST_DIR}/native_avx512_few_rows.cpp)
target_sources(isa_tests PRIVATE ${isa_native_avx512_few_rows})
set_source_files_properties(${isa_native_avx512_few_rows} PROPERTIES COMPILE_OPTIONS "${TILEATTN_AVX512_FLAGS}")

# prefetch_code_test.cpp reads the built library's disassembly (the shared
# library, which isa_tests does not link: hence the explicit dependency).
target_compile_definitions(isa_tests PRIVATE TILEATTN_LIBRARY_FILE="$<TARGET_FILE:tileattn>")
add_dependencies(isa_tests tileattn)

# The bf16 product rungs (avx512bf16, amx) on the AVX-512 emulation and the
# AMX tile model: their kernels and the forward and backward main loops on
# them, compiled once, without <immintrin.h>.
target_sources(isa_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR}/emulated_bf16_kernel_sets.cpp
                                 ${CMAKE_CURRENT_LIST_DIR}/emulated_bf16_forward.cpp
                                 ${CMAKE_CURRENT_LIST_DIR}/emulated_bf16_backward.cpp)
# The backward main loop's tile_pair is [[gnu::flatten]]: at -O1 and above gcc
# inlines every emulated intrinsic of both rungs into it, and this one file took
# 200-250 s to compile (-O3 and -O1 alike; 3x the next file, alone at the end of
# a -j2 build). At -O0 it compiles in 4 s, and its tests run as fast (25 cases,
# 3.1 s either way): the emulated kernels (emulated_bf16_kernel_sets.cpp, at the
# build's level) and the float64 reference do the work.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/emulated_bf16_backward.cpp PROPERTIES COMPILE_OPTIONS -O0)

# The same kernels and one vdpbf16ps / tdpbf16ps natively, for the tests that
# compare the models with the hardware: the AMX flags where the compiler has
# them (as for the library); stubs otherwise (native_bf16_compiled()).
set(isa_native_bf16 ${CMAKE_CURRENT_LIST_DIR}/native_bf16_kernels.cpp)
target_sources(isa_tests PRIVATE ${isa_native_bf16})
if(TILEATTN_HAVE_AMX_FLAGS)
  set_source_files_properties(${isa_native_bf16} PROPERTIES COMPILE_OPTIONS "${TILEATTN_AMX_FLAGS}")
endif()
