// `tileattn decode`: the KV-cache decode benchmark. The inference work
// replaces this file; until then the command says so and exits 2.
#include <cstdio>

#include "cli/commands.hpp"

namespace tileattn::cli {

int cmd_decode(int argc, char** argv) {
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "tileattn: decode is not supported yet\n");
  return kExitUsage;
}

}  // namespace tileattn::cli
