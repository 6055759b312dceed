// The decode score products' software prefetches are in the library's code.
// A prefetch has no effect the compiler must keep: GCC 12 deleted the
// AVX-512 products' prefetches (issued from a lambda it had found free of
// side effects), no test noticed, and cold decode ran 1.5x slower for it
// (core/row_prefetch.hpp, prefetch_line). Every out-of-line copy of a
// few-rows score product in the built library must contain a prefetcht0;
// the disassembly comes from objdump (binutils, installed with the compiler).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

namespace tileattn::testing {
namespace {

// Function name -> count of prefetcht0 instructions, for the functions whose
// demangled name contains `needle`.
std::map<std::string, int> prefetches_by_function(const std::string& library, const std::string& needle) {
  const std::string command = "objdump -d --no-show-raw-insn -C '" + library + "' 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::map<std::string, int> counts;
  if (!pipe) return counts;
  std::string line, current;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe.get())) {
    line = buffer;
    // "0000000000012340 <name>:" starts a function.
    const size_t open = line.find(" <"), close = line.rfind(">:");
    if (!line.empty() && line[0] != ' ' && open != std::string::npos && close != std::string::npos) {
      current = line.substr(open + 2, close - open - 2);
      if (current.find(needle) != std::string::npos) counts.emplace(current, 0);
      else current.clear();
      continue;
    }
    if (!current.empty() && line.find("prefetcht0") != std::string::npos) ++counts[current];
  }
  return counts;
}

TEST(PrefetchCode, EveryFewRowsScoreProductHasItsPrefetches) {
  ASSERT_EQ(std::system("objdump --version > /dev/null 2>&1"), 0) << "objdump (binutils) is needed";
  int functions = 0;
  for (const char* product : {"few_rows16::scores<", "few_rows::scores<"}) {
    for (const auto& [name, count] : prefetches_by_function(TILEATTN_LIBRARY_FILE, product)) {
      ++functions;
      EXPECT_GT(count, 0) << name << " has no prefetcht0: its prefetches were compiled away";
    }
  }
  if (functions == 0)
    GTEST_SKIP() << "every few-rows score product was inlined into its caller in " << TILEATTN_LIBRARY_FILE
                 << "; nothing to look at by name";
}

}  // namespace
}  // namespace tileattn::testing
