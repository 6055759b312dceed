#include "cli/args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tileattn::cli {

namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma - start));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

// A limit as people write it: "1e+30", "0.001", not std::to_string's
// 31-digit expansion.
std::string short_number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", value);
  return buf;
}

}  // namespace

int64_t parse_integer(const std::string& what, const std::string& text, int64_t min, int64_t max) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || text.find_first_of(" \t") != std::string::npos)
    throw UsageError(what + ": expected a whole number, got '" + text + "'");
  if (value < min || value > max)
    throw UsageError(what + ": must be in " + std::to_string(min) + ".." + std::to_string(max) +
                     ", got " + text);
  return value;
}

Args::Args(int argc, char** argv, std::initializer_list<Flag> flags)
    : Args(argc, argv, flags, std::string(argc > 0 ? argv[0] : "tileattn") + ": ",
           std::string("tileattn ") + (argc > 0 ? argv[0] : "")) {}

Args Args::program(const std::string& program, int argc, char** argv, std::initializer_list<Flag> flags) {
  return Args(argc, argv, flags, "", program);
}

Args::Args(int argc, char** argv, std::initializer_list<Flag> flags, const std::string& context,
           const std::string& help_command) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    bool inline_value = false;
    if (arg.rfind("--", 0) != 0)
      throw UsageError(context + "unexpected argument '" + arg + "' (see " + help_command + " --help)");
    if (const std::size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
      inline_value = true;
    }
    const Flag* known = nullptr;
    for (const Flag& f : flags)
      if (arg == f.name) known = &f;
    static const Flag help{"--help", false};
    if (arg == "--help") known = &help;
    if (!known) throw UsageError(context + "unknown flag '" + arg + "' (see " + help_command + " --help)");
    if (known->takes_value && !inline_value) {
      if (i + 1 >= argc) throw UsageError(arg + ": missing value");
      // A flag where its value should be ("--out --causal") is a value left
      // out, not a file named "--causal"; a value that starts with "--" can
      // still be given inline ("--out=--odd-name").
      if (std::string(argv[i + 1]).rfind("--", 0) == 0)
        throw UsageError(arg + ": missing value (got the flag '" + argv[i + 1] + "'; write " + arg +
                         "=VALUE for a value that starts with --)");
      value = argv[++i];
    }
    if (!known->takes_value && inline_value) throw UsageError(arg + ": takes no value");
    if (values_.count(arg)) throw UsageError(arg + ": given more than once");
    values_[arg] = value;
  }
}

bool Args::has(const std::string& flag) const { return values_.count(flag) != 0; }

std::string Args::text(const std::string& flag, const std::string& fallback) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return fallback;
  if (it->second.empty()) throw UsageError(flag + ": empty value");
  return it->second;
}

int64_t Args::integer(const std::string& flag, int64_t fallback, int64_t min, int64_t max) const {
  if (!has(flag)) return fallback;
  return parse_integer(flag, values_.at(flag), min, max);
}

double Args::number(const std::string& flag, double fallback, double min, double max) const {
  if (!has(flag)) return fallback;
  const std::string& text = values_.at(flag);
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') throw UsageError(flag + ": expected a number, got '" + text + "'");
  if (!std::isfinite(value)) throw UsageError(flag + ": must be a finite number, got '" + text + "'");
  if (value < min || value > max)
    throw UsageError(flag + ": must be in [" + short_number(min) + ", " + short_number(max) + "], got " + text);
  return value;
}

float Args::fp32_number(const std::string& flag, double fallback, double min, double max) const {
  const double value = number(flag, fallback, min, max);
  if (value != 0.0 && float(value) == 0.0f)
    throw UsageError(flag + ": " + values_.at(flag) + " rounds to 0 in fp32 (its smallest nonzero value is 1.4e-45)");
  return float(value);
}

DType Args::dtype(const std::string& flag, const std::string& fallback) const {
  return parse_dtype_flag(flag, text(flag, fallback));
}

DType parse_dtype_flag(const std::string& flag, const std::string& text) {
  try {
    return parse_dtype(text);  // its message says "dtype: ...", not which flag
  } catch (const Error&) {
    throw UsageError(flag + ": expected fp32, fp16 or bf16, got '" + text + "'");
  }
}

std::pair<int64_t, int64_t> Args::window(const std::string& flag) const {
  if (!has(flag)) return {-1, -1};
  const std::vector<std::string> parts = split_commas(values_.at(flag));
  if (parts.size() != 2)
    throw UsageError(flag + ": expected L,R (e.g. 128,0; -1 = unbounded), got '" + values_.at(flag) + "'");
  const int64_t big = int64_t{1} << 40;
  return {parse_integer(flag, parts[0], -1, big), parse_integer(flag, parts[1], -1, big)};
}

std::vector<int64_t> Args::integer_list(const std::string& flag, const std::vector<int64_t>& fallback,
                                        int64_t min, int64_t max) const {
  if (!has(flag)) return fallback;
  std::vector<int64_t> out;
  for (const std::string& part : split_commas(values_.at(flag)))
    out.push_back(parse_integer(flag, part, min, max));
  return out;
}

std::vector<std::string> Args::text_list(const std::string& flag,
                                         const std::vector<std::string>& fallback) const {
  if (!has(flag)) return fallback;
  std::vector<std::string> out = split_commas(values_.at(flag));
  for (const std::string& part : out)
    if (part.empty()) throw UsageError(flag + ": empty entry in '" + values_.at(flag) + "'");
  return out;
}

}  // namespace tileattn::cli
