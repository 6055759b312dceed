// The extension module: the operator bindings and the mapping of library
// exceptions to Python ones (Error -> ValueError, NotSupported ->
// NotImplementedError).
#include "bindings.hpp"

#include "tileattn/types.hpp"

namespace nb = nanobind;

NB_MODULE(_tileattn, m) {
  m.doc() = "tileattn C++ kernels; use the tileattn package, not this module";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tileattn::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const tileattn::NotSupported& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    }
  });
  tileattn::python::bind_forward(m);
  tileattn::python::bind_forward_arrays(m);
  tileattn::python::bind_merge(m);
  tileattn::python::bind_kvcache(m);
  tileattn::python::bind_kvcache_arrays(m);
  tileattn::python::bind_backward(m);
  tileattn::python::bind_buffer(m);
  tileattn::python::bind_machine(m);
  tileattn::python::bind_threads(m);
}
