#pragma once
// The Python interpreter the tests use to read and write files with NumPy
// (tests/CMakeLists.txt picks the project's .venv first).
#include <cstdlib>
#include <string>

namespace tileattn::testing {

// `python -c "<script>"` through the shell; the script must not contain '"'.
inline int run_python(const std::string& script) {
  return std::system(("'" TILEATTN_TEST_PYTHON "' -c \"" + script + "\"").c_str());
}

}  // namespace tileattn::testing
