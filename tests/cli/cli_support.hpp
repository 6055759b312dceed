// Helpers for the CLI tests: run the `tileattn` binary, a scratch directory,
// .npy files of a testing::CaseData, and a small JSON parser to check output.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "io/npy.hpp"
#include "testing/problem_case.hpp"

namespace tileattn::cli_test {

struct Result {
  int status = -1;
  std::string out, err;
  std::vector<std::string> err_lines() const {
    std::vector<std::string> lines;
    std::istringstream in(err);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh directory, removed with its files at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "tileattn_cli_XXXXXX";
    path_ = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  // Every entry, hidden ones too: staged outputs are hidden (".tileattn.*.tmp").
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
      closedir(d);
    }
    std::sort(names.begin(), names.end());  // readdir's order is the file system's
    return names;
  }

 private:
  std::string path_;
};

// Runs `tileattn <args>` (args are passed to the shell as written).
inline Result run_cli(const std::string& args, const TempDir& dir) {
  const std::string out = dir / ".stdout", err = dir / ".stderr";
  const std::string command = std::string("'") + TILEATTN_CLI + "' " + args + " >'" + out + "' 2>'" + err + "'";
  Result r;
  const int raw = std::system(command.c_str());
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.out = slurp(out);
  r.err = slurp(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

// Shape of a q-like ([heads]) or k-like tensor file in the case's layout,
// `dim` wide (0: the case's head_dim; V and O take its V head dim).
inline std::vector<int64_t> file_shape(const testing::Case& c, int64_t heads, int64_t rows, int64_t dim = 0) {
  const int64_t d = dim > 0 ? dim : c.head_dim;
  return c.layout == Layout::bhsd ? std::vector<int64_t>{c.batch, heads, rows, d}
                                  : std::vector<int64_t>{c.batch, rows, heads, d};
}
inline int64_t value_dim(const testing::Case& c) { return c.v_head_dim > 0 ? c.v_head_dim : c.head_dim; }

// Writes q/k/v of a (contiguous, non-varlen) case as float32 or float16 files.
// bf16 cases are written as float32 (exact) for `--dtype bf16`.
inline void write_inputs(const testing::CaseData& d, const TempDir& dir) {
  const testing::Case& c = d.c;
  const auto qs = file_shape(c, c.heads, c.seqlen_q), ks = file_shape(c, c.kv_heads, c.seqlen_k);
  auto write = [&](const std::string& name, const std::vector<float>& f32, const std::vector<uint16_t>& b16,
                   const std::vector<int64_t>& shape) {
    if (c.dtype == DType::f32) {
      io::write_npy(dir / name, io::NpyType::f32, shape, f32.data());
    } else if (c.dtype == DType::f16) {
      io::write_npy(dir / name, io::NpyType::f16, shape, b16.data());
    } else {
      std::vector<float> widened(b16.size());
      for (size_t i = 0; i < b16.size(); ++i) {
        const uint32_t bits = uint32_t(b16[i]) << 16;
        std::memcpy(&widened[i], &bits, 4);
      }
      io::write_npy(dir / name, io::NpyType::f32, shape, widened.data());
    }
  };
  write("q.npy", d.q32, d.q16, qs);
  write("k.npy", d.k32, d.k16, ks);
  write("v.npy", d.v32, d.v16, file_shape(c, c.kv_heads, c.seqlen_k, value_dim(c)));
}

// A minimal JSON parser: enough to check that output is one valid object and
// to read its fields.
struct Json {
  enum Type { null, boolean, number, string, array, object } type = null;
  bool flag = false;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  // An object's members in order: keys[i] names fields[i]. Two vectors, not
  // one of pair<string, Json>: a pair may not hold the still-incomplete Json
  // (clang with libstdc++ rejects it).
  std::vector<std::string> keys;
  std::vector<Json> fields;
  const Json* get(const std::string& key) const {
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &fields[i];
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : t_(text) {}
  // Whole text must be one value (surrounding whitespace allowed).
  bool parse(Json& out) {
    if (!value(out)) return false;
    space();
    return i_ == t_.size();
  }

 private:
  void space() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  bool lit(const char* word) {
    const std::string w = word;
    if (t_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }
  bool str(std::string& out) {
    if (i_ >= t_.size() || t_[i_] != '"') return false;
    for (++i_; i_ < t_.size(); ++i_) {
      const char c = t_[i_];
      if (c == '"') return ++i_, true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\') {
        if (++i_ >= t_.size()) return false;
        const char e = t_[i_];
        if (e == 'u') {
          if (i_ + 4 >= t_.size()) return false;
          out += '?';
          i_ += 4;
        } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
          return false;
        } else {
          out += e;
        }
      } else {
        out += c;
      }
    }
    return false;
  }
  bool value(Json& v) {
    space();
    if (i_ >= t_.size()) return false;
    const char c = t_[i_];
    if (c == '{') {
      v.type = Json::object;
      ++i_;
      space();
      if (i_ < t_.size() && t_[i_] == '}') return ++i_, true;
      for (;;) {
        space();
        std::string key;
        if (!str(key)) return false;
        space();
        if (i_ >= t_.size() || t_[i_++] != ':') return false;
        Json item;
        if (!value(item)) return false;
        v.keys.push_back(key);
        v.fields.push_back(item);
        space();
        if (i_ < t_.size() && t_[i_] == ',') { ++i_; continue; }
        if (i_ < t_.size() && t_[i_] == '}') return ++i_, true;
        return false;
      }
    }
    if (c == '[') {
      v.type = Json::array;
      ++i_;
      space();
      if (i_ < t_.size() && t_[i_] == ']') return ++i_, true;
      for (;;) {
        Json item;
        if (!value(item)) return false;
        v.items.push_back(item);
        space();
        if (i_ < t_.size() && t_[i_] == ',') { ++i_; continue; }
        if (i_ < t_.size() && t_[i_] == ']') return ++i_, true;
        return false;
      }
    }
    if (c == '"') return v.type = Json::string, str(v.str);
    if (lit("true")) return v.type = Json::boolean, v.flag = true, true;
    if (lit("false")) return v.type = Json::boolean, true;
    if (lit("null")) return v.type = Json::null, true;
    // Numbers: JSON grammar (no NaN, no inf, no leading '+').
    const std::size_t start = i_;
    if (t_[i_] == '-') ++i_;
    if (i_ >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[i_]))) return false;
    while (i_ < t_.size() && (std::isdigit(static_cast<unsigned char>(t_[i_])) || std::string(".eE+-").find(t_[i_]) != std::string::npos)) ++i_;
    char* end = nullptr;
    const std::string number = t_.substr(start, i_ - start);
    v.num = std::strtod(number.c_str(), &end);
    v.type = Json::number;
    return end && *end == '\0';
  }
  const std::string& t_;
  std::size_t i_ = 0;
};

}  // namespace tileattn::cli_test
