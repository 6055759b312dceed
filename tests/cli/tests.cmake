# cli_tests run the built `tileattn` binary: tell them where it is, and build
# it first.
if(TARGET cli_tests AND TARGET tileattn_cli)
  target_compile_definitions(cli_tests PRIVATE TILEATTN_CLI="$<TARGET_FILE:tileattn_cli>"
                                                TILEATTN_CLI_DOC="${PROJECT_SOURCE_DIR}/docs/cli.md")
  add_dependencies(cli_tests tileattn_cli)
endif()
# The bench's naive OpenBLAS baseline is checked against the library directly.
if(TARGET cli_tests)
  target_sources(cli_tests PRIVATE ${CMAKE_SOURCE_DIR}/src/cli/naive_baseline.cpp ${CMAKE_SOURCE_DIR}/src/cli/openblas.cpp)
  target_link_libraries(cli_tests PRIVATE ${CMAKE_DL_LIBS})
  # Library code of the CLI: compiled as it is for tileattn_cli, never in a unity batch.
  set_source_files_properties(${CMAKE_SOURCE_DIR}/src/cli/naive_baseline.cpp ${CMAKE_SOURCE_DIR}/src/cli/openblas.cpp
                              PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endif()
# sweep_test.cpp and commands_test.cpp each define parse_or_fail(): not in one
# unity batch (TILEATTN_UNITY_TESTS, tests/CMakeLists.txt).
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/sweep_test.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
