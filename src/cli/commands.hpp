// The subcommands of `tileattn`. Each takes its own argv (argv[0] is the
// subcommand's name), returns the exit status, and may throw: main() turns
// every exception into one "tileattn: <message>" line and exit status 2.
#pragma once

namespace tileattn::cli {

int cmd_info(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_check(int argc, char** argv);
int cmd_tune(int argc, char** argv);
int cmd_decode(int argc, char** argv);

// Exit status for bad input and for features this build does not provide.
constexpr int kExitUsage = 2;

}  // namespace tileattn::cli
