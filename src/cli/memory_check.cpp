#include "cli/memory_check.hpp"

#include <unistd.h>

#include <cstdio>

#include "cli/args.hpp"

namespace tileattn::cli {

double machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? double(pages) * double(page_size) : 0.0;
}

void require_memory(double bytes, const std::string& what) {
  const double memory = machine_memory_bytes();
  if (memory <= 0 || bytes <= memory) return;
  char sizes[160];
  std::snprintf(sizes, sizeof sizes, " needs %.1f GiB of buffers, more than this machine's %.1f GiB of memory",
                bytes / double(1 << 30), memory / double(1 << 30));
  throw UsageError(what + sizes);
}

}  // namespace tileattn::cli
