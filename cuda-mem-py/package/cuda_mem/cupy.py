"""cuda-mem's caching allocator for CuPy: `cuda_mem.cupy.install()` makes every CuPy allocation
come from cuda-mem's device cache (the library of `cuda_mem.torch`, which needs no PyTorch),
through `cupy.cuda.set_allocator`.

    import cupy, cuda_mem.cupy
    alloc = cuda_mem.cupy.install()       # before CuPy allocates, or at any time: earlier memory stays CuPy's
    x = cupy.zeros((4096, 4096))
    alloc.stats(0)["allocated_current"]    # bytes CuPy holds from cuda-mem
    cuda_mem.cupy.uninstall()             # CuPy's own memory pool again

Each allocation is made on CuPy's current stream (a stream cuda-mem has allocated on is kept alive
until the process ends, as its cache may use it later) and returns there when CuPy drops it, as with
CuPy's own pool: memory used on other streams must be ordered before its release by the caller
(synchronize those streams, or record and wait on an event). Settings come from
CUDA_MEM_TORCH_ALLOC_CONF, as for PyTorch (see `cuda_mem.torch`). One library serves PyTorch and
CuPy in one process: they share its caches and statistics.
"""
import ctypes

from .torch import DEFAULT_PATH, Allocator

_installed = None
# The CuPy streams cuda-mem has allocated on, kept alive for the life of the process: the cache
# keeps each stream it was given while it holds memory freed there and records events on it, so
# a stream it knows must never be destroyed (the built-in streams, 0 and 2, never are).
_kept_streams = {}


class _Allocation:
    """Owns one allocation; CuPy drops it when the last array using the memory is gone."""

    __slots__ = ("lib", "ptr", "size", "device", "stream")

    def __init__(self, lib, ptr, size, device, stream):
        self.lib, self.ptr, self.size, self.device, self.stream = lib, ptr, size, device, stream

    def __del__(self):
        self.lib.cuda_mem_torch_free(self.ptr, self.size, self.device, self.stream)


def _allocator_function(allocator):
    """The function CuPy calls for each allocation: bytes on the current device and stream."""
    import cupy

    lib = allocator.lib
    lib.cuda_mem_torch_try_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cuda_mem_torch_try_alloc.restype = ctypes.c_void_p
    lib.cuda_mem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cuda_mem_torch_free.restype = None

    def allocate(size):
        device = cupy.cuda.runtime.getDevice()
        current = cupy.cuda.get_current_stream()
        stream = current.ptr
        if stream not in (0, 1, 2):
            _kept_streams.setdefault(stream, current)
        ptr = lib.cuda_mem_torch_try_alloc(size, device, stream)
        if not ptr:
            raise cupy.cuda.memory.OutOfMemoryError(size, 0, 0) from MemoryError(allocator.last_error())
        owner = _Allocation(lib, ptr, size, device, stream)
        memory = cupy.cuda.memory.UnownedMemory(ptr, size, owner, device)
        return cupy.cuda.memory.MemoryPointer(memory, 0)

    return allocate


def install(path=DEFAULT_PATH, backend=None):
    """Makes cuda-mem's allocator CuPy's (`cupy.cuda.set_allocator`), over `backend` ("cache",
    the default, or "pool"; None: CUDA_MEM_TORCH_ALLOC_CONF's choice). Returns the allocator,
    whose `stats(device)`, `memory_stats(device)`, `set_limit` and `empty_cache` read and steer
    it. A bad CUDA_MEM_TORCH_ALLOC_CONF raises ValueError."""
    global _installed
    import cupy

    allocator = Allocator(path)
    if allocator.lib.cuda_mem_torch_check_conf() != 0:
        raise ValueError(allocator.last_error())
    if backend is not None:
        allocator.select_backend(backend)
    cupy.cuda.set_allocator(_allocator_function(allocator))
    _installed = allocator
    return allocator


def uninstall():
    """Gives CuPy its default memory pool back; memory from cuda-mem returns to it as CuPy drops it."""
    global _installed
    import cupy

    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    _installed = None
