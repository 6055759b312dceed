// An ordered list of named results printed either as one JSON object (--json)
// or as aligned "name: value" lines for people.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tileattn::cli {

std::string json_quote(const std::string& text);
std::string json_number(double value);  // non-finite: null
std::string json_number_array(const std::vector<double>& values);

class Report {
 public:
  void number(const std::string& key, double value);
  void integer(const std::string& key, int64_t value);
  void boolean(const std::string& key, bool value);
  void text(const std::string& key, const std::string& value);
  void null(const std::string& key);
  // A value already encoded as JSON, and how to show it to people.
  void raw(const std::string& key, const std::string& json, const std::string& human);

  std::string json() const;
  std::string human() const;
  // Writes json() or human() to stdout.
  void print(bool as_json) const;

 private:
  struct Field {
    std::string key, json, human;
  };
  std::vector<Field> fields_;
};

}  // namespace tileattn::cli
