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
