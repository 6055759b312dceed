// The small argument parser every subcommand shares: `--flag value`,
// `--flag=value` and bare switches. Unknown flags, missing values and
// malformed numbers are UsageErrors whose one-line message names the flag.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tileattn/types.hpp"

namespace tileattn::cli {

class UsageError : public Error {
 public:
  using Error::Error;
};

struct Flag {
  const char* name;  // with the leading "--"
  bool takes_value;
};

class Args {
 public:
  // argv[0] is the subcommand's name; --help is always accepted.
  Args(int argc, char** argv, std::initializer_list<Flag> flags);
  // For a program without subcommands (tileattn-ring): argv[0] is skipped
  // and errors point to `<program> --help`.
  static Args program(const std::string& program, int argc, char** argv, std::initializer_list<Flag> flags);

  bool has(const std::string& flag) const;
  std::string text(const std::string& flag, const std::string& fallback = "") const;
  // Whole number in [min, max].
  int64_t integer(const std::string& flag, int64_t fallback, int64_t min, int64_t max) const;
  // Finite number in [min, max].
  double number(const std::string& flag, double fallback, double min, double max) const;
  // The same for a value the library takes as fp32: a nonzero number that
  // rounds to 0 there (below 2^-150 in magnitude) is refused rather than
  // turned into 0 (a soft cap or dropout silently off, a scale of 0).
  float fp32_number(const std::string& flag, double fallback, double min, double max) const;
  // fp32, fp16 or bf16 (and parse_dtype's other spellings).
  DType dtype(const std::string& flag, const std::string& fallback) const;
  // "L,R" with each side >= -1 (-1: unbounded). Absent: {-1, -1}.
  std::pair<int64_t, int64_t> window(const std::string& flag) const;
  // Comma-separated whole numbers, each in [min, max].
  std::vector<int64_t> integer_list(const std::string& flag, const std::vector<int64_t>& fallback,
                                    int64_t min, int64_t max) const;
  std::vector<std::string> text_list(const std::string& flag,
                                     const std::vector<std::string>& fallback) const;

 private:
  // `context` starts the messages that need one ("run: "); `help_command` is the
  // command whose --help they point to ("tileattn run").
  Args(int argc, char** argv, std::initializer_list<Flag> flags, const std::string& context,
       const std::string& help_command);
  std::map<std::string, std::string> values_;
};

// Parses a whole number; throws UsageError naming `what` otherwise.
int64_t parse_integer(const std::string& what, const std::string& text, int64_t min, int64_t max);
// parse_dtype, with a UsageError naming `flag` for a name it does not know.
DType parse_dtype_flag(const std::string& flag, const std::string& text);

// The standard ALiBi slopes of `heads` heads (Press et al., as
// FlashAttention-2's tests and Hugging Face's models build them): for a
// power of two n, 2^(-8 (h + 1) / n); otherwise those of the largest power
// of two below, then every other slope of twice that many.
inline std::vector<float> standard_alibi_slopes(int64_t heads) {
  auto powers = [](int64_t n) {
    std::vector<float> s;
    for (int64_t h = 0; h < n; ++h) s.push_back(float(std::exp2(-8.0 * double(h + 1) / double(n))));
    return s;
  };
  int64_t p = 1;
  while (p * 2 <= heads) p *= 2;
  std::vector<float> slopes = powers(p);
  const std::vector<float> extra = powers(2 * p);
  for (int64_t h = 0; int64_t(slopes.size()) < heads; h += 2) slopes.push_back(extra[size_t(h)]);
  return slopes;
}

}  // namespace tileattn::cli
