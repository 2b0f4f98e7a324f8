"""What the tests share: skips for missing GPUs and frameworks, and error assertions."""
import importlib
import json
import os
import struct
import subprocess
import sys
import textwrap
import unittest

import cuda_mem


def need_gpu():
    """Skips the test where no CUDA device can be used."""
    try:
        count = cuda_mem.device_count()
    except cuda_mem.CudaRuntimeError as err:
        raise unittest.SkipTest(f"no usable CUDA device: {err}")
    if count == 0:
        raise unittest.SkipTest("no CUDA device")


def need(module):
    """Imports `module`, or skips the test where it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise unittest.SkipTest(f"{module} is not installed: {err}")


def need_torch_cuda():
    need_gpu()
    torch = need("torch")
    if not torch.cuda.is_available():
        raise unittest.SkipTest("torch has no CUDA device")
    return torch


def need_cupy():
    need_gpu()
    cupy = need("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 - CuPy raises its own runtime error types
        raise unittest.SkipTest(f"cupy has no CUDA device: {err}")
    return cupy


def need_jax_gpu():
    need_gpu()
    jax = need("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as err:
        raise unittest.SkipTest(f"jax has no GPU backend: {err}")
    if not gpus:
        raise unittest.SkipTest("jax has no GPU")
    return jax


def raises(exception, call, *args, match=None, **kwargs):
    """Asserts that `call(*args, **kwargs)` raises `exception` (with `match` in its message)."""
    try:
        call(*args, **kwargs)
    except exception as err:
        if match is not None:
            assert match in str(err), f"{match!r} not in {str(err)!r}"
        return err
    raise AssertionError(f"{call} did not raise {exception.__name__}")


def floats(values):
    """float32 values as bytes."""
    return struct.pack(f"<{len(values)}f", *values)


def unpack_floats(data):
    return list(struct.unpack(f"<{len(data) // 4}f", data))


# About 50 ms of GPU time for torch.cuda._sleep, far longer than queueing the next work.
SLEEP_CYCLES = 100_000_000


# The folder of the tests' helper scripts (torch_alloc_compare.py).
BUNDLE_PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The folder holding the `cuda_mem` package the tests import (site-packages for an installed
# wheel, python/ in the bundle): the scripts run in new processes import from it too.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cuda_mem.__file__)))
ALLOCATOR = os.path.join(os.path.dirname(os.path.abspath(cuda_mem.__file__)), "libcuda_mem_torch_alloc.so")


def need_allocator():
    """PyTorch with CUDA and the built allocator library."""
    need_torch_cuda()
    if not os.path.exists(ALLOCATOR):
        raise unittest.SkipTest(f"{ALLOCATOR} is not built (cargo xtask wheel or bundle)")


def run_script(body, install=True):
    """Runs `body` in a new Python (with cuda-mem's allocator installed as `alloc` unless
    `install` is false); returns its last output line, parsed as JSON."""
    script = "import sys, json, torch\nsys.path.insert(0, %r)\nimport cuda_mem_torch\n" % PACKAGE_ROOT
    if install:
        script += "alloc = cuda_mem_torch.install()\n"
    script += textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])
