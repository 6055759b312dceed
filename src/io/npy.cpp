#include "io/npy.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

namespace tileattn::io {

namespace {

constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
// numpy itself refuses headers over 10000 bytes by default; allow more, but
// bound it so a lying length cannot make us scan gigabytes.
constexpr std::size_t kMaxHeaderBytes = 1 << 20;
constexpr std::size_t kMaxDims = 32;

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw Error(name + ": " + what);
}

// A cursor over the header's Python dict literal, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& name) : text_(text), name_(name) {}

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r'))
      ++pos_;
  }
  bool peek(char c) {
    skip_space();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  void expect(char c) {
    if (!peek(c)) bad(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool accept(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  std::string string_literal() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) bad("expected a string");
    const char quote = text_[pos_++];
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string::npos) bad("unterminated string");
    std::string s = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  bool boolean_literal() {
    skip_space();
    if (text_.compare(pos_, 4, "True") == 0) return pos_ += 4, true;
    if (text_.compare(pos_, 5, "False") == 0) return pos_ += 5, false;
    bad("expected True or False");
  }
  int64_t size_literal() {
    skip_space();
    const std::size_t start = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (__builtin_mul_overflow(value, int64_t{10}, &value) ||
          __builtin_add_overflow(value, int64_t(text_[pos_] - '0'), &value))
        fail(name_, "shape entry overflows int64");
      ++pos_;
    }
    if (pos_ == start) bad("expected a non-negative integer in 'shape'");
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long suffix
    return value;
  }
  std::vector<int64_t> shape_literal() {
    std::vector<int64_t> shape;
    expect('(');
    while (!accept(')')) {
      if (shape.size() == kMaxDims) fail(name_, "shape has more than 32 dimensions");
      shape.push_back(size_literal());
      if (!accept(',')) {
        expect(')');
        // "(5)" is just 5 in Python, not a tuple; numpy never writes it.
        if (shape.size() == 1) bad("shape must be a tuple");
        break;
      }
    }
    return shape;
  }
  bool at_end() {
    skip_space();
    return pos_ == text_.size();
  }
  [[noreturn]] void bad(const std::string& what) {
    fail(name_, "malformed .npy header (" + what + " at offset " + std::to_string(pos_) + ")");
  }

 private:
  const std::string& text_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

NpyType parse_descr(const std::string& descr, const std::string& name) {
  if (descr == "<f4") return NpyType::f32;
  if (descr == "<f2") return NpyType::f16;
  if (descr == "|b1" || descr == "|u1") return NpyType::boolean;
  fail(name, "unsupported dtype '" + descr +
                 "' (expected float32 '<f4', float16 '<f2' or bool '|b1')");
}

std::string descr_of(NpyType type) {
  switch (type) {
    case NpyType::f32: return "<f4";
    case NpyType::f16: return "<f2";
    case NpyType::boolean: return "|b1";
  }
  return "?";
}

}  // namespace

const char* npy_type_name(NpyType type) {
  switch (type) {
    case NpyType::f32: return "float32";
    case NpyType::f16: return "float16";
    case NpyType::boolean: return "bool";
  }
  return "unknown";
}

std::size_t npy_type_size(NpyType type) { return type == NpyType::f32 ? 4 : type == NpyType::f16 ? 2 : 1; }

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked when parsed or encoded
  return n;
}

NpyArray parse_npy(const unsigned char* data, std::size_t size, const std::string& name) {
  if (size < 10 || std::memcmp(data, kMagic, sizeof kMagic) != 0) {
    // size 0 may come with a null pointer, which memcmp must not see.
    if (size < sizeof kMagic && (size == 0 || std::memcmp(data, kMagic, size) == 0))
      fail(name, "truncated .npy file (" + std::to_string(size) + " bytes)");
    fail(name, "not a .npy file (bad magic string)");
  }
  const int major = data[6], minor = data[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    fail(name, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor));
  std::size_t prefix = 10;
  std::size_t header_len = std::size_t(data[8]) | std::size_t(data[9]) << 8;
  if (major >= 2) {
    if (size < 12) fail(name, "truncated .npy file (" + std::to_string(size) + " bytes)");
    prefix = 12;
    header_len = header_len | std::size_t(data[10]) << 16 | std::size_t(data[11]) << 24;
  }
  if (header_len > kMaxHeaderBytes)
    fail(name, "header length " + std::to_string(header_len) + " exceeds the 1 MiB limit");
  if (header_len > size - prefix)
    fail(name, "truncated .npy file: header claims " + std::to_string(header_len) + " bytes, " +
                   std::to_string(size - prefix) + " remain");
  const std::string header(reinterpret_cast<const char*>(data + prefix), header_len);
  if (header.find('\0') != std::string::npos) fail(name, "malformed .npy header (NUL byte)");

  HeaderParser parser(header, name);
  NpyArray array;
  bool have_descr = false, have_order = false, have_shape = false;
  parser.expect('{');
  while (!parser.accept('}')) {
    const std::string key = parser.string_literal();
    parser.expect(':');
    if (key == "descr" && !have_descr) {
      array.type = parse_descr(parser.string_literal(), name);
      have_descr = true;
    } else if (key == "fortran_order" && !have_order) {
      if (parser.boolean_literal())
        fail(name, "fortran_order=True arrays are not supported (save a C-contiguous array)");
      have_order = true;
    } else if (key == "shape" && !have_shape) {
      array.shape = parser.shape_literal();
      have_shape = true;
    } else {
      parser.bad("unexpected or repeated key '" + key + "'");
    }
    if (!parser.accept(',')) {
      parser.expect('}');
      break;
    }
  }
  if (!parser.at_end()) parser.bad("text after the dictionary");
  if (!have_descr || !have_order || !have_shape)
    fail(name, "malformed .npy header (needs 'descr', 'fortran_order' and 'shape')");

  int64_t elements = 1, bytes = 0;
  for (int64_t d : array.shape)
    if (__builtin_mul_overflow(elements, d, &elements)) fail(name, "shape overflows int64");
  if (__builtin_mul_overflow(elements, int64_t(npy_type_size(array.type)), &bytes))
    fail(name, "data size overflows int64");
  const std::size_t available = size - prefix - header_len;
  if (uint64_t(bytes) > available)
    fail(name, "truncated .npy file: shape needs " + std::to_string(bytes) + " data bytes, " +
                   std::to_string(available) + " present");
  if (uint64_t(bytes) < available)
    fail(name, "size mismatch: shape needs " + std::to_string(bytes) + " data bytes, file has " +
                   std::to_string(available));
  array.bytes.assign(data + prefix + header_len, data + size);
  return array;
}

NpyArray read_npy(const std::string& path) {
  // Only regular files: a FIFO would block on open and /dev/zero would grow
  // memory until it runs out, before the header could be checked.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  if (!S_ISREG(info.st_mode)) fail(path, "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  std::vector<unsigned char> bytes(static_cast<std::size_t>(info.st_size));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (in.gcount() != static_cast<std::streamsize>(bytes.size()) || in.bad())
    fail(path, "read error (file shorter than its size, or changed while reading)");
  return parse_npy(bytes.data(), bytes.size(), path);
}

std::vector<unsigned char> encode_npy(NpyType type, const std::vector<int64_t>& shape,
                                      const void* data) {
  int64_t elements = 1, data_bytes = 0;
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0) throw Error("npy: negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(elements, d, &elements)) throw Error("npy: shape overflows int64");
    dims += (i ? ", " : "") + std::to_string(d);
  }
  if (shape.size() == 1) dims += ",";  // a Python 1-tuple: "(5,)"
  if (__builtin_mul_overflow(elements, int64_t(npy_type_size(type)), &data_bytes))
    throw Error("npy: data size overflows int64");
  std::string header = "{'descr': '" + descr_of(type) + "', 'fortran_order': False, 'shape': (" +
                       dims + "), }";
  // Pad with spaces and a final newline so the data starts 64-byte aligned.
  const bool v2 = header.size() + 1 + 10 > 65535;
  const std::size_t prefix = v2 ? 12 : 10;
  const std::size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  std::vector<unsigned char> out(kMagic, kMagic + sizeof kMagic);
  out.push_back(v2 ? 2 : 1);
  out.push_back(0);
  const std::size_t len = header.size();
  out.push_back(uint8_t(len));
  out.push_back(uint8_t(len >> 8));
  if (v2) {
    out.push_back(uint8_t(len >> 16));
    out.push_back(uint8_t(len >> 24));
  }
  out.insert(out.end(), header.begin(), header.end());
  const auto* p = static_cast<const unsigned char*>(data);
  out.insert(out.end(), p, p + data_bytes);
  return out;
}

void write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
               const void* data) {
  StagedFiles files;
  files.stage(path, encode_npy(type, shape, data));
  files.commit();
}

StagedFiles::~StagedFiles() {
  for (const Entry& e : entries_)
    if (!e.temp.empty()) std::remove(e.temp.c_str());
}

namespace {

// The directory part of `path` with its slash ("" for a bare name).
std::string directory_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

// Why rename(temp, path) would fail, or "" when nothing is known to stop it.
// `temp` already exists in path's directory, so that directory exists and is
// writable; what is left is the entry at `path` itself.
std::string rename_obstacle(const std::string& temp, const std::string& path) {
  struct stat target, staged, dir;
  if (::lstat(path.c_str(), &target) != 0)
    return errno == ENOENT ? "" : std::strerror(errno);  // ENAMETOOLONG, ELOOP, EACCES...
  if (S_ISDIR(target.st_mode)) return "is a directory";
  if (::stat(temp.c_str(), &staged) == 0 && staged.st_dev != target.st_dev)
    return "is a mount point";  // rename fails with EBUSY or EXDEV
  // Sticky directory (/tmp): only the owner of the file or of the directory
  // (or root) may replace the file.
  const std::string d = directory_of(path);
  if (::stat(d.empty() ? "." : d.c_str(), &dir) == 0 && (dir.st_mode & S_ISVTX) && ::geteuid() != 0 &&
      target.st_uid != ::geteuid() && dir.st_uid != ::geteuid())
    return "owned by another user in a sticky directory";
  return "";
}

}  // namespace

std::string output_entry(const std::string& given) {
  struct stat st;
  if (::lstat(given.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return given;
  if (char* real = ::realpath(given.c_str(), nullptr)) {
    std::string path = real;
    std::free(real);
    return path;
  }
  // A link whose target does not exist yet: the file it names is created
  // (one level: a relative target is relative to the link's directory).
  std::string target(4096, '\0');
  const ssize_t n = ::readlink(given.c_str(), target.data(), target.size());
  if (n <= 0 || std::size_t(n) >= target.size()) return given;
  target.resize(std::size_t(n));
  return target[0] == '/' ? target : directory_of(given) + target;
}

void StagedFiles::stage(const std::string& given, const std::vector<unsigned char>& bytes) {
  // A device, FIFO or socket, also behind a link (/dev/stdout to a pipe), is
  // written in place at commit: rename() would replace /dev/null with a
  // regular file.
  struct stat st;
  if (::stat(given.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    entries_.push_back({"", given, bytes});
    return;
  }
  // A symbolic link names the file to replace: rename() over the link itself
  // would replace the link with a regular file.
  const std::string path = output_entry(given);
  // Same directory as the target, so that rename() is atomic; a short name of
  // its own, so that a target name near NAME_MAX (255) still gets one. The
  // counter is per process (several StagedFiles may stage into one
  // directory); "x" (O_EXCL) never reuses a file left by a crashed process.
  static std::atomic<uint64_t> counter{0};
  std::string temp;
  std::FILE* f = nullptr;
  do {
    temp = directory_of(path) + ".tileattn." + std::to_string(::getpid()) + "." + std::to_string(counter++) +
           ".tmp";
    f = std::fopen(temp.c_str(), "wbx");
  } while (!f && errno == EEXIST);
  if (!f) fail(path, std::string("cannot write (") + std::strerror(errno) + ")");
  entries_.push_back({temp, path, {}});
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) fail(path, "write failed (disk full?)");
}

void StagedFiles::commit() {
  // Every target is checked before the first rename, so that an error we can
  // foresee (a directory in the way, a name too long) leaves every target as
  // it was; the destructor then removes the staged files. What stays
  // non-atomic: a crash, or a rename failing for a reason not checked here,
  // between two renames leaves the earlier targets replaced.
  for (const Entry& e : entries_)
    if (!e.temp.empty())
      if (const std::string why = rename_obstacle(e.temp, e.path); !why.empty())
        fail(e.path, "cannot write (" + why + ")");
  // Targets that are not regular files, in place and first: a write that
  // fails there (/dev/full) comes before any rename.
  for (Entry& e : entries_) {
    if (!e.temp.empty()) continue;
    std::FILE* f = std::fopen(e.path.c_str(), "wb");
    if (!f) fail(e.path, std::string("cannot write (") + std::strerror(errno) + ")");
    int error = 0;
    if (std::fwrite(e.in_place.data(), 1, e.in_place.size(), f) != e.in_place.size() || std::fflush(f) != 0)
      error = errno ? errno : EIO;
    if (std::fclose(f) != 0 && error == 0) error = errno ? errno : EIO;
    if (error != 0) fail(e.path, std::string("write failed (") + std::strerror(error) + ")");
  }
  std::erase_if(entries_, [](const Entry& e) { return e.temp.empty(); });
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (std::rename(entries_[i].temp.c_str(), entries_[i].path.c_str()) != 0) {
      const std::string reason = std::strerror(errno);
      entries_.erase(entries_.begin(), entries_.begin() + std::ptrdiff_t(i));
      fail(entries_.front().path, "cannot rename into place (" + reason + ")");
    }
  }
  entries_.clear();
}

}  // namespace tileattn::io
