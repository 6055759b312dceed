// `tileattn check`: the accuracy self-test. Runs the shared table of cases
// (src/testing/case_table.cpp) and a few larger shapes through
// attention_forward on the chosen ISA path(s) and compares each with the
// float64 reference by the project's tolerance rule (src/testing/tolerance.hpp:
// per output row, 2 x the error of a naive same-precision implementation + a
// floor proportional to the output's magnitude). --perturb R scales every
// element of O by (1 + R) first (the LSE is compared as computed), to show
// that the rule bites.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/report.hpp"
#include "testing/case_table.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::cli {

namespace {

const char* const kHelp =
    "usage: tileattn check [--isa all|auto|generic|avx2|avx512|avx512bf16|amx] [--perturb R] [--json]\n"
    "Accuracy self-test: a grid of shapes, masks, layouts and dtypes, each compared with a\n"
    "float64 reference; a case passes when the error of each output row is at most 2 x the\n"
    "error of a naive same-precision implementation plus a floor proportional to the\n"
    "output's magnitude (docs/accuracy.md). Exits 1 if any case fails.\n"
    "--isa all (default) runs every path this CPU supports.\n"
    "--perturb R multiplies every element of O by (1 + R) before comparing: a check that bites\n"
    "fails every fp32 case at 0.001 and every fp16/bf16 case at 0.01.\n";

std::vector<testing::Case> check_cases() {
  std::vector<testing::Case> cases = testing::correctness_cases();
  // Larger shapes, still quick: several tiles in both directions.
  testing::Case big;
  big.heads = 4;
  big.kv_heads = 2;
  big.seqlen_q = big.seqlen_k = 384;
  big.head_dim = 128;
  big.mask = testing::MaskCase::causal;
  big.seed = 7;
  cases.push_back(big);
  big.dtype = DType::f16;
  big.head_dim = 64;
  big.seqlen_q = 200;
  big.seqlen_k = 513;
  big.mask = testing::MaskCase::window;
  big.window_left = 100;
  big.window_right = 20;
  big.seed = 8;
  cases.push_back(big);
  return cases;
}

std::vector<Isa> isas_to_check(const std::string& choice) {
  if (choice == "all") {
    std::vector<Isa> out;
    for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
      if (isa_available(isa)) out.push_back(isa);
    return out;
  }
  Isa isa = Isa::automatic;
  try {
    isa = parse_isa(choice);
  } catch (const Error&) {  // its message lists the library's names, not "all"
    throw UsageError("--isa: expected all, auto, generic, avx2, avx512, avx512bf16 or amx, got '" + choice + "'");
  }
  if (isa == Isa::reference) throw UsageError("--isa: reference is what the paths are checked against");
  try {
    return {resolve_isa(isa)};
  } catch (const NotSupported& e) {  // "isa: amx is not supported by this CPU ...": name the flag
    const std::string message = e.what();
    throw NotSupported("--isa: " + (message.rfind("isa: ", 0) == 0 ? message.substr(5) : message));
  }
}

}  // namespace

int cmd_check(int argc, char** argv) {
  Args args(argc, argv, {{"--json", false}, {"--isa", true}, {"--perturb", true}});
  if (args.has("--help")) return std::fputs(kHelp, stdout), 0;
  const bool json = args.has("--json");
  const std::vector<Isa> isas = isas_to_check(args.text("--isa", "all"));
  const double perturb = args.number("--perturb", 0.0, -1.0, 1.0);
  const std::vector<testing::Case> cases = check_cases();

  int passed = 0, failed = 0;
  std::string cases_json = "[";
  for (Isa isa : isas)
    for (const testing::Case& c : cases) {
      testing::CaseData data(c);
      data.args.isa = isa;
      testing::Comparison cmp;
      std::string error;
      try {
        attention_forward(data.args);
        cmp = testing::compare_with_reference(data, perturb);
      } catch (const std::exception& e) {
        error = e.what();
      }
      const bool ok = error.empty() && cmp.ok();
      (ok ? passed : failed)++;
      if (json) {
        cases_json += std::string(cases_json.size() > 1 ? ", " : "") + "{\"name\": " + json_quote(c.name()) +
                      ", \"isa\": " + json_quote(isa_name(isa)) +
                      ", \"dtype\": " + json_quote(dtype_name(c.dtype)) +
                      ", \"max_error\": " + json_number(cmp.max_error) +
                      ", \"tolerance\": " + json_number(cmp.tolerance) +
                      ", \"ratio\": " + json_number(cmp.ratio) +
                      ", \"lse_error\": " + json_number(cmp.lse_error) +
                      ", \"lse_tolerance\": " + json_number(cmp.lse_tolerance) +
                      ", \"ok\": " + (ok ? "true" : "false") +
                      ", \"error\": " + (error.empty() ? std::string("null") : json_quote(error)) + "}";
      } else {
        std::printf("%-4s %-7s %-48s %s\n", ok ? "ok" : "FAIL", isa_name(isa), c.name().c_str(),
                    error.empty() ? cmp.describe().c_str() : ("error: " + error).c_str());
      }
    }
  if (json) {
    Report r;
    std::string isa_json = "[";
    for (Isa isa : isas) isa_json += std::string(isa_json.size() > 1 ? ", " : "") + json_quote(isa_name(isa));
    r.raw("isas", isa_json + "]", "");
    r.number("perturb", perturb);
    r.integer("passed", passed);
    r.integer("failed", failed);
    r.boolean("ok", failed == 0);
    r.raw("cases", cases_json + "]", "");
    r.print(true);
  } else {
    std::printf("%d of %d cases passed%s\n", passed, passed + failed, failed ? "" : " -- all ok");
  }
  return failed ? 1 : 0;
}

}  // namespace tileattn::cli
