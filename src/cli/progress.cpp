#include "cli/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace tileattn::cli {

namespace {
constexpr int kBarWidth = 20;
constexpr std::size_t kLineWidth = 118;  // fits a 120-column terminal without wrapping
}  // namespace

Progress::Progress(bool enabled, int total_steps, double total_work)
    : enabled_(enabled), total_steps_(total_steps), total_work_(std::max(total_work, 1e-30)) {}

Progress::~Progress() { finish(); }

bool Progress::stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

std::string Progress::duration(double seconds) {
  const long s = long(std::max(0.0, seconds) + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

void Progress::begin(const std::string& stage, int index, const std::string& what) {
  stage_ = stage;
  index_ = index;
  what_ = what;
  draw();
}

void Progress::end(double work) {
  done_work_ += work;
  draw();
}

void Progress::draw() {
  if (!enabled_) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double fraction = std::min(1.0, done_work_ / total_work_);
  const int filled = int(fraction * kBarWidth + 0.5);
  std::string line = "[" + stage_ + "] case " + std::to_string(index_ + 1) + "/" +
                     std::to_string(total_steps_) + " " + std::string(size_t(filled), '#') +
                     std::string(size_t(kBarWidth - filled), '.') + "  " + what_ + "  elapsed " +
                     duration(elapsed);
  // Time left: the elapsed time scaled by the work still to do (no estimate
  // before the first step has finished).
  if (done_work_ > 0) line += "  left ~" + duration(elapsed * (total_work_ - done_work_) / done_work_);
  if (line.size() > kLineWidth) line.resize(kLineWidth);
  // \r and clear-to-end-of-line: the bar redraws in place.
  std::fprintf(stderr, "\r%s\033[K", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace tileattn::cli
