// See torch_eager.hpp. The torch functions are looked up once and kept for
// the life of the process (see array_view.cpp).
#include "torch_eager.hpp"

namespace tileattn::python {

namespace nb = nanobind;

namespace {

struct TorchState {
  PyTypeObject* tensor = nullptr;
  PyObject* is_grad_enabled = nullptr;
  PyObject* is_tracing = nullptr;
  PyObject* dispatch_stack_length = nullptr;
  PyObject* function_mode_enabled = nullptr;
  PyObject* functorch_active = nullptr;
  PyObject* forward_ad = nullptr;     // the module torch.autograd.forward_ad
  PyObject* current_level = nullptr;  // the attribute name "_current_level" (-1: no dual level)
  PyObject* requires_grad = nullptr;  // the attribute name
};

const TorchState& torch_state() {
  static const TorchState state = [] {
    TorchState s;
    const nb::module_ torch = nb::module_::import_("torch");
    const nb::object c = torch.attr("_C");
    s.tensor = reinterpret_cast<PyTypeObject*>(nb::object(torch.attr("Tensor")).release().ptr());
    s.is_grad_enabled = nb::object(c.attr("is_grad_enabled")).release().ptr();
    // _is_tracing (a bool) rather than _get_tracing_state (the state object): 5.5 against
    // 9-12 us when the code is cold, right after a decode-sized kernel.
    s.is_tracing = nb::object(c.attr("_is_tracing")).release().ptr();
    s.dispatch_stack_length = nb::object(c.attr("_len_torch_dispatch_stack")).release().ptr();
    s.function_mode_enabled = nb::object(c.attr("_is_torch_function_mode_enabled")).release().ptr();
    // torch.func transforms (vmap, grad, jvp) wrap tensors in ones without storage, and forward-mode
    // AD attaches tangents the direct call would drop: both need the op (and its autograd).
    s.functorch_active = nb::object(c.attr("_are_functorch_transforms_active")).release().ptr();
    s.forward_ad = nb::module_::import_("torch.autograd.forward_ad").release().ptr();
    s.current_level = PyUnicode_InternFromString("_current_level");
    s.requires_grad = PyUnicode_InternFromString("requires_grad");
    return s;
  }();
  return state;
}

// f() as a new reference; throws on a Python error.
nb::object call(PyObject* f) {
  PyObject* r = PyObject_CallNoArgs(f);
  if (r == nullptr) throw nb::python_error();
  return nb::steal(r);
}

bool truthy(const nb::object& o) {
  const int t = PyObject_IsTrue(o.ptr());
  if (t < 0) throw nb::python_error();
  return t != 0;
}

// Whether a forward-mode AD level is open (torch.autograd.forward_ad.dual_level): tensors may
// then carry tangents, which only the op path can refuse.
bool forward_ad_level_active(const TorchState& s) {
  PyObject* level = PyObject_GetAttr(s.forward_ad, s.current_level);
  if (level == nullptr) throw nb::python_error();
  const long value = PyLong_AsLong(level);
  Py_DECREF(level);
  if (value == -1 && PyErr_Occurred()) throw nb::python_error();
  return value >= 0;
}

}  // namespace

bool torch_call_is_plain_eager(std::initializer_list<nb::handle> args) {
  const TorchState& s = torch_state();
  bool any_tensor = false;
  for (nb::handle a : args) {
    if (!PyObject_TypeCheck(a.ptr(), s.tensor)) continue;
    if (Py_TYPE(a.ptr()) != s.tensor) return false;  // a subclass (e.g. a fake tensor) may intercept
    any_tensor = true;
  }
  if (any_tensor && truthy(call(s.is_grad_enabled))) {
    for (nb::handle a : args) {
      if (Py_TYPE(a.ptr()) != s.tensor) continue;
      PyObject* flag = PyObject_GetAttr(a.ptr(), s.requires_grad);
      if (flag == nullptr) throw nb::python_error();
      if (truthy(nb::steal(flag))) return false;
    }
  }
  return !truthy(call(s.is_tracing)) && !truthy(call(s.dispatch_stack_length)) &&
         !truthy(call(s.function_mode_enabled)) && !truthy(call(s.functorch_active)) &&
         !forward_ad_level_active(s);
}

}  // namespace tileattn::python
