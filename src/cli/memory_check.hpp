// Shapes whose buffers cannot fit in this machine's memory are usage errors,
// found before anything is allocated: an allocation past physical memory can
// succeed (overcommit) and the process then be killed when it touches the
// pages, with no message.
#pragma once

#include <string>

namespace tileattn::cli {

// Physical memory in bytes (0 where the system does not say).
double machine_memory_bytes();

// Throws UsageError("<what> needs X GiB of buffers, more than this machine's
// Y GiB of memory") when `bytes` exceeds machine_memory_bytes().
void require_memory(double bytes, const std::string& what);

}  // namespace tileattn::cli
