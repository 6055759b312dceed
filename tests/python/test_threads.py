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
    assert tileattn.info()["thread_runtime"] == tileattn.get_thread_runtime()


@needs_openmp_torch
def test_torchs_thread_count_caps_the_team(restore_runtime):
    code = """
        import torch, tileattn
        tileattn.set_num_threads(0)
        torch.set_num_threads(1)
        one = tileattn.get_num_threads()
        tileattn.set_thread_runtime("pool")
        print(one, tileattn.get_num_threads())
    """
    capped, on_pool = run_python(code).split()
    assert capped == "1"
    assert on_pool == str(tileattn.info()["threads"])


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


@needs_openmp_torch
def test_openmp_calls_run_on_several_of_torchs_threads():
    # CPU time of each thread of the process across ten calls of ~40 ms: on torch's team of two,
    # two threads (the caller and torch's worker, no thread of tileattn's) each take a good share.
    if tileattn.info()["threads"] < 2:
        pytest.skip("one hardware thread: a team of one")
    code = """
        import os, torch, tileattn
        torch.set_num_threads(2)
        tileattn.set_num_threads(2)
        x = torch.randn(256, 256)
        (x @ x).sum()  # torch's team exists from here on
        def cpu_ticks():
            ticks = {}
            for tid in os.listdir("/proc/self/task"):
                fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                ticks[tid] = int(fields[11]) + int(fields[12])  # utime + stime
            return ticks
        q = torch.randn(1, 8, 2048, 64)
        before = cpu_ticks()
        for _ in range(10):
            tileattn.flash_attention(q, q, q)
        after = cpu_ticks()
        busy = sorted((after[t] - before.get(t, 0) for t in after), reverse=True)
        print(tileattn.get_thread_runtime(), sorted(before) == sorted(after), busy[0], busy[1])
    """
    runtime, same_threads, first, second = run_python(code).rsplit(" ", 3)
    assert runtime.startswith("openmp (") and same_threads == "True"
    assert int(second) >= 0.3 * int(first), f"one thread did the work: {first} and {second} ticks"


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


@needs_openmp_torch
def test_environment_openmp_whatever_the_import_order():
    # tileattn before torch: the preference waits for torch's ops to load (the first call).
    code = """
        import warnings
        warnings.simplefilter("error")
        import tileattn
        at_import = tileattn.get_thread_runtime()
        import torch
        tileattn.flash_attention(torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32))
        print(at_import, "|", tileattn.get_thread_runtime())
    """
    at_import, after = run_python(code, TILEATTN_THREAD_RUNTIME="openmp").split(" | ")
    assert at_import == "pool" and after.startswith("openmp (")
    # A NumPy-only process has no OpenMP runtime to take: the pool, and no error at import.
    code = """
        import numpy as np, tileattn
        x = np.ones((1, 2, 64, 32), np.float32)
        tileattn.flash_attention(x, x, x)
        print(tileattn.get_thread_runtime())
    """
    out = run_python(code, TILEATTN_THREAD_RUNTIME="openmp")
    assert out == "pool" or out.startswith("openmp (")  # "openmp" where NumPy's BLAS loaded one


def openmp_loaded_code(body):
    return textwrap.dedent("""
        import tileattn
        loaded = any(name in line for line in open("/proc/self/maps")
                     for name in ("libgomp", "libomp", "libiomp5"))
    """) + textwrap.dedent(body)


def test_openmp_without_an_openmp_runtime_says_so_and_changes_nothing():
    code = openmp_loaded_code("""
        try:
            tileattn.set_thread_runtime("openmp")
        except RuntimeError as e:
            print(loaded, "refused", tileattn.get_thread_runtime(), "|", e)
        else:
            print(loaded, "accepted", tileattn.get_thread_runtime(), "|")
    """)
    loaded, verdict, runtime, message = run_python(code).split(" ", 3)
    if loaded == "True":  # NumPy's BLAS may load one itself: then it is taken
        assert verdict == "accepted" and runtime.startswith("openmp")
    else:
        assert verdict == "refused" and runtime == "pool"
        assert "needs an OpenMP runtime" in message


@needs_openmp_torch
def test_a_forked_child_and_dataloader_workers_finish():
    # libgomp cannot start the parent's team in a forked child: tileattn goes back to the pool
    # there (a call that waited for the team would never return: the alarm fails the child).
    code = """
        import os, signal, numpy as np, torch, tileattn
        torch.set_num_threads(2)
        tileattn.set_num_threads(2)
        q = torch.randn(1, 8, 256, 64)
        tileattn.flash_attention(q, q, q)
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)
            o = tileattn.flash_attention(q, q, q).numpy()  # no torch operation here: those hang in a child
            os._exit(0 if tileattn.get_thread_runtime() == "pool" and np.isfinite(o).all() else 3)
        _, status = os.waitpid(pid, 0)
        print("child", status)

        class Items(torch.utils.data.Dataset):
            def __len__(self):
                return 2
            def __getitem__(self, i):
                return tileattn.flash_attention(q, q, q).sum()

        loader = torch.utils.data.DataLoader(Items(), num_workers=1, timeout=60,
                                             multiprocessing_context="fork")
        print("batches", len(list(loader)), tileattn.get_thread_runtime())
    """
    child, batches = run_python(code).splitlines()
    assert child == "child 0"
    assert batches.startswith("batches 2 openmp (")


def test_numpy_calls_follow_the_runtime(restore_runtime):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, 200, 32)).astype(np.float32) for _ in range(3))
    tileattn.set_thread_runtime("pool")
    on_pool = tileattn.flash_attention(q, k, v)
    if OPENMP_TORCH:
        tileattn.set_thread_runtime("openmp")
        assert tileattn.get_thread_runtime().startswith("openmp (")
    assert np.array_equal(tileattn.flash_attention(q, k, v), on_pool)
