// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0) for
// the command-line tool and the tests. Only what attention needs: little-endian
// float32 ('<f4'), float16 ('<f2') and booleans ('|b1', and '|u1' read as
// booleans), C order. Every malformed file is an Error whose message names it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileattn/types.hpp"

namespace tileattn::io {

enum class NpyType : int { f32 = 0, f16 = 1, boolean = 2 };

const char* npy_type_name(NpyType type);  // "float32", "float16", "bool"
std::size_t npy_type_size(NpyType type);

struct NpyArray {
  NpyType type = NpyType::f32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;  // C-order elements, little-endian

  int64_t elements() const;
  int64_t dim(std::size_t i) const { return shape.at(i); }
  // Views of the element storage (the type must match).
  const float* f32() const { return reinterpret_cast<const float*>(bytes.data()); }
  const uint16_t* f16() const { return reinterpret_cast<const uint16_t*>(bytes.data()); }
  const uint8_t* u8() const { return bytes.data(); }
};

// Parses a whole .npy file held in memory; `name` (the file name) starts every
// error message.
NpyArray parse_npy(const unsigned char* data, std::size_t size, const std::string& name);
NpyArray read_npy(const std::string& path);

// The bytes of a .npy file (version 1.0, or 2.0 when the header needs it).
// `data` holds product(shape) elements of `type`.
std::vector<unsigned char> encode_npy(NpyType type, const std::vector<int64_t>& shape,
                                      const void* data);

// Writes `path` atomically: the file appears complete or not at all.
void write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
               const void* data);

// The directory entry an output written to `path` replaces: `path` itself,
// or for a symbolic link the file it names (existing or not yet created).
std::string output_entry(const std::string& path);

// Two-phase writing for several outputs of one computation: stage() writes
// each file under a temporary name in its target's directory, commit()
// checks every target and only then renames them all into place.
// Files staged but never committed are removed by the destructor.
// A symbolic link is written through (its target, output_entry(), is
// replaced and the link stays); a target that is not a regular file
// (/dev/null, a FIFO, /dev/stdout on a pipe) is written in place at commit,
// first, since renaming over it would replace the node.
class StagedFiles {
 public:
  StagedFiles() = default;
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;
  ~StagedFiles();
  void stage(const std::string& path, const std::vector<unsigned char>& bytes);
  void commit();

 private:
  struct Entry {
    std::string temp, path;              // temp empty: written in place (not a regular file)
    std::vector<unsigned char> in_place;  // the bytes of such an entry
  };
  std::vector<Entry> entries_;
};

}  // namespace tileattn::io
