"""tileattn: exact FlashAttention-2 style attention on CPUs, for NumPy arrays and PyTorch tensors.

    import tileattn
    o = tileattn.flash_attention(q, k, v, is_causal=True)

Functions: flash_attention, attention_with_kvcache, merge_states, info,
set_num_threads / get_num_threads, set_thread_runtime / get_thread_runtime,
set_bf16_probabilities / get_bf16_probabilities; drop-ins with the originals' signatures:
scaled_dot_product_attention (PyTorch's) and flash_attn_func, flash_attn_varlen_func,
flash_attn_with_kvcache (FlashAttention-2's). With PyTorch installed also the
FlashAttention module (a Llama-style attention layer), its configuration
AttentionConfig, and load_huggingface_weights; they import torch on first use,
so NumPy users never load it.
"""
from ._flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from ._forward import flash_attention
from ._kernel import apply_auto_thread_runtime as _apply_auto_thread_runtime
from ._kernel import (get_bf16_probabilities, get_num_threads, get_thread_runtime, set_bf16_probabilities,
                      set_num_threads, set_thread_runtime)
from ._kvcache import attention_with_kvcache
from ._merge import merge_states
from ._sdpa import scaled_dot_product_attention
from ._tileattn import machine_info as _machine_info

__version__ = "0.1.0"

_TORCH_NAMES = {"FlashAttention": "_module", "AttentionConfig": "_module",
                "load_huggingface_weights": "_weights"}

__all__ = ["flash_attention", "attention_with_kvcache", "merge_states", "info",
           "scaled_dot_product_attention", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache",
           "set_num_threads", "get_num_threads", "set_thread_runtime", "get_thread_runtime",
           "set_bf16_probabilities", "get_bf16_probabilities", *_TORCH_NAMES]


def _register_torch_ops_if_torch_is_loaded():
    """torch.ops.tileattn.* exist once tileattn._torch_ops is imported: at the first call with
    torch tensors, or right away when torch was imported before tileattn."""
    import sys
    if "torch" in sys.modules:
        from . import _torch_ops  # noqa: F401


_register_torch_ops_if_torch_is_loaded()
_apply_auto_thread_runtime()  # TILEATTN_THREAD_RUNTIME, and "auto" where torch came first


def info():
    """ISA path chosen, CPU features, cache sizes, hardware threads and the thread runtime
    (get_thread_runtime()), as a dict."""
    return {**_machine_info(), "thread_runtime": get_thread_runtime()}


def __getattr__(name):
    if name == "transformers":  # the Hugging Face integration, imported on first use
        import importlib
        return importlib.import_module(".transformers", __name__)
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'tileattn' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f".{module}", __name__), name)
