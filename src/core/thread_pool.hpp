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

// Whether a pool worker sleeps now: a parallel region would wake it, which
// takes ~40-100 us (thread_pool.cpp), instead of finding it polling after a
// region that ended within TILEATTN_SPIN_US.
// False under another thread runtime (set_thread_runtime, machine.hpp): its
// threads' state is unknown.
bool pool_workers_asleep();

// How long a worker polls for the next region before it sleeps, in ns
// (TILEATTN_SPIN_US).
int64_t spin_window_ns();

// Threads the hardware offers (at least 1).
int hardware_threads();

// Test hook for the thread-determinism tests (tests/core/*threads*): while on,
// run_forward_plan ignores its inline threshold, and parallel_for waits for
// every helper it asked for to join and deals the items round-robin (item i
// to thread i % threads), so that each thread given an item runs it, however
// small the call. Results are the same either way: each item is computed
// whole by one thread. Not for production use; not thread-safe to toggle
// while calls run.
void set_every_thread_runs_items(bool on);
bool every_thread_runs_items();

// What the parallel regions since reset_thread_census() used: the most
// distinct threads that ran items in one region, and the most items one
// region had. Counted only while every_thread_runs_items() is on.
struct ThreadCensus {
  int max_threads = 0;
  int64_t max_items = 0;
};
void reset_thread_census();
ThreadCensus thread_census();

}  // namespace tileattn::detail
