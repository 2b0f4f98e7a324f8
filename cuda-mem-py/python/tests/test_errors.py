"""Errors a Python user can act on, checked without a GPU: every bad argument is a ValueError or
TypeError with cuda-mem's message, raised before any CUDA call; a machine without the NVIDIA
driver says so (cuda_mem.NoDriverError)."""
import ctypes
import itertools
import os
import re
import unittest

import cuda_mem
from helpers import raises

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "docs", "python.md")


def has_driver():
    try:
        cuda_mem.device_count()
    except cuda_mem.NoDriverError:
        return False
    except cuda_mem.CudaRuntimeError:
        return True
    return True


def test_bad_shapes_are_value_or_type_errors():
    for make in (cuda_mem.zeros, cuda_mem.empty):
        raises(ValueError, make, -1, match="extents are non-negative (got -1)")
        raises(ValueError, make, (2, -3), match="(got -3)")
        raises(ValueError, make, (2, 1 << 70), match="larger than any memory")
        raises(ValueError, make, (1 << 40, 1 << 40), match="more elements than fit in memory")
        raises(ValueError, make, (1 << 62,), match="overflow")
        raises(TypeError, make, "3", match="shape is an int or a sequence of ints, not str")
        raises(TypeError, make, 2.5, match="extents are ints, not float")
        raises(TypeError, make, (2, None), match="extents are ints, not NoneType")
        raises(TypeError, make, True, match="extents are ints, not bool")
        raises(ValueError, make, (1,) * 65, match="at most 64")
        raises(ValueError, make, itertools.repeat(1), match="more than 64 dimensions")


def test_bad_dtypes_kinds_devices_and_streams_are_refused_before_any_cuda_call():
    raises(ValueError, cuda_mem.zeros, 4, "float99", match='unknown dtype "float99"')
    raises(ValueError, cuda_mem.zeros, 4, dtype=5, match="unknown dtype")
    raises(ValueError, cuda_mem.zeros, 4, kind="texture", match='unknown kind "texture"')
    raises(ValueError, cuda_mem.zeros, 4, device=-1, match="ordinals are non-negative")
    raises(ValueError, cuda_mem.zeros, 4, device=1 << 70, match="no such ordinal")
    raises(TypeError, cuda_mem.zeros, 4, device=1.0, match="device is an ordinal (int)")
    raises(TypeError, cuda_mem.zeros, 4, device=True, match="not bool")
    raises(ValueError, cuda_mem.zeros, 4, device="cuda:x", match='use "cuda", "cuda:N" or an ordinal')
    raises(ValueError, cuda_mem.zeros, 4, device="cpu", match='use "cuda"')
    raises(ValueError, cuda_mem.empty, -5, "float99", match="non-negative")
    raises(TypeError, cuda_mem.from_bytes, "text", match="expected bytes or bytearray, not str")
    raises(ValueError, cuda_mem.from_bytes, b"abc", "float32", match="3 bytes are not whole float32 elements")
    raises(TypeError, cuda_mem.from_dlpack, object(), match="DLPack capsule")
    raises(ValueError, cuda_mem.synchronize, -2, match="ordinals are non-negative")


def test_devices_may_be_named_as_pytorch_cupy_and_jax_do():
    class TorchDevice:
        def __init__(self, type_, index):
            self.type, self.index = type_, index

    class JaxDevice:
        def __init__(self, id_, platform):
            self.id, self.platform = id_, platform

    class CupyDevice:
        id = 0

    # Each is accepted as a device: the shape (checked after the device) is what fails.
    for device in ("cuda", "cuda:0", TorchDevice("cuda", 0), TorchDevice("cuda", None), JaxDevice(0, "gpu"), CupyDevice()):
        raises(ValueError, cuda_mem.zeros, -1, device=device, match="non-negative (got -1)")
    raises(ValueError, cuda_mem.zeros, 1, device=TorchDevice("cpu", None), match="not a CUDA device")
    raises(ValueError, cuda_mem.zeros, 1, device=JaxDevice(0, "cpu"), match="not a CUDA device")
    raises(ValueError, cuda_mem.zeros, 1, device=TorchDevice("cuda", -1), match="ordinals are non-negative")


def test_dtypes_may_be_named_by_numpy_and_torch_objects():
    class NumpyLike:
        name = "float16"

    class TorchLike:
        def __str__(self):
            return "torch.bfloat16"

    # Parsed before the allocation, so a bad shape still reports the shape: the dtype was taken.
    raises(ValueError, cuda_mem.zeros, -1, NumpyLike(), match="non-negative")
    raises(ValueError, cuda_mem.zeros, -1, TorchLike(), match="non-negative")
    raises(ValueError, cuda_mem.zeros, 1, type("NotADtype", (), {})(), match="unknown dtype")


def test_without_a_driver_every_cuda_call_says_so():
    if has_driver():
        raise unittest.SkipTest("an NVIDIA driver is installed here")
    for call in (cuda_mem.device_count, lambda: cuda_mem.zeros(4), lambda: cuda_mem.empty((2, 2), kind="pooled"),
                 cuda_mem.Stream, cuda_mem.synchronize, cuda_mem.pool_stats):
        err = raises(cuda_mem.NoDriverError, call, match="no NVIDIA driver found (libcuda.so.1 could not be loaded)")
        assert isinstance(err, cuda_mem.CudaRuntimeError) and isinstance(err, RuntimeError)
        assert "insufficient" not in str(err), err


def test_the_torch_backends_are_the_documented_ones():
    import cuda_mem_torch

    assert cuda_mem_torch is cuda_mem.torch
    assert set(cuda_mem.torch.BACKENDS) == {"cache", "cache-compact", "pool"}
    if not os.path.exists(DOCS):
        raise unittest.SkipTest(f"{DOCS} is not here (the tests were copied without the docs)")
    with open(DOCS) as docs:
        text = docs.read()
    row = re.search(r"^\| `backend` \| (.*?) \|", text, re.M)
    assert row, "docs/python.md lists the backends in its settings table"
    documented = set(re.findall(r"`([a-z-]+)`", row.group(1)))
    assert {"cache", "pool"} <= documented, row.group(0)
    assert documented <= set(cuda_mem.torch.BACKENDS), (documented, cuda_mem.torch.BACKENDS)
    assert '"cache-compact"' in text, "docs/python.md names the former name of the cache backend"


def test_the_type_stubs_name_what_the_module_has():
    package = os.path.dirname(os.path.abspath(cuda_mem.__file__))
    assert os.path.exists(os.path.join(package, "py.typed"))
    with open(os.path.join(package, "_cuda_mem.pyi")) as stubs:
        text = stubs.read()
    names = set(re.findall(r"^(?:def|class) (\w+)", text, re.M))
    assert names == {n for n in cuda_mem.__all__ if n not in ("__version__", "torch", "cupy")}, names
    for cls in ("Buffer", "View", "Stream"):
        body = text.split(f"class {cls}")[1].split("\nclass ")[0].split("\ndef ")[0]
        for member in re.findall(r"def (\w+)", body):
            assert hasattr(getattr(cuda_mem, cls), member), f"{cls}.{member}"


def test_the_allocators_controls_refuse_bad_arguments_before_the_library_sees_them():
    import cuda_mem.torch

    allocator = cuda_mem.torch.Allocator()             # loads the library; needs no GPU
    raises(ValueError, allocator.select_backend, "fast", match="unknown backend 'fast': use 'cache', 'cache-compact', 'pool'")
    raises(TypeError, allocator.select_backend, 3, match="backend is a str")
    raises(ValueError, allocator.set_limit, 0, -1, match="the limit must be a non-negative 64-bit integer (got -1)")
    raises(ValueError, allocator.set_limit, 0, 1 << 64, match="non-negative 64-bit")
    raises(TypeError, allocator.set_limit, 0, 1.5, match="the limit is an int, not float")
    raises(ValueError, allocator.stats, -1, match="device must be a non-negative")
    raises(TypeError, allocator.empty_cache, "0", match="device is an int, not str")
    raises(ValueError, allocator.record_history, 0, -5, match="max_entries must be a non-negative")
    raises(ValueError, allocator.snapshot, "snap\0shot.pickle", match="holds a NUL byte")
    raises(ValueError, allocator.dump_on_oom, b"oom\0.pickle", match="holds a NUL byte")
    raises(TypeError, allocator.region(3).__enter__, match="a region tag is a str, not int")
    raises(ValueError, allocator.region("a\0b").__enter__, match="holds a NUL byte")
    raises(ValueError, allocator.region("two words").__enter__, match="no whitespace or control characters")
    raises(ValueError, allocator.region("x" * 65).__enter__, match="1 to 64 bytes")
    raises(TypeError, allocator.sleep, 3, match="tags are a str or an iterable of str")
    raises(ValueError, allocator.wake, "weights", device=-1, match="device must be a non-negative")
    raises(ValueError, allocator.release_host_backups, -1, match="device must be a non-negative")
    with allocator.region("outer"):                    # no GPU needed to tag
        with allocator.region("inner"):
            pass


def test_the_allocators_c_functions_refuse_what_they_can_check():
    """Through ctypes, as cuda_mem.cupy calls them: a wrong argument leaves an error for
    last_error and frees nothing (none of these calls makes a device's allocator)."""
    import cuda_mem.torch

    allocator = cuda_mem.torch.Allocator()
    lib = allocator.lib
    lib.cuda_mem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cuda_mem_torch_free.restype = None
    lib.cuda_mem_torch_try_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cuda_mem_torch_try_alloc.restype = ctypes.c_void_p
    lib.cuda_mem_torch_free(0x1000, -1, 0, None)
    assert "a negative size" in allocator.last_error(), allocator.last_error()
    assert lib.cuda_mem_torch_try_alloc(-1, 0, None) is None
    assert "a negative size" in allocator.last_error(), allocator.last_error()
    lib.cuda_mem_torch_free(0x1000, 64, -1, None)   # a device that does not exist (or no driver)
    assert allocator.last_error() and "negative size" not in allocator.last_error()
    assert lib.cuda_mem_torch_select_backend(None) == -1
    assert "a null backend name" in allocator.last_error(), allocator.last_error()
    assert lib.cuda_mem_torch_enter_region(None) == -1
    assert "a null tag" in allocator.last_error(), allocator.last_error()
    assert lib.cuda_mem_torch_leave_region(1 << 40) == -1
    assert "a tag no region has" in allocator.last_error(), allocator.last_error()
    assert lib.cuda_mem_torch_sleep(0, None, 1, None) == -1
    assert "a null tag" in allocator.last_error(), allocator.last_error()
    assert lib.cuda_mem_torch_wake(0, b"never-entered-tag", None) == -1
    assert "no region has this tag" in allocator.last_error(), allocator.last_error()
    assert lib.cuda_mem_torch_snapshot(None) == -1
    assert "a null path" in allocator.last_error(), allocator.last_error()
    values = (ctypes.c_uint64 * 4)()
    assert lib.cuda_mem_torch_stats(0, None, 4) == -1
    assert "a null or misaligned output buffer" in allocator.last_error(), allocator.last_error()
    assert lib.cuda_mem_torch_stats(-1, values, 4) == -1
