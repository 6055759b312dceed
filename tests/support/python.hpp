#pragma once
// The Python interpreter the tests use to read and write files with NumPy:
// the project's .venv where it exists when the test runs, else the one
// tests/CMakeLists.txt found at configure time.
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace tileattn::testing {

inline std::string test_python() {
  return access(TILEATTN_TEST_VENV_PYTHON, X_OK) == 0 ? TILEATTN_TEST_VENV_PYTHON : TILEATTN_TEST_PYTHON;
}

// `python -c "<script>"` through the shell; the script must not contain '"'.
inline int run_python(const std::string& script) {
  return std::system(("'" + test_python() + "' -c \"" + script + "\"").c_str());
}

}  // namespace tileattn::testing
