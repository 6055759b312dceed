// A small persistent thread pool. Chosen over OpenMP so that ThreadSanitizer
// understands every synchronization (libgomp is opaque to it) and so that
// concurrent callers from several application threads never deadlock: when
// the pool is busy, the caller simply runs its items itself. Workers poll for
// the next region for TILEATTN_SPIN_US (default 50) microseconds before
// sleeping, the caller 10 times as long for its helpers to finish
// (thread_pool.cpp has the measurements).
#pragma once

#include <cstdint>
#include <functional>

namespace tileattn::detail {

// Runs body(item, worker) for every item in [0, count), on at most `threads`
// threads (the calling thread is worker 0). Items are handed out in index
// order through an atomic counter. Returns after every item has finished;
// rethrows the first exception a body threw.
void parallel_for(int64_t count, int threads, const std::function<void(int64_t, int)>& body);

// Threads the hardware offers (at least 1).
int hardware_threads();

}  // namespace tileattn::detail
