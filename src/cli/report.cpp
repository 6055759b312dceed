#include "cli/report.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>

namespace tileattn::cli {

namespace {

// Length of the well-formed UTF-8 sequence at text[i] (1..4), or 0 for a
// byte that does not start one (stray continuation bytes, overlong forms,
// surrogates, code points past U+10FFFF, a sequence cut short).
std::size_t utf8_sequence_length(const std::string& text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  std::size_t n;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1Fu;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0Fu;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07u;
  else return 0;
  if (i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0u) != 0x80u) return 0;
    cp = cp << 6 | (byte(i + k) & 0x3Fu);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  return n;
}

}  // namespace

// JSON text is UTF-8 (RFC 8259): well-formed sequences pass through, and a
// byte that is not part of one (a file name or argument in another
// encoding) becomes U+FFFD, so that every JSON reader can parse the report.
std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
      ++i;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
    } else if (const std::size_t n = utf8_sequence_length(text, i); n > 0) {
      out.append(text, i, n);
      i += n;
    } else {
      out += "\\ufffd";
      ++i;
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
