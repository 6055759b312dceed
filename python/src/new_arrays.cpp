// See new_arrays.hpp. The cached functions and dtypes hold strong references
// that are never released (see array_view.cpp).
#include "new_arrays.hpp"

#include <string>

#include "dtype_checks.hpp"

namespace tileattn::python {

namespace {

using namespace nb::literals;

nb::handle numpy_empty() {
  static nb::handle f = nb::object(nb::module_::import_("numpy").attr("empty")).release();
  return f;
}
nb::handle torch_empty() {
  static nb::handle f = nb::object(nb::module_::import_("torch").attr("empty")).release();
  return f;
}
nb::handle torch_empty_like() {
  static nb::handle f = nb::object(nb::module_::import_("torch").attr("empty_like")).release();
  return f;
}
nb::handle float32_dtype(Framework fw) {
  if (fw == Framework::numpy) {
    static nb::handle f = nb::module_::import_("numpy").attr("dtype")("float32").release();
    return f;
  }
  static nb::handle f = nb::object(nb::module_::import_("torch").attr("float32")).release();
  return f;
}

// Row-major without gaps (the strides of size-1 dims do not matter).
bool is_contiguous(const ArrayView& a) {
  int64_t expected = 1;
  for (int i = a.rank - 1; i >= 0; --i) {
    if (a.shape[i] != 1 && a.stride[i] != expected) return false;
    expected *= a.shape[i];
  }
  return true;
}

nb::object empty(Framework fw, nb::handle shape, nb::handle dtype) {
  if (fw == Framework::numpy) return numpy_empty()(shape, dtype);
  return torch_empty()(shape, "dtype"_a = dtype);
}

nb::tuple shape_tuple(const ArrayView& a) {
  nb::object t = nb::steal(PyTuple_New(a.rank));
  if (!t.is_valid()) throw nb::python_error();
  for (int i = 0; i < a.rank; ++i) {
    PyObject* size = PyLong_FromLongLong(a.shape[i]);
    if (size == nullptr) throw nb::python_error();
    PyTuple_SET_ITEM(t.ptr(), i, size);
  }
  return nb::borrow<nb::tuple>(t);
}

}  // namespace

nb::object new_array_like(nb::handle like, const ArrayView& view) {
  // For a contiguous torch tensor, torch.empty_like(q) costs half of
  // torch.empty(shape, dtype=...) (no keyword parsing).
  if (view.framework == Framework::torch && is_contiguous(view)) return torch_empty_like()(like);
  return empty(view.framework, shape_tuple(view), like.attr("dtype"));
}

nb::object new_array_shaped(nb::handle like, const ArrayView& view) {
  return empty(view.framework, shape_tuple(view), like.attr("dtype"));
}

nb::object new_float32(Framework fw, std::initializer_list<int64_t> shape) {
  ArrayView view;
  view.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t size : shape) view.shape[i++] = size;
  return empty(fw, shape_tuple(view), float32_dtype(fw));
}

ArrayView read_output(const char* name, nb::handle obj, Framework fw, ElementType type,
                      nb::handle q, const int64_t* expected, int rank, bool float32_too) {
  if (framework_of(name, obj) != fw) {
    fail_type(std::string(name) + ": must be a " + framework_name(fw) + " array like q");
  }
  ArrayView a = read_array(name, obj, Access::write);
  if (a.type != type && !(float32_too && a.type == ElementType::f32)) {
    fail_type(std::string(name) + ": dtype " + dtype_text(obj) + ", expected " +
              (q.is_valid() ? "q's " + dtype_text(q) : std::string("float32")) +
              (float32_too && type != ElementType::f32 ? " or float32" : ""));
  }
  bool same = a.rank == rank;
  for (int i = 0; same && i < rank; ++i) same = a.shape[i] == expected[i];
  if (!same) {
    ArrayView want;
    want.rank = rank;
    for (int i = 0; i < rank; ++i) want.shape[i] = expected[i];
    fail_value(std::string(name) + ": expected shape " + shape_text(want) + ", got " + shape_text(a));
  }
  return a;
}

void fail_for_out(const Error& e) {
  std::string message = e.what();
  if (message.rfind("o: ", 0) == 0) message = "out: " + message.substr(3);
  fail_value(message);
}

}  // namespace tileattn::python
