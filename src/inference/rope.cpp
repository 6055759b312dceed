#include "tileattn/rope.hpp"

#include <cmath>
#include <string>

#include "inference/rope_rotate.hpp"

namespace tileattn {

namespace {

void check_rope_arguments(double theta, int64_t rotary_dim) {
  if (!(theta > 0.0) || !std::isfinite(theta))
    throw Error("rope_tables: theta must be positive and finite, got " + std::to_string(theta));
  if (rotary_dim < 2 || rotary_dim % 2 != 0)
    throw Error("rope_tables: rotary_dim must be even and >= 2, got " + std::to_string(rotary_dim));
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
