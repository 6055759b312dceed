// Whether calling a torch custom op's implementation directly is
// indistinguishable from calling the op: plain CPU tensors (no subclass),
// no gradient to record, nothing tracing or intercepting calls (torch.jit.trace,
// make_fx and other dispatch modes, torch function modes), no torch.func
// transform (vmap, grad, jvp) and no forward-mode AD level open. The op's Python
// dispatch costs more than a decode-sized call's whole C++ work (see
// docs/python.md, "Call overhead"), so the common inference call skips it.
// torch.compile is not checked here: Dynamo must see that test in Python
// (torch.compiler.is_compiling()), which the callers make first.
#pragma once

#include <initializer_list>

#include <nanobind/nanobind.h>

namespace tileattn::python {

// `args` may hold None and non-tensors (left to the argument checks). torch
// must be imported.
bool torch_call_is_plain_eager(std::initializer_list<nanobind::handle> args);

}  // namespace tileattn::python
