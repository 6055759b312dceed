// The decode score products' software prefetches are in the library's code.
// A prefetch has no effect the compiler must keep: GCC 12 deleted the
// AVX-512 products' prefetches (issued from a lambda it had found free of
// side effects), no test noticed, and cold decode ran 1.5x slower for it
// (core/row_prefetch.hpp, prefetch_line). Every out-of-line copy of a
// few-rows score product in the built library (the AMX int8 tile scores
// included) must contain a prefetcht0;
// the disassembly comes from objdump (binutils, installed with the compiler).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <regex>
#include <string>

namespace tileattn::testing {
namespace {

struct Disassembly {
  bool ok = false;        // objdump ran and exited 0
  int64_t functions = 0;  // function headers seen
  // "address <demangled name>" -> prefetcht0 instructions, for the functions
  // whose name contains the needle (keyed by address too: two out-of-line
  // copies of one static function keep separate counts).
  std::map<std::string, int> counts;
};

Disassembly prefetches_by_function(const std::string& library, const std::string& needle,
                                   const std::string& instruction = "prefetcht0") {
  Disassembly out;
  const std::string command = "objdump -d --no-show-raw-insn -C '" + library + "' 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  std::string current;
  char buffer[8192];
  while (fgets(buffer, sizeof buffer, pipe)) {
    const std::string line = buffer;
    // "0000000000012340 <name>:" starts a function.
    const size_t open = line.find(" <"), close = line.rfind(">:");
    if (!line.empty() && line[0] != ' ' && open != std::string::npos && close != std::string::npos) {
      ++out.functions;
      current = line.substr(0, close + 1);
      if (line.find(needle) != std::string::npos) out.counts.emplace(current, 0);
      else current.clear();
      continue;
    }
    if (!current.empty() && line.find(instruction) != std::string::npos) ++out.counts[current];
  }
  out.ok = pclose(pipe) == 0;
  return out;
}

TEST(PrefetchCode, EveryFewRowsScoreProductHasItsPrefetches) {
  ASSERT_EQ(std::system("objdump --version > /dev/null 2>&1"), 0) << "objdump (binutils) is needed";
  int products = 0;
  for (const char* product : {"few_rows16::scores<", "few_rows::scores<", "few_rows_dot::scores<",
                              "avx512_vnni::(anonymous namespace)::int8_scores<"}) {
    const Disassembly d = prefetches_by_function(TILEATTN_LIBRARY_FILE, product);
    ASSERT_TRUE(d.ok && d.functions > 0) << "objdump found no functions in " << TILEATTN_LIBRARY_FILE;
    for (const auto& [name, count] : d.counts) {
      ++products;
      EXPECT_GT(count, 0) << name << " has no prefetcht0: its prefetches were compiled away";
    }
  }
  if (products == 0)
    GTEST_SKIP() << "every few-rows score product was inlined into its caller in " << TILEATTN_LIBRARY_FILE
                 << "; nothing to look at by name";
}

// The VNNI P V of an int8 cache asks for the next step's K rows (the main
// loop leaves them out of the scores there, few_rows_vnni.cpp): each
// out-of-line copy has its prefetcht0.
TEST(PrefetchCode, TheVnniProbabilityProductHasItsPrefetches) {
  ASSERT_EQ(std::system("objdump --version > /dev/null 2>&1"), 0) << "objdump (binutils) is needed";
  const Disassembly d = prefetches_by_function(TILEATTN_LIBRARY_FILE, "avx512_vnni::(anonymous namespace)::int8_accumulate<");
  ASSERT_TRUE(d.ok && d.functions > 0) << "objdump found no functions in " << TILEATTN_LIBRARY_FILE;
  if (d.counts.empty())
    GTEST_SKIP() << "the VNNI P V was inlined into its caller in " << TILEATTN_LIBRARY_FILE;
  for (const auto& [name, count] : d.counts)
    EXPECT_GT(count, 0) << name << " has no prefetcht0: its prefetches were compiled away";
}

// The vdpbf16ps decode scores also prefetch toward L2 (prefetcht1), where
// decode_prefetch_to_l2 sends a step's rows on AMD Zen 4.
TEST(PrefetchCode, TheDotScoresCanPrefetchToL2) {
  ASSERT_EQ(std::system("objdump --version > /dev/null 2>&1"), 0) << "objdump (binutils) is needed";
  const Disassembly d = prefetches_by_function(TILEATTN_LIBRARY_FILE, "few_rows_dot::scores<", "prefetcht1");
  ASSERT_TRUE(d.ok && d.functions > 0) << "objdump found no functions in " << TILEATTN_LIBRARY_FILE;
  if (d.counts.empty())
    GTEST_SKIP() << "few_rows_dot::scores was inlined into its caller (or the avx512bf16 rung is not built)";
  for (const auto& [name, count] : d.counts)
    EXPECT_GT(count, 0) << name << " has no prefetcht1: its L2 prefetches were compiled away";
}

// The decode P V asks for the next step's V rows toward L2 where the main
// loop chooses so (decode_pv_asks_next_v): every out-of-line copy of a
// column pass, or of the loop around it, instantiated to ask (kAsk: the
// template argument before the Load type of the FMA P V, the last one of the
// pair products' P V) has its prefetcht1.
TEST(PrefetchCode, TheProbabilityProductsCanAskForTheNextStepsValues) {
  ASSERT_EQ(std::system("objdump --version > /dev/null 2>&1"), 0) << "objdump (binutils) is needed";
  const struct {
    const char* needle;
    const char* asking;
  } products[] = {
      {"few_rows16::accumulate",
       R"(few_rows16::accumulate(_pass|_asking)<.*, true, tileattn::detail::\w+::few_rows16::(E4m3)?Loads)"},
      {"few_rows_dot::accumulate_pairs", R"(few_rows_dot::accumulate_pairs_(pass|asking)<.*, true>\(long)"},
  };
  for (const auto& product : products) {
    const Disassembly d = prefetches_by_function(TILEATTN_LIBRARY_FILE, product.needle, "prefetcht1");
    ASSERT_TRUE(d.ok && d.functions > 0) << "objdump found no functions in " << TILEATTN_LIBRARY_FILE;
    const std::regex asking(product.asking);
    int asking_copies = 0;
    for (const auto& [name, count] : d.counts) {
      if (!std::regex_search(name, asking)) continue;
      ++asking_copies;
      EXPECT_GT(count, 0) << name << " has no prefetcht1: its asks for the next V rows were compiled away";
    }
    if (asking_copies == 0)
      GTEST_SKIP() << product.needle
                   << ": the asking P V was inlined into its callers (or its rung is not built)";
  }
}

}  // namespace
}  // namespace tileattn::testing
