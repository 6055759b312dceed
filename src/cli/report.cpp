#include "cli/report.hpp"

#include <cmath>
#include <cstdio>

namespace tileattn::cli {

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  return buf;
}

std::string json_number_array(const std::vector<double>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + json_number(values[i]);
  return out + "]";
}

void Report::number(const std::string& key, double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", value);
  fields_.push_back({key, json_number(value), std::isfinite(value) ? buf : "n/a"});
}
void Report::integer(const std::string& key, int64_t value) {
  fields_.push_back({key, std::to_string(value), std::to_string(value)});
}
void Report::boolean(const std::string& key, bool value) {
  fields_.push_back({key, value ? "true" : "false", value ? "yes" : "no"});
}
void Report::text(const std::string& key, const std::string& value) {
  fields_.push_back({key, json_quote(value), value});
}
void Report::null(const std::string& key) { fields_.push_back({key, "null", "n/a"}); }
void Report::raw(const std::string& key, const std::string& json, const std::string& human) {
  fields_.push_back({key, json, human});
}

std::string Report::json() const {
  std::string out = "{";
  for (std::size_t i = 0; i < fields_.size(); ++i)
    out += (i ? ", " : "") + json_quote(fields_[i].key) + ": " + fields_[i].json;
  return out + "}";
}

std::string Report::human() const {
  std::size_t width = 0;
  for (const Field& f : fields_) width = std::max(width, f.key.size());
  std::string out;
  for (const Field& f : fields_)
    out += f.key + ":" + std::string(width + 1 - f.key.size(), ' ') + f.human + "\n";
  return out;
}

void Report::print(bool as_json) const {
  const std::string text = as_json ? json() + "\n" : human();
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

}  // namespace tileattn::cli
