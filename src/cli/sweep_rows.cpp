#include "cli/sweep_rows.hpp"

#include <cstdio>
#include <fstream>

#include "cli/report.hpp"
#include "tileattn/types.hpp"

namespace tileattn::cli {

const std::vector<std::string>& sweep_columns() {
  static const std::vector<std::string> columns = {
      "impl",  "label",   "status",   "reason",  "pass",         "seq",   "q_len",
      "kv_len", "dim",    "mask",     "window_left", "window_right", "dtype", "batch",
      "heads", "kv_heads", "threads", "reps",    "ms",           "gflops", "fraction_of_peak",
      "peak_gflops", "peak_rss_mb", "flops", "detail"};
  return columns;
}

void SweepRow::number(const std::string& column, double value) {
  json_[column] = json_number(value);
  plain_[column] = json_[column] == "null" ? "" : json_[column];
}

void SweepRow::text(const std::string& column, const std::string& value) {
  json_[column] = json_quote(value);
  plain_[column] = value;
}

std::string SweepRow::get(const std::string& column) const {
  auto it = plain_.find(column);
  return it == plain_.end() ? "" : it->second;
}

std::string SweepRow::json() const {
  std::string out = "{";
  for (const std::string& column : sweep_columns()) {
    auto it = json_.find(column);
    out += (out.size() > 1 ? ", " : "") + json_quote(column) + ": " + (it == json_.end() ? "null" : it->second);
  }
  return out + "}";
}

namespace {

// RFC 4180: quote fields holding a comma, quote or line break; double quotes.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string SweepRow::csv() const {
  std::string out;
  for (const std::string& column : sweep_columns()) {
    if (!out.empty()) out += ',';
    out += csv_field(get(column));
  }
  return out;
}

std::string sweep_csv_header() {
  std::string out;
  for (const std::string& column : sweep_columns()) out += (out.empty() ? "" : ",") + column;
  return out;
}

std::string sweep_document(const std::string& command, const std::string& machine,
                           const std::vector<SweepRow>& rows) {
  std::string out = "{\"schema\": \"tileattn-bench-sweep/1\", \"command\": " + json_quote(command) +
                    ", \"machine\": " + machine + ", \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) out += std::string(i ? ",\n  " : "\n  ") + rows[i].json();
  return out + "\n]}\n";
}

void write_sweep_file(const std::string& path, const std::string& command, const std::string& machine,
                      const std::vector<SweepRow>& rows) {
  std::string text;
  if (ends_with(path, ".csv")) {
    text = sweep_csv_header() + "\n";
    for (const SweepRow& row : rows) text += row.csv() + "\n";
  } else {
    text = sweep_document(command, machine, rows);
  }
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.good()) throw Error("--out: cannot write '" + partial + "'");
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) throw Error("--out: cannot rename onto '" + path + "'");
}

std::map<std::string, std::string> parse_flat_json(const std::string& text) {
  std::map<std::string, std::string> fields;
  std::size_t i = 0;
  auto fail = [&](const char* what) { throw Error(std::string("bench output is not a flat JSON object: ") + what); };
  auto space = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r')) ++i;
  };
  auto string = [&]() {
    if (i >= text.size() || text[i] != '"') fail("expected a string");
    std::string out;
    for (++i; i < text.size(); ++i) {
      const char c = text[i];
      if (c == '"') return ++i, out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (++i >= text.size()) break;
      const char e = text[i];
      if (e == 'u' && i + 4 < text.size()) {
        out += char(std::stoi(text.substr(i + 1, 4), nullptr, 16));  // only control characters are escaped
        i += 4;
      } else {
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      }
    }
    fail("unterminated string");
    return out;
  };
  space();
  if (i >= text.size() || text[i++] != '{') fail("expected '{'");
  space();
  if (i < text.size() && text[i] == '}') return fields;
  for (;;) {
    space();
    const std::string key = string();
    space();
    if (i >= text.size() || text[i++] != ':') fail("expected ':'");
    space();
    if (i < text.size() && text[i] == '"') {
      fields[key] = string();
    } else {
      // A number, true/false/null or an array of numbers: up to the next
      // top-level ',' or '}'.
      const std::size_t start = i;
      int depth = 0;
      while (i < text.size() && (depth > 0 || (text[i] != ',' && text[i] != '}'))) {
        depth += text[i] == '[' ? 1 : text[i] == ']' ? -1 : 0;
        ++i;
      }
      std::size_t end = i;
      while (end > start && text[end - 1] == ' ') --end;
      if (end == start) fail("empty value");
      fields[key] = text.substr(start, end - start);
    }
    space();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    if (i < text.size() && text[i] == '}') return fields;
    fail("expected ',' or '}'");
  }
}

}  // namespace tileattn::cli
