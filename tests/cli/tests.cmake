# cli_tests run the built `tileattn` binary: tell them where it is, and build
# it first.
if(TARGET cli_tests AND TARGET tileattn_cli)
  target_compile_definitions(cli_tests PRIVATE TILEATTN_CLI="$<TARGET_FILE:tileattn_cli>")
  add_dependencies(cli_tests tileattn_cli)
endif()
# The bench's naive OpenBLAS baseline is checked against the library directly.
if(TARGET cli_tests)
  target_sources(cli_tests PRIVATE ${CMAKE_SOURCE_DIR}/src/cli/naive_baseline.cpp ${CMAKE_SOURCE_DIR}/src/cli/openblas.cpp)
  target_link_libraries(cli_tests PRIVATE ${CMAKE_DL_LIBS})
endif()
