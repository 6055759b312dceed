# reliability_tests: the out-of-memory test of the CLI runs the built `tileattn`.
if(TARGET reliability_tests AND TARGET tileattn_cli)
  target_compile_definitions(reliability_tests PRIVATE TILEATTN_CLI="$<TARGET_FILE:tileattn_cli>")
  add_dependencies(reliability_tests tileattn_cli)
endif()
# numerics_test.cpp and bad_input_test.cpp each define kInf and kNaN: not in one
# unity batch (TILEATTN_UNITY_TESTS, tests/CMakeLists.txt).
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/numerics_test.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
