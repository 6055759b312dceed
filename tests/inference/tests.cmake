# kv_quant_test.cpp and few_rows_test.cpp each define isa_paths(): not in one
# unity batch (TILEATTN_UNITY_TESTS, tests/CMakeLists.txt).
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kv_quant_test.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
