#include "dtype_checks.hpp"

namespace tileattn::python {

DType attention_dtype(const char* name, nb::handle obj, const ArrayView& a) {
  switch (a.type) {
    case ElementType::f32:
      return DType::f32;
    case ElementType::f16:
      return DType::f16;
    case ElementType::bf16:
      return DType::bf16;
    default:
      break;
  }
  const char* expected = a.framework == Framework::torch
                             ? "(expected torch.float32, torch.float16 or torch.bfloat16)"
                             : "(expected native-endian float32 or float16; bfloat16 needs torch)";
  fail_type(std::string(name) + ": dtype " + dtype_text(obj) + " is not supported " + expected);
}

void check_dtype_like_q(const char* name, nb::handle obj, const ArrayView& a, nb::handle q,
                        const ArrayView& qa) {
  attention_dtype(name, obj, a);
  if (a.type != qa.type) {
    fail_type(std::string(name) + ": dtype " + dtype_text(obj) + " differs from q's " + dtype_text(q));
  }
}

void check_framework(const char* name, nb::handle obj, Framework fw) {
  if (framework_of(name, obj) != fw) {
    fail_type(std::string(name) + ": must be a " + framework_name(fw) + " array like q");
  }
}

}  // namespace tileattn::python
