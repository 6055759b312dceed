// `tileattn`: the command-line face of the library. Dispatches to one
// subcommand and turns every error into one line on stderr and exit status 2.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "cli/commands.hpp"

namespace {

const char* const kUsage =
    "usage: tileattn <command> [flags]   (tileattn <command> --help for its flags)\n"
    "\n"
    "commands:\n"
    "  info    ISA, CPU features, caches, threads, tile shapes, measured FMA peak\n"
    "  run     attention on .npy files (--q --k --v --out ...)\n"
    "  bench   time the kernel against a naive OpenBLAS baseline\n"
    "  check   accuracy self-test against a float64 reference\n"
    "  tune    time candidate tile shapes and write the tune file\n"
    "  decode  KV-cache decode benchmark\n"
    "\n"
    "Every command exits 2 with one line on stderr on bad input.\n";

struct Command {
  const char* name;
  int (*run)(int, char**);
};

const Command kCommands[] = {
    {"info", tileattn::cli::cmd_info},   {"run", tileattn::cli::cmd_run},
    {"bench", tileattn::cli::cmd_bench}, {"check", tileattn::cli::cmd_check},
    {"tune", tileattn::cli::cmd_tune},   {"decode", tileattn::cli::cmd_decode},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return tileattn::cli::kExitUsage;
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      const int status = c.run(argc - 1, argv + 1);
      // A report that could not be written (stdout on a full disk, /dev/full)
      // is not a success: a script would read nothing.
      if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        std::fprintf(stderr, "tileattn: stdout: write failed\n");
        return tileattn::cli::kExitUsage;
      }
      return status;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "tileattn: out of memory\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tileattn: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "tileattn: unknown error\n");
    }
    return tileattn::cli::kExitUsage;
  }
  std::fprintf(stderr, "tileattn: unknown command '%s' (see tileattn --help)\n", argv[1]);
  return tileattn::cli::kExitUsage;
}
