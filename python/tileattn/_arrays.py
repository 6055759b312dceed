"""Reading NumPy arrays and torch tensors as (address, element strides) without copying.

The C++ library takes a data address and int64 element strides for every
tensor (ForwardArgs in include/tileattn/attention.hpp); this module gets them
from NumPy arrays and PyTorch tensors, checks what the library cannot (Python
types, devices, dtypes, ranks), and names the offending argument in every
error. It never copies an array.
"""
import sys

import numpy as np

from ._tileattn import buffer_address

# DType codes of include/tileattn/types.hpp.
F32, F16, BF16 = 0, 1, 2
DTYPE_NAMES = {F32: "float32", F16: "float16", BF16: "bfloat16"}

_NUMPY_DTYPES = {np.dtype(np.float32): F32, np.dtype(np.float16): F16}


def torch_module():
    """torch if it has been imported (tileattn never imports it for NumPy callers)."""
    return sys.modules.get("torch")


def torch_entry_point(op_name):
    """(torch.Tensor, _torch_ops.dynamo_is_tracing, the custom-op path _torch_ops.<op_name>): what
    a public function binds to its module globals at its first call with torch tensors, so its
    hot path reads globals and Dynamo sees is_compiling() called from Python. Importing
    _torch_ops (which registers the custom ops) waits until then."""
    from . import _torch_ops
    return torch_module().Tensor, _torch_ops.dynamo_is_tracing, getattr(_torch_ops, op_name)


def is_torch(x):
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def framework(name, x):
    """'numpy' or 'torch' for an array argument; TypeError otherwise."""
    if type(x) is np.ndarray or isinstance(x, np.ndarray):
        return "numpy"
    if is_torch(x):
        return "torch"
    raise TypeError(f"{name}: expected a numpy.ndarray or torch.Tensor, got {type(x).__name__}")


_torch_dtypes = {}  # torch dtype -> code, filled on first use (torch is imported by then)


def torch_dtype_code(name, t):
    if not _torch_dtypes:
        torch = torch_module()
        _torch_dtypes.update({torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16})
    code = _torch_dtypes.get(t.dtype)
    if code is None:
        raise TypeError(f"{name}: dtype {t.dtype} is not supported "
                        "(expected torch.float32, torch.float16 or torch.bfloat16)")
    return code


def numpy_dtype_code(name, a):
    code = _NUMPY_DTYPES.get(a.dtype)
    if code is None:
        raise TypeError(f"{name}: dtype {a.dtype} is not supported "
                        "(expected native-endian float32 or float16; bfloat16 needs torch)")
    return code


def check_torch_device(name, t, meta=False):
    """ValueError naming `name` unless t is on the CPU (or, with meta, on the meta device)."""
    if not t.is_cpu and not (meta and t.is_meta):
        raise ValueError(f"{name}: tensor is on device '{t.device}'; tileattn runs on the CPU "
                         "(move it with .cpu())")


def on_meta(named):
    """Whether a call's torch tensors, (name, x) pairs (None and non-tensors skipped), are all
    on the meta device: shape inference, which the custom ops' fake kernels answer. False when
    none is; ValueError naming the first meta tensor when they mix with CPU ones."""
    torch = torch_module()
    tensors = [(name, x) for name, x in named if isinstance(x, torch.Tensor)]
    meta = [x.is_meta for _, x in tensors]
    if not any(meta):
        return False
    if not all(meta):
        name, x = tensors[meta.index(True)]
        other = tensors[meta.index(False)][0]
        raise ValueError(f"{name}: tensor is on device 'meta' but {other} is not; tileattn runs on the CPU "
                         "(move it with .cpu()), or infers shapes when every tensor is on 'meta'")
    return True


def address(x):
    """Data address of an array or tensor (what element [0, ..., 0] is at)."""
    if isinstance(x, np.ndarray):
        return buffer_address(x)  # __array_interface__ would build a dict per call (~3 us)
    return x.data_ptr()


def element_strides(name, x):
    """Strides in elements (NumPy's are in bytes and may be any multiple of the item size)."""
    if isinstance(x, np.ndarray):
        item = x.itemsize
        out = []
        for s in x.strides:
            if s % item:
                raise ValueError(f"{name}: byte stride {s} is not a multiple of the element size {item}")
            out.append(s // item)
        return tuple(out)
    return tuple(x.stride())


def check_rank(name, x, rank, what):
    if x.ndim != rank:
        raise ValueError(f"{name}: expected a {rank}-D array {what}, got shape {tuple(x.shape)}")


def broadcast_strides(name, x, target, labels):
    """Element strides of `x` broadcast (NumPy rules) to the shape `target`.

    Missing leading dims and dims of size 1 get stride 0, so a [Nq, Nk] mask
    serves every batch and head without being expanded in memory.
    """
    shape = tuple(x.shape)
    if x.ndim > len(target) or x.ndim < 1:
        raise ValueError(f"{name}: expected 1 to {len(target)} dims broadcastable to "
                         f"[{', '.join(labels)}] = {tuple(target)}, got shape {shape}")
    strides = element_strides(name, x)
    pad = len(target) - x.ndim
    out = [0] * pad
    for i, (size, stride) in enumerate(zip(shape, strides)):
        want = target[pad + i]
        if size == want:
            out.append(stride if size != 1 else 0)
        elif size == 1:
            out.append(0)
        else:
            raise ValueError(f"{name}: shape {shape} does not broadcast to "
                             f"[{', '.join(labels)}] = {tuple(target)} (dim {i} is {size})")
    return tuple(out)
