"""cuda-mem for Python: CUDA buffers (device, managed, pinned, stream-ordered) that PyTorch, CuPy,
JAX and NumPy take without a copy (DLPack, `__cuda_array_interface__`), `from_dlpack` for their
tensors, and allocators over cuda-mem's caching allocator for PyTorch (`cuda_mem.torch`) and
CuPy (`cuda_mem.cupy`).

    import cuda_mem
    buf = cuda_mem.zeros((1024, 1024), "float32")
    t = torch.from_dlpack(buf)                     # no copy

Errors: bad arguments raise ValueError or TypeError with cuda-mem's message; failed CUDA calls
raise `cuda_mem.CudaRuntimeError` (a RuntimeError), and `cuda_mem.NoDriverError` (a subclass)
where the machine has no NVIDIA driver at all.
"""
import importlib as _importlib

from ._cuda_mem import (
    Buffer,
    CudaRuntimeError,
    NoDriverError,
    Stream,
    View,
    __version__,
    device_count,
    empty,
    from_bytes,
    from_dlpack,
    pool_stats,
    synchronize,
    zeros,
)

__all__ = [
    "Buffer",
    "CudaRuntimeError",
    "NoDriverError",
    "Stream",
    "View",
    "__version__",
    "cupy",
    "device_count",
    "empty",
    "from_bytes",
    "from_dlpack",
    "pool_stats",
    "synchronize",
    "torch",
    "zeros",
]

# `cuda_mem.torch` and `cuda_mem.cupy` import their framework only when used; they load on first
# access, so `import cuda_mem` imports neither PyTorch nor CuPy.
_SUBMODULES = ("torch", "cupy")


def __getattr__(name):
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
