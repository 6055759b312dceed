// Runs one benchmark case as a child process and collects what it printed
// and its peak resident set (wait4's ru_maxrss: the child's own, whatever
// ran before it in the parent).
#pragma once

#include <string>
#include <vector>

namespace tileattn::cli {

struct ChildResult {
  int status = -1;         // exit status; 128 + signal when killed
  std::string out, err;    // everything written to stdout / stderr
  double peak_rss_mb = 0;  // the child's ru_maxrss, MiB
  double seconds = 0;      // wall time of the whole process
};

// Starts `argv[0]` (a path) with `argv`, waits for it. Throws Error when it
// cannot be started.
ChildResult run_child(const std::vector<std::string>& argv);

// Path of the running executable (/proc/self/exe), to start `tileattn bench`.
std::string self_executable();

}  // namespace tileattn::cli
