# cli_tests run the built `tileattn` binary: tell them where it is, and build
# it first.
if(TARGET cli_tests AND TARGET tileattn_cli)
  target_compile_definitions(cli_tests PRIVATE TILEATTN_CLI="$<TARGET_FILE:tileattn_cli>")
  add_dependencies(cli_tests tileattn_cli)
endif()
