// The result rows of a benchmark sweep: one per (implementation, case), the
// same columns from `tileattn bench --sweep` and bench/sweep_peers.py so that
// bench/report.py can merge them. Written as a JSON document
// {"schema", "command", "machine", "rows": [...]} or as CSV (the rows only).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace tileattn::cli {

// The columns, in order (docs/benchmarks.md describes each).
const std::vector<std::string>& sweep_columns();

// A row: column -> value already encoded as JSON (a number, a quoted string
// or null). Columns never set are null.
class SweepRow {
 public:
  void number(const std::string& column, double value);
  void text(const std::string& column, const std::string& value);
  std::string json() const;
  std::string csv() const;
  // The value of a column as plain text ("" for null).
  std::string get(const std::string& column) const;

 private:
  std::map<std::string, std::string> json_, plain_;
};

std::string sweep_csv_header();
// `machine`: a JSON object, written as is.
std::string sweep_document(const std::string& command, const std::string& machine,
                           const std::vector<SweepRow>& rows);

// Writes the document or the CSV (by path extension) to a temporary file and
// renames it over `path`, so a reader never sees half a file. Throws Error.
void write_sweep_file(const std::string& path, const std::string& command, const std::string& machine,
                      const std::vector<SweepRow>& rows);

// The fields of a flat JSON object as printed by Report::json(): strings
// unescaped, everything else as its JSON text. Throws Error when malformed.
std::map<std::string, std::string> parse_flat_json(const std::string& text);

}  // namespace tileattn::cli
