// A one-line progress bar on stderr for long benchmark sweeps:
//   [forward] case 12/48 ######....  D=128 causal N=4096 fp32 tileattn  elapsed 1m05s  left ~3m10s
// It draws only when stderr is a terminal and the caller did not ask for
// machine-readable output (--json), so logs and pipes stay clean.
#pragma once

#include <chrono>
#include <string>

namespace tileattn::cli {

class Progress {
 public:
  // `total_work`: the summed cost estimate of every step (any unit, e.g.
  // FLOPs plus a fixed cost per process), used for the time-left estimate.
  Progress(bool enabled, int total_steps, double total_work);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Step `index` (0-based) of stage `stage` starts; `what` names it.
  void begin(const std::string& stage, int index, const std::string& what);
  // The step that began last is done; it cost `work` of total_work.
  void end(double work);
  // Clears the line (also done by the destructor).
  void finish();

  bool enabled() const { return enabled_; }

  // "1m05s", "12s", "1h02m".
  static std::string duration(double seconds);
  // Whether stderr is a terminal (the default for `enabled`).
  static bool stderr_is_terminal();

 private:
  void draw();

  bool enabled_;
  int total_steps_;
  double total_work_, done_work_ = 0;
  std::string stage_, what_;
  int index_ = 0;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace tileattn::cli
