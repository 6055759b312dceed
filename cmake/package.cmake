# Installation, the CMake package (tileattn::tileattn), the pkg-config file,
# the shared library's export list and the `docs` target. Included at the end
# of the top-level CMakeLists.txt, after every target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The C header states the version too (for C callers to compare with the
# library they load); it must agree with project().
file(STRINGS ${PROJECT_SOURCE_DIR}/include/tileattn/tileattn.h tileattn_h_version
     REGEX "^#define TILEATTN_VERSION_(MAJOR|MINOR|PATCH) [0-9]+$")
string(REGEX REPLACE "[^\n;]*_(MAJOR|MINOR|PATCH) ([0-9]+)" "\\2" tileattn_h_version "${tileattn_h_version}")
string(REPLACE ";" "." tileattn_h_version "${tileattn_h_version}")
if(NOT tileattn_h_version STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "include/tileattn/tileattn.h says version ${tileattn_h_version}, "
                      "project() says ${PROJECT_VERSION}: update TILEATTN_VERSION_* in the header")
endif()

# Only the public API leaves the shared library (see src/capi/exports.map).
set(TILEATTN_EXPORTS_MAP ${PROJECT_SOURCE_DIR}/src/capi/exports.map)
target_link_options(tileattn PRIVATE "LINKER:--version-script=${TILEATTN_EXPORTS_MAP}")
set_property(TARGET tileattn APPEND PROPERTY LINK_DEPENDS ${TILEATTN_EXPORTS_MAP})

# A Python wheel (scikit-build-core sets SKBUILD) carries only the extension
# module; the C/C++ development files are for `cmake --install`.
if(NOT SKBUILD)
  set_target_properties(tileattn_static PROPERTIES EXPORT_NAME tileattn_static)
  install(TARGETS tileattn tileattn_static EXPORT tileattnTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tileattn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp"
          # Ring attention lives in tileattn_mpi (MPI), which is not installed.
          PATTERN "mpi.hpp" EXCLUDE)
  if(TARGET tileattn_cli)
    install(TARGETS tileattn_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()

  set(TILEATTN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tileattn)
  install(EXPORT tileattnTargets NAMESPACE tileattn:: DESTINATION ${TILEATTN_CMAKE_DIR})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tileattnConfig.cmake.in
                                ${PROJECT_BINARY_DIR}/tileattnConfig.cmake
                                INSTALL_DESTINATION ${TILEATTN_CMAKE_DIR})
  # 0.x releases promise no compatibility between minor versions.
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/tileattnConfigVersion.cmake
                                   COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/tileattnConfig.cmake ${PROJECT_BINARY_DIR}/tileattnConfigVersion.cmake
          DESTINATION ${TILEATTN_CMAKE_DIR})

  # pkg-config: the prefix is found relative to the .pc file itself
  # (${pcfiledir}), so that an install anywhere (`cmake --install --prefix`)
  # gives a working file.
  set(TILEATTN_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(TILEATTN_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(TILEATTN_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
    if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
      set(TILEATTN_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
    endif()
    if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
      set(TILEATTN_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
    endif()
  else()
    file(RELATIVE_PATH pc_to_prefix "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
    string(REGEX REPLACE "/$" "" pc_to_prefix "${pc_to_prefix}")
    set(TILEATTN_PC_PREFIX "\${pcfiledir}/${pc_to_prefix}")
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/tileattn.pc.in ${PROJECT_BINARY_DIR}/tileattn.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/tileattn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()

# API reference from the headers' comments: `cmake --build <dir> --target docs`.
find_program(TILEATTN_DOXYGEN doxygen)
if(TILEATTN_DOXYGEN)
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/docs
    COMMAND ${CMAKE_COMMAND} -E env TILEATTN_DOCS_OUTPUT=${PROJECT_BINARY_DIR}/docs
            TILEATTN_VERSION=${PROJECT_VERSION} ${TILEATTN_DOXYGEN} ${PROJECT_SOURCE_DIR}/docs/Doxyfile
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    COMMENT "API reference -> ${PROJECT_BINARY_DIR}/docs/html/index.html"
    VERBATIM)
else()
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E echo "docs: doxygen not found (scripts/setup.sh installs it)"
    COMMAND ${CMAKE_COMMAND} -E false
    VERBATIM)
endif()
