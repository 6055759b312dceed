# Runs the numbered examples, and the install -> find_package / pkg-config flow
# against a fresh prefix under the build directory. Included from
# tests/CMakeLists.txt; the example targets come from examples/.
include(GNUInstallDirs)
set(tileattn_examples_dir ${CMAKE_CURRENT_LIST_DIR})
set(tileattn_test_prefix ${CMAKE_BINARY_DIR}/test-install)

foreach(example example_01_forward example_02_kv_cache_decode example_03_c_api)
  if(TARGET ${example})
    add_test(NAME examples.${example} COMMAND ${example})
    set_tests_properties(examples.${example} PROPERTIES TIMEOUT 60)
  endif()
endforeach()

if(TARGET tileattn_cli)
  set(tileattn_install_cli ON)
else()
  set(tileattn_install_cli OFF)
endif()
add_test(NAME examples.install_package
         COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DPREFIX=${tileattn_test_prefix}
                 -DLIBDIR=${CMAKE_INSTALL_LIBDIR} -DCLI=${tileattn_install_cli}
                 -P ${tileattn_examples_dir}/install_package.cmake)
set_tests_properties(examples.install_package PROPERTIES FIXTURES_SETUP tileattn_installed TIMEOUT 60)

# A separate CMake project finds the installed package (shared and static).
add_test(NAME examples.find_package
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${PROJECT_SOURCE_DIR}/examples/04_find_package
                 ${CMAKE_BINARY_DIR}/test-find-package --build-generator ${CMAKE_GENERATOR}
                 --build-options -DCMAKE_PREFIX_PATH=${tileattn_test_prefix} -DCMAKE_BUILD_TYPE=Release
                 -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
                 --test-command example_04_find_package)
set_tests_properties(examples.find_package PROPERTIES FIXTURES_REQUIRED tileattn_installed TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "C and C\\+\\+ APIs agree bit for bit")
add_test(NAME examples.find_package_static
         COMMAND ${CMAKE_BINARY_DIR}/test-find-package/example_04_find_package_static)
set_tests_properties(examples.find_package_static PROPERTIES DEPENDS examples.find_package
                     FIXTURES_REQUIRED tileattn_installed TIMEOUT 60)

# A C program built with the pkg-config flags computes what the C++ API computes.
add_executable(check_c_result ${tileattn_examples_dir}/check_c_result.cpp)
target_link_libraries(check_c_result PRIVATE tileattn_static)
add_test(NAME examples.pkg_config
         COMMAND ${CMAKE_COMMAND} -DPREFIX=${tileattn_test_prefix} -DLIBDIR=${CMAKE_INSTALL_LIBDIR}
                 -DCC=${CMAKE_C_COMPILER} -DSOURCE=${tileattn_examples_dir}/pkg_config_consumer.c
                 -DWORK=${CMAKE_BINARY_DIR}/test-pkg-config -DCHECKER=$<TARGET_FILE:check_c_result>
                 -P ${tileattn_examples_dir}/pkg_config.cmake)
set_tests_properties(examples.pkg_config PROPERTIES FIXTURES_REQUIRED tileattn_installed TIMEOUT 60)

# The README's C snippet compiles (it once filled a field the struct lacks).
add_test(NAME examples.readme_c_snippet
         COMMAND ${CMAKE_COMMAND} -DREADME=${PROJECT_SOURCE_DIR}/README.md -DINCLUDE=${PROJECT_SOURCE_DIR}/include
                 -DCC=${CMAKE_C_COMPILER} -DWORK=${CMAKE_BINARY_DIR}/test-readme
                 -P ${tileattn_examples_dir}/readme_snippets.cmake)
set_tests_properties(examples.readme_c_snippet PROPERTIES TIMEOUT 60)
