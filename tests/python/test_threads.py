"""set_thread_runtime / get_thread_runtime: with PyTorch in use (its parallel backend OpenMP)
tileattn's kernels run on torch's OpenMP threads; the results are the pool's bit for bit; the
choice follows set_thread_runtime and TILEATTN_THREAD_RUNTIME."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import tileattn

OPENMP_TORCH = "parallel backend: OpenMP" in torch.__config__.parallel_info()
needs_openmp_torch = pytest.mark.skipif(not OPENMP_TORCH, reason="this torch build does not parallelize with OpenMP")


@pytest.fixture
def restore_runtime():
    yield
    tileattn.set_thread_runtime("auto")


def run_python(code, **env):
    """Runs `code` in a fresh interpreter (the runtime is chosen at import); returns stdout."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env={**os.environ, **env}, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@needs_openmp_torch
def test_torch_in_use_means_its_openmp_threads():
    assert tileattn.get_thread_runtime().startswith("openmp (")


@needs_openmp_torch
def test_results_equal_the_pools(restore_runtime):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 6, 300, 64, generator=gen) for _ in range(3))
    cache_k, cache_v = (torch.randn(2, 2, 700, 64, generator=gen) for _ in range(2))
    step_q = torch.randn(2, 6, 1, 64, generator=gen)
    q.requires_grad_(True)

    def outputs():
        o = tileattn.flash_attention(q, k, v, is_causal=True)
        (dq,) = torch.autograd.grad(o.square().sum(), (q,))
        decode = tileattn.attention_with_kvcache(step_q, cache_k, cache_v,
                                                 cache_seqlens=torch.tensor([700, 650], dtype=torch.int32))
        return o.detach(), dq, decode

    tileattn.set_thread_runtime("openmp")
    assert tileattn.get_thread_runtime().startswith("openmp (")
    on_openmp = outputs()
    tileattn.set_thread_runtime("pool")
    assert tileattn.get_thread_runtime() == "pool"
    on_pool = outputs()
    for a, b in zip(on_openmp, on_pool):
        assert torch.equal(a, b)


@needs_openmp_torch
def test_openmp_calls_start_no_threads_of_their_own():
    # Threads of the process after a torch operation (torch's OpenMP team exists), then after a
    # tileattn call: on torch's threads the count stays; tileattn's pool would add its workers.
    code = """
        import os, torch, tileattn
        torch.set_num_threads(2)
        x = torch.randn(512, 512)
        (x @ x).sum()
        before = len(os.listdir("/proc/self/task"))
        q = torch.randn(1, 8, 512, 64)
        tileattn.set_num_threads(2)
        tileattn.flash_attention(q, q, q)
        print(tileattn.get_thread_runtime(), before, len(os.listdir("/proc/self/task")))
    """
    runtime, before, after = run_python(code).rsplit(" ", 2)
    assert runtime.startswith("openmp (")
    assert int(after) == int(before), "tileattn started threads of its own"
    runtime, before, after = run_python(code, TILEATTN_THREAD_RUNTIME="pool").rsplit(" ", 2)
    assert runtime == "pool"
    if tileattn.info()["threads"] > 1:  # the pool has hardware threads - 1 workers
        assert int(after) > int(before), "the pool's workers were expected to start"


def test_environment_variable_and_bad_values(restore_runtime):
    assert run_python("import torch, tileattn; print(tileattn.get_thread_runtime())",
                      TILEATTN_THREAD_RUNTIME="pool") == "pool"
    # NumPy only (torch never imported): "auto" keeps the pool.
    assert run_python("import tileattn; print(tileattn.get_thread_runtime())") == "pool"
    result = subprocess.run([sys.executable, "-c", "import tileattn"], capture_output=True, text=True,
                            env={**os.environ, "TILEATTN_THREAD_RUNTIME": "gomp"}, timeout=300)
    assert result.returncode != 0 and "TILEATTN_THREAD_RUNTIME" in result.stderr
    with pytest.raises(ValueError, match="runtime"):
        tileattn.set_thread_runtime("threads")
    before = tileattn.get_thread_runtime()
    with pytest.raises(ValueError, match="runtime"):
        tileattn.set_thread_runtime(None)
    assert tileattn.get_thread_runtime() == before


def test_openmp_without_an_openmp_runtime_says_so():
    code = """
        import tileattn
        try:
            tileattn.set_thread_runtime("openmp")
        except RuntimeError as e:
            print("refused:", e)
        else:
            print("accepted:", tileattn.get_thread_runtime())
    """
    out = run_python(code)
    # NumPy may load an OpenMP runtime itself (an OpenMP OpenBLAS): then it is used.
    assert out.startswith("refused: runtime: 'openmp' needs an OpenMP runtime") or out.startswith("accepted: openmp (")


def test_numpy_calls_follow_the_runtime(restore_runtime):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, 200, 32)).astype(np.float32) for _ in range(3))
    tileattn.set_thread_runtime("pool")
    on_pool = tileattn.flash_attention(q, k, v)
    if OPENMP_TORCH:
        tileattn.set_thread_runtime("openmp")
    assert np.array_equal(tileattn.flash_attention(q, k, v), on_pool)
