// See array_view.hpp. The module-level caches below hold strong references
// that are never released on purpose: they live as long as the interpreter,
// and releasing them from static destructors would run after it is gone.
#include "array_view.hpp"

#include <bit>
#include <cstring>

#include "dlpack_exchange.hpp"

namespace tileattn::python {

namespace {

bool g_use_exchange = true;

// A strong reference kept for the life of the process (see the top of the file).
PyObject* keep(nb::object o) { return o.release().ptr(); }

PyTypeObject* numpy_ndarray_type() {
  static PyTypeObject* type = reinterpret_cast<PyTypeObject*>(
      keep(nb::module_::import_("numpy").attr("ndarray")));
  return type;
}

// torch's objects, looked up once torch has been imported by someone (this
// package never imports it for NumPy callers).
struct TorchObjects {
  PyTypeObject* tensor = nullptr;
  PyObject* float32 = nullptr;
  PyObject* float16 = nullptr;
  PyObject* bfloat16 = nullptr;
  PyObject* boolean = nullptr;
  PyObject* int32 = nullptr;
  PyObject* int64 = nullptr;
  PyObject* strided = nullptr;
  // Unbound methods of torch._C.TensorBase, called with the tensor as the one
  // argument: no attribute lookup per call.
  PyObject* is_neg = nullptr;
  PyObject* is_inference = nullptr;
  PyObject* is_inference_mode_enabled = nullptr;
};

const TorchObjects* torch_objects() {
  static TorchObjects objects;
  if (objects.tensor != nullptr) return &objects;
  PyObject* torch = PyImport_GetModule(nb::str("torch").ptr());  // new reference or null
  if (torch == nullptr) {
    if (PyErr_Occurred()) throw nb::python_error();
    return nullptr;
  }
  nb::handle t(torch);
  objects.float32 = keep(t.attr("float32"));
  objects.float16 = keep(t.attr("float16"));
  objects.bfloat16 = keep(t.attr("bfloat16"));
  objects.boolean = keep(t.attr("bool"));
  objects.int32 = keep(t.attr("int32"));
  objects.int64 = keep(t.attr("int64"));
  objects.strided = keep(t.attr("strided"));
  const nb::object tensor_base = t.attr("_C").attr("TensorBase");
  objects.is_neg = keep(tensor_base.attr("is_neg"));
  objects.is_inference = keep(tensor_base.attr("is_inference"));
  objects.is_inference_mode_enabled = keep(t.attr("is_inference_mode_enabled"));
  objects.tensor = reinterpret_cast<PyTypeObject*>(keep(t.attr("Tensor")));
  Py_DECREF(torch);
  return &objects;
}

// str(obj), for messages.
std::string text(nb::handle obj) {
  const nb::object s = nb::steal(PyObject_Str(obj.ptr()));
  if (!s.is_valid()) throw nb::python_error();
  const char* utf8 = PyUnicode_AsUTF8(s.ptr());
  if (utf8 == nullptr) throw nb::python_error();
  return utf8;
}

std::string python_type_name(nb::handle obj) {
  return text(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))).attr("__name__"));
}

void check_rank_fits(const char* name, int rank) {
  if (rank > kMaxRank) {
    throw nb::value_error((std::string(name) + ": has " + std::to_string(rank) +
                           " dims; at most " + std::to_string(kMaxRank) + " are supported").c_str());
  }
}

// NumPy ------------------------------------------------------------------

// A buffer format of one element ("f", "<f", ">e", "?") as an element type.
ElementType buffer_element_type(const char* format, Py_ssize_t itemsize) {
  if (format == nullptr) return ElementType::other;
  bool native = true;
  const char order = format[0];
  if (order == '@' || order == '=' || order == '<' || order == '>' || order == '!') {
    const bool little = std::endian::native == std::endian::little;
    native = order == '@' || order == '=' || (order == '<') == little;
    ++format;
  }
  if (format[0] == '\0' || format[1] != '\0') return ElementType::other;
  switch (format[0]) {
    case 'f':
      return native && itemsize == 4 ? ElementType::f32 : ElementType::other_float;
    case 'e':
      return native && itemsize == 2 ? ElementType::f16 : ElementType::other_float;
    case 'd':
    case 'g':
      return ElementType::other_float;
    case '?':
      return itemsize == 1 ? ElementType::boolean : ElementType::other;
    case 'i':
    case 'l':
    case 'q':
      if (native && itemsize == 4) return ElementType::i32;
      if (native && itemsize == 8) return ElementType::i64;
      return ElementType::other_int;
    case 'b':
    case 'h':
    case 'n':
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
      return ElementType::other_int;
    default:
      return ElementType::other;
  }
}

struct BufferRelease {
  Py_buffer* view;
  ~BufferRelease() { PyBuffer_Release(view); }
};

ArrayView read_numpy(const char* name, nb::handle obj, Access access) {
  Py_buffer buffer;
  // STRIDES: any layout, nothing copied; FORMAT: the element type.
  const bool writing = access == Access::write || access == Access::allocated;
  const int flags = PyBUF_RECORDS_RO | (writing ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &buffer, flags) != 0) {
    if (writing && PyObject_GetBuffer(obj.ptr(), &buffer, PyBUF_RECORDS_RO) == 0) {
      PyBuffer_Release(&buffer);
      PyErr_Clear();
      throw nb::value_error((std::string(name) + ": array is read-only; this call writes into it").c_str());
    }
    throw nb::python_error();
  }
  BufferRelease release{&buffer};
  check_rank_fits(name, buffer.ndim);
  ArrayView a;
  a.framework = Framework::numpy;
  a.type = buffer_element_type(buffer.format, buffer.itemsize);
  a.data = buffer.buf;  // NumPy's data pointer: the first logical element, also for negative strides
  a.rank = buffer.ndim;
  const int64_t item = buffer.itemsize;
  for (int i = 0; i < a.rank; ++i) {
    a.shape[i] = buffer.shape[i];
    const int64_t bytes = buffer.strides[i];
    if (bytes % item != 0) {
      throw nb::value_error((std::string(name) + ": byte stride " + std::to_string(bytes) +
                             " is not a multiple of the element size " + std::to_string(item))
                                .c_str());
    }
    a.stride[i] = bytes / item;
  }
  return a;
}

// torch ------------------------------------------------------------------

// The exchange table of a tensor type, or null where the type has none (torch
// before 2.10) or it is of a version this file does not know.
const DlpackExchangeApi* exchange_api(PyTypeObject* type) {
  // One entry: nearly every call sees torch.Tensor itself.
  static PyTypeObject* cached_type = nullptr;
  static const DlpackExchangeApi* cached_api = nullptr;
  if (type == cached_type) return cached_api;
  const DlpackExchangeApi* api = nullptr;
  PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
  } else {
    api = static_cast<const DlpackExchangeApi*>(PyCapsule_GetPointer(capsule, kDlpackExchangeCapsule));
    if (api == nullptr) PyErr_Clear();
    // The specification has the table live as long as the process, not just the capsule.
    Py_DECREF(capsule);
    if (api != nullptr && (api->version_major != 1 || api->version_minor < 3 ||
                           api->dltensor_from_py_object_no_sync == nullptr)) {
      api = nullptr;
    }
  }
  // Hold the type, so that its address cannot be reused by another type while cached.
  Py_INCREF(type);
  Py_XDECREF(cached_type);
  cached_type = type;
  cached_api = api;
  return api;
}

ElementType dlpack_element_type(const nb::dlpack::dtype& t) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes != 1) return ElementType::other;
  switch (static_cast<Code>(t.code)) {
    case Code::Float:
      if (t.bits == 32) return ElementType::f32;
      if (t.bits == 16) return ElementType::f16;
      return ElementType::other_float;
    case Code::Bfloat:
      return t.bits == 16 ? ElementType::bf16 : ElementType::other_float;
    case Code::Bool:
      return t.bits == 8 ? ElementType::boolean : ElementType::other;
    case Code::Int:
      return t.bits == 32 ? ElementType::i32 : t.bits == 64 ? ElementType::i64 : ElementType::other_int;
    case Code::UInt:
      return ElementType::other_int;
    case Code::Complex:
    case Code::Bcomplex:
      return ElementType::other;
    default:
      return ElementType::other_float;  // the 8-, 6- and 4-bit float formats
  }
}

// A DLPack view, or false where the exchange API is absent or refuses the
// tensor (then the attributes say why, e.g. its device).
bool read_torch_dlpack(const char* name, nb::handle obj, ArrayView& a) {
  if (!g_use_exchange) return false;
  const DlpackExchangeApi* api = exchange_api(Py_TYPE(obj.ptr()));
  if (api == nullptr) return false;
  nb::dlpack::dltensor t;
  if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) {
    PyErr_Clear();
    return false;
  }
  if (t.device.device_type != kDlpackCpu) return false;
  check_rank_fits(name, t.ndim);
  a.framework = Framework::torch;
  a.type = dlpack_element_type(t.dtype);
  a.data = static_cast<char*>(t.data) + t.byte_offset;
  a.rank = t.ndim;
  int64_t row_major = 1;
  for (int i = a.rank - 1; i >= 0; --i) {
    a.shape[i] = t.shape[i];
    a.stride[i] = t.strides != nullptr ? t.strides[i] : row_major;
    row_major *= t.shape[i];
  }
  return true;
}

int64_t index_value(nb::handle value) {
  // operator.index: ints, and torch.SymInt under tracing.
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) throw nb::python_error();
  const long long v = PyLong_AsLongLong(index);
  Py_DECREF(index);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

ElementType torch_element_type(const TorchObjects& torch, nb::handle dtype) {
  PyObject* d = dtype.ptr();
  if (d == torch.float32) return ElementType::f32;
  if (d == torch.float16) return ElementType::f16;
  if (d == torch.bfloat16) return ElementType::bf16;
  if (d == torch.boolean) return ElementType::boolean;
  if (d == torch.int32) return ElementType::i32;
  if (d == torch.int64) return ElementType::i64;
  if (nb::cast<bool>(dtype.attr("is_floating_point"))) return ElementType::other_float;
  if (nb::cast<bool>(dtype.attr("is_complex"))) return ElementType::other;
  return ElementType::other_int;  // int8, uint8, int16, uint16, uint32, uint64
}

ArrayView read_torch_attributes(const char* name, nb::handle obj, Access access) {
  // Metadata of a tensor on the meta device is read (shape inference: the Python side lets only
  // calls whose tensors are all on meta through to the metadata checks).
  if (!nb::cast<bool>(obj.attr("is_cpu")) &&
      !(access == Access::metadata && nb::cast<bool>(obj.attr("is_meta")))) {
    throw nb::value_error((std::string(name) + ": tensor is on device '" +
                           text(obj.attr("device")) +
                           "'; tileattn runs on the CPU (move it with .cpu())")
                              .c_str());
  }
  ArrayView a;
  a.framework = Framework::torch;
  a.type = torch_element_type(*torch_objects(), obj.attr("dtype"));
  const nb::object shape = obj.attr("shape");
  a.rank = static_cast<int>(nb::len(shape));
  check_rank_fits(name, a.rank);
  for (int i = 0; i < a.rank; ++i) a.shape[i] = index_value(shape[i]);
  if (access != Access::metadata) {
    try {
      a.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(obj.attr("data_ptr")()));
    } catch (nb::python_error&) {
      // A sparse (or other non-strided) tensor has no data pointer; say so by name rather
      // than pass on torch's "doesn't have storage". Looked at only here: off the common path.
      const nb::object layout = obj.attr("layout");
      if (!layout.is(nb::handle(torch_objects()->strided))) {
        throw nb::value_error((std::string(name) + ": " + text(layout) +
                               " tensors are not supported (convert with .to_dense())")
                                  .c_str());
      }
      throw;
    }
    const nb::object stride = obj.attr("stride")();
    for (int i = 0; i < a.rank; ++i) a.stride[i] = index_value(stride[i]);
  }
  return a;
}

// method(obj) for one of torch's cached boolean methods; throws on a Python error.
bool tensor_flag(PyObject* method, nb::handle obj) {
  PyObject* args[1] = {obj.ptr()};
  PyObject* r = PyObject_Vectorcall(method, args, 1, nullptr);
  if (r == nullptr) throw nb::python_error();
  const int flag = PyObject_IsTrue(r);
  Py_DECREF(r);
  if (flag < 0) throw nb::python_error();
  return flag != 0;
}

// Whether `a` could have torch's negative bit: only tensors without a unit
// stride (in a dim of size > 1). The public ways to get the bit, z.conj().imag
// and views of it, are views into complex storage, whose strides are all even;
// asking torch costs ~0.1 us per tensor (0.3 right after a decode-sized
// kernel), and the usual q, k, v, caches and tables have a unit stride.
bool may_be_negative_view(const ArrayView& a) {
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] > 1 && a.stride[i] == 1) return false;
  }
  return true;
}

// Whether `ref` (a weak reference) refers to `obj`, which is alive.
bool refers_to(PyObject* ref, PyObject* obj) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* target = nullptr;
  if (PyWeakref_GetRef(ref, &target) < 0) {
    PyErr_Clear();
    return false;
  }
  Py_XDECREF(target);
  return target == obj;
#else
  return PyWeakref_GetObject(ref) == obj;
#endif
}

// Whether `obj` is an inference tensor, remembered per tensor object through a
// weak reference (a dead object's entry never matches, and no tensor is kept
// alive): a decode loop appends to the same caches every step, and asking
// torch costs 0.1-0.2 us per tensor (measured: +0.24-0.43 us per call for the
// two caches). A tensor is or is not an inference tensor for its whole life.
bool is_inference_tensor(nb::handle obj) {
  struct Remembered {
    PyObject* ref = nullptr;
    bool inference = false;
  };
  static std::array<Remembered, 256> table;  // by address; a collision only asks torch again
  Remembered& entry = table[(reinterpret_cast<uintptr_t>(obj.ptr()) >> 4) % table.size()];
  if (entry.ref != nullptr && refers_to(entry.ref, obj.ptr())) return entry.inference;
  const bool inference = tensor_flag(torch_objects()->is_inference, obj);
  PyObject* ref = PyWeakref_NewRef(obj.ptr(), nullptr);
  if (ref == nullptr) {
    PyErr_Clear();  // not weakly referenceable: not remembered
    return inference;
  }
  Py_XDECREF(entry.ref);
  entry.ref = ref;
  entry.inference = inference;
  return inference;
}

// What a tensor's memory does not show. The negative bit (a lazy negation)
// means the values are the negation of what is stored: read or written as
// memory, they would silently come out with the wrong sign (the DLPack export
// ignores the bit). An inference tensor may only be updated in place inside
// inference mode; torch refuses it elsewhere, so this call does too.
void check_torch_flags(const char* name, nb::handle obj, const ArrayView& a, Access access) {
  const TorchObjects& torch = *torch_objects();
  if (may_be_negative_view(a) && tensor_flag(torch.is_neg, obj)) {
    throw nb::value_error((std::string(name) +
                           ": tensor has the negative bit set (a lazy negation, e.g. from "
                           ".conj().imag); call .resolve_neg() first")
                              .c_str());
  }
  if (access == Access::write && is_inference_tensor(obj)) {
    const nb::object enabled = nb::steal(PyObject_CallNoArgs(torch.is_inference_mode_enabled));
    if (!enabled.is_valid()) throw nb::python_error();
    if (!enabled.is(nb::handle(Py_True))) {
      throw nb::value_error((std::string(name) +
                             ": is an inference tensor (created under torch.inference_mode()), "
                             "which torch does not let anything update in place outside "
                             "inference mode; call inside torch.inference_mode(), or pass a "
                             "clone made outside it")
                                .c_str());
    }
  }
}

}  // namespace

const char* framework_name(Framework f) { return f == Framework::numpy ? "numpy" : "torch"; }

bool is_array(nb::handle obj) {
  if (PyObject_TypeCheck(obj.ptr(), numpy_ndarray_type())) return true;
  const TorchObjects* torch = torch_objects();
  return torch != nullptr && PyObject_TypeCheck(obj.ptr(), torch->tensor);
}

Framework framework_of(const char* name, nb::handle obj) {
  if (PyObject_TypeCheck(obj.ptr(), numpy_ndarray_type())) return Framework::numpy;
  const TorchObjects* torch = torch_objects();
  if (torch != nullptr && PyObject_TypeCheck(obj.ptr(), torch->tensor)) return Framework::torch;
  throw nb::type_error((std::string(name) + ": expected a numpy.ndarray or torch.Tensor, got " +
                        python_type_name(obj)).c_str());
}

ArrayView read_array(const char* name, nb::handle obj, Access access) {
  if (framework_of(name, obj) == Framework::numpy) return read_numpy(name, obj, access);
  ArrayView a;
  if (access == Access::metadata || !read_torch_dlpack(name, obj, a)) {
    a = read_torch_attributes(name, obj, access);
  }
  if (access == Access::read || access == Access::write) check_torch_flags(name, obj, a, access);
  return a;
}

std::string shape_text(const ArrayView& a) {
  std::string s = "(";
  for (int i = 0; i < a.rank; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(a.shape[i]);
  }
  return s + (a.rank == 1 ? ",)" : ")");
}

std::string dtype_text(nb::handle obj) { return text(obj.attr("dtype")); }

bool dlpack_exchange_available(nb::handle obj) { return exchange_api(Py_TYPE(obj.ptr())) != nullptr; }

bool use_dlpack_exchange(bool enabled) {
  const bool previous = g_use_exchange;
  g_use_exchange = enabled;
  return previous;
}

}  // namespace tileattn::python
