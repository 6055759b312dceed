// tileattn's parallel regions on the OpenMP runtime the process already
// loaded (PyTorch's libgomp): torch's threads poll for the next region for
// milliseconds after each of its operations, so tileattn's own pool worker
// would share a core with one of them right after a projection; on torch's
// threads the region starts at once (docs/python.md, "Threads").
//
// The runtime is found, never loaded: dlopen with RTLD_NOLOAD returns a
// library only if something in the process (torch) linked it, and the entry
// points are looked up through libtorch_cpu.so where torch is loaded, so they
// are the runtime torch runs on. GOMP_parallel is the entry point GCC emits
// for `#pragma omp parallel`; GNU libgomp, LLVM's libomp and Intel's
// libiomp5 all export it.
#include <dlfcn.h>
#include <pthread.h>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "tileattn/machine.hpp"

namespace tileattn::python {

namespace {

using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);
using OmpQuery = int (*)();

struct OpenMp {
  GompParallel parallel = nullptr;
  OmpQuery thread_num = nullptr, num_threads = nullptr, max_threads = nullptr;
  std::string name;
  ThreadRuntime runtime{nullptr, nullptr};
};

OpenMp& openmp() {
  static OpenMp o;
  return o;
}

struct Call {
  void (*fn)(void*, int, int);
  void* ctx;
};

void team_member(void* data) {
  const Call& c = *static_cast<const Call*>(data);
  const OpenMp& o = openmp();
  c.fn(c.ctx, o.thread_num(), o.num_threads());
}

// A team of at most the runtime's own thread count (torch.set_num_threads
// sets it): DataLoader workers set 1, and a forked child's libgomp cannot
// start the parent's team (a region of 2 threads there never returns); one
// thread runs here without a region.
void run_on_openmp(void (*fn)(void*, int, int), void* ctx, int threads) {
  const OpenMp& o = openmp();
  const int team = std::min(threads, std::max(1, o.max_threads()));
  if (team <= 1) return fn(ctx, 0, 1);
  Call call{fn, ctx};
  o.parallel(team_member, &call, unsigned(team), 0);
}

// The entry points, looked up through `handle` (dlsym searches the library
// and its dependencies: through libtorch_cpu.so, the OpenMP runtime torch
// itself links, whatever else is loaded). False if any is missing.
bool resolve(void* handle, OpenMp& o) {
  auto parallel = reinterpret_cast<GompParallel>(dlsym(handle, "GOMP_parallel"));
  auto thread_num = reinterpret_cast<OmpQuery>(dlsym(handle, "omp_get_thread_num"));
  auto num_threads = reinterpret_cast<OmpQuery>(dlsym(handle, "omp_get_num_threads"));
  auto max_threads = reinterpret_cast<OmpQuery>(dlsym(handle, "omp_get_max_threads"));
  if (!parallel || !thread_num || !num_threads || !max_threads) return false;
  Dl_info info{};
  const char* file = dladdr(reinterpret_cast<void*>(parallel), &info) && info.dli_fname ? info.dli_fname : "?";
  const char* slash = std::strrchr(file, '/');
  o.parallel = parallel;
  o.thread_num = thread_num;
  o.num_threads = num_threads;
  o.max_threads = max_threads;
  o.name = std::string("openmp (") + (slash ? slash + 1 : file) + ")";
  o.runtime = ThreadRuntime{o.name.c_str(), run_on_openmp};
  return true;
}

// A forked child cannot use the parent's OpenMP team: back to the pool
// there (whose workers did not survive the fork either; its caller then
// runs every item itself).
void pool_in_forked_child() { set_thread_runtime(nullptr); }

// Installs the OpenMP runtime of the process (torch's first, else one
// loaded by name) and returns its name, or nullopt when none is loaded.
// dlopen with RTLD_NOLOAD finds only libraries already loaded.
std::optional<std::string> use_openmp() {
  OpenMp& o = openmp();
  if (!o.parallel) {
    bool found = false;
    for (const char* library : {"libtorch_cpu.so", "libgomp.so.1", "libomp.so.5", "libomp.so", "libiomp5.so"}) {
      void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
      if (handle && resolve(handle, o)) {
        found = true;
        break;
      }
    }
    if (!found) return std::nullopt;
    pthread_atfork(nullptr, nullptr, pool_in_forked_child);
  }
  set_thread_runtime(&o.runtime);
  return o.name;
}

}  // namespace

void bind_threads(nb::module_& m) {
  m.def("use_openmp_runtime", &use_openmp,
        "run parallel regions on the OpenMP runtime already loaded in the process; its name, or None");
  m.def("use_thread_pool", [] { set_thread_runtime(nullptr); }, "run parallel regions on tileattn's own pool");
  m.def("thread_runtime", [] { return std::string(thread_runtime()); }, "'pool' or the OpenMP runtime in use");
  m.def(
      "thread_runtime_max_threads",
      [] {
        const OpenMp& o = openmp();
        return thread_runtime() == o.runtime.name && o.max_threads ? std::max(1, o.max_threads()) : 0;
      },
      "the OpenMP runtime's team limit for this thread (omp_get_max_threads) while it is in use, else 0");
}

}  // namespace tileattn::python
