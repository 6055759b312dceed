// tileattn's parallel regions on the OpenMP runtime the process already
// loaded (PyTorch's libgomp): torch's threads poll for the next region for
// milliseconds after each of its operations, so tileattn's own pool worker
// would share a core with one of them right after a projection; on torch's
// threads the region starts at once (docs/python.md, "Threads").
//
// The runtime is found, never loaded: dlopen with RTLD_NOLOAD returns a
// library only if something in the process (torch) linked it. GOMP_parallel
// is the entry point GCC emits for `#pragma omp parallel`; GNU libgomp,
// LLVM's libomp and Intel's libiomp5 all export it.
#include <dlfcn.h>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

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
  OmpQuery thread_num = nullptr, num_threads = nullptr;
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

void run_on_openmp(void (*fn)(void*, int, int), void* ctx, int threads) {
  Call call{fn, ctx};
  openmp().parallel(team_member, &call, unsigned(threads), 0);
}

// The name of the loaded OpenMP runtime installed, or nullopt when the
// process has none loaded.
std::optional<std::string> use_openmp() {
  OpenMp& o = openmp();
  if (!o.parallel) {
    for (const char* library : {"libgomp.so.1", "libomp.so", "libiomp5.so"}) {
      void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
      if (!handle) continue;
      auto parallel = reinterpret_cast<GompParallel>(dlsym(handle, "GOMP_parallel"));
      auto thread_num = reinterpret_cast<OmpQuery>(dlsym(handle, "omp_get_thread_num"));
      auto num_threads = reinterpret_cast<OmpQuery>(dlsym(handle, "omp_get_num_threads"));
      if (!parallel || !thread_num || !num_threads) continue;  // the handle stays open: it was loaded anyway
      o.parallel = parallel;
      o.thread_num = thread_num;
      o.num_threads = num_threads;
      o.name = std::string("openmp (") + library + ")";
      o.runtime = ThreadRuntime{o.name.c_str(), run_on_openmp};
      break;
    }
    if (!o.parallel) return std::nullopt;
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
}

}  // namespace tileattn::python
