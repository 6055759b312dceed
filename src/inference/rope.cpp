#include "tileattn/rope.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "inference/rope_rotate.hpp"

namespace tileattn {

namespace {

void check_rope_arguments(double theta, int64_t rotary_dim) {
  if (!(theta > 0.0) || !std::isfinite(theta))
    throw Error("rope_tables: theta must be positive and finite, got " + std::to_string(theta));
  if (rotary_dim < 2 || rotary_dim % 2 != 0)
    throw Error("rope_tables: rotary_dim must be even and >= 2, got " + std::to_string(rotary_dim));
}

// rows x rotary_dim / 2 entries must fit a std::vector<float> (max_size()
// is below 2^61, so entry offsets also fit int64). Compared by division: the
// product overflows for sizes near 2^62. `rows_name` is the argument that
// gave the rows.
void check_table_size(const char* rows_name, int64_t rows, int64_t rotary_dim) {
  const uint64_t half = uint64_t(rotary_dim / 2), largest = std::vector<float>().max_size();
  if (rows > 0 && half > largest / uint64_t(rows))
    throw Error(std::string("rope_tables: ") + rows_name + " (" + std::to_string(rows) + ") x rotary_dim / 2 (" +
                std::to_string(half) + ") entries exceed the largest table a std::vector<float> holds (" +
                std::to_string(largest) + ")");
}

void fill_row(double theta, int64_t position, int64_t rotary_dim, float* cos_row, float* sin_row) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double frequency = std::pow(theta, -2.0 * double(i) / double(rotary_dim));
    const double angle = double(position) * frequency;
    cos_row[i] = float(std::cos(angle));
    sin_row[i] = float(std::sin(angle));
  }
}

}  // namespace

RopeTables rope_tables(double theta, int64_t max_positions, int64_t rotary_dim) {
  check_rope_arguments(theta, rotary_dim);
  if (max_positions < 0)
    throw Error("rope_tables: max_positions must be >= 0, got " + std::to_string(max_positions));
  check_table_size("max_positions", max_positions, rotary_dim);
  RopeTables t;
  t.positions = max_positions;
  t.rotary_dim = rotary_dim;
  const int64_t half = rotary_dim / 2;
  t.cos.resize(size_t(max_positions * half));
  t.sin.resize(size_t(max_positions * half));
  for (int64_t p = 0; p < max_positions; ++p)
    fill_row(theta, p, rotary_dim, t.cos.data() + p * half, t.sin.data() + p * half);
  return t;
}

RopeTables rope_tables(double theta, const std::vector<int64_t>& positions, int64_t rotary_dim) {
  check_rope_arguments(theta, rotary_dim);
  check_table_size("positions.size()", int64_t(positions.size()), rotary_dim);
  RopeTables t;
  t.positions = int64_t(positions.size());
  t.rotary_dim = rotary_dim;
  const int64_t half = rotary_dim / 2;
  t.cos.resize(positions.size() * size_t(half));
  t.sin.resize(positions.size() * size_t(half));
  for (size_t r = 0; r < positions.size(); ++r) {
    if (positions[r] < 0)
      throw Error("rope_tables: positions[" + std::to_string(r) + "] must be >= 0, got " +
                  std::to_string(positions[r]));
    fill_row(theta, positions[r], rotary_dim, t.cos.data() + int64_t(r) * half,
             t.sin.data() + int64_t(r) * half);
  }
  return t;
}

}  // namespace tileattn
