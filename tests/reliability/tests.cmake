# reliability_tests: the out-of-memory test of the CLI runs the built `tileattn`.
if(TARGET reliability_tests AND TARGET tileattn_cli)
  target_compile_definitions(reliability_tests PRIVATE TILEATTN_CLI="$<TARGET_FILE:tileattn_cli>")
  add_dependencies(reliability_tests tileattn_cli)
endif()
