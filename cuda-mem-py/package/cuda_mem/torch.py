"""cuda-mem's PyTorch allocator: load `libcuda_mem_torch_alloc.so` (in this package), install it
before PyTorch's first CUDA allocation, and read its statistics or set its limit. The top-level
module `cuda_mem_torch` is this module under its former name.

    import cuda_mem.torch
    alloc = cuda_mem.torch.install()          # torch.cuda.memory.change_current_allocator(...)
    x = torch.randn(1 << 20, device="cuda")
    alloc.stats(0)["allocated_current"]       # bytes PyTorch holds
    alloc.set_limit(0, 8 << 30)               # beyond it PyTorch raises RuntimeError (out of memory)
    alloc.record_history(0)                   # then alloc.snapshot("snap.pickle") for _memory_viz

The memory comes from cuda-mem's device caching allocator (`backend="cache"`, the default; the
older name "cache-compact" means the same) or a retaining memory pool (`backend="pool"`). The
environment variable CUDA_MEM_TORCH_ALLOC_CONF sets its parameters as PYTORCH_CUDA_ALLOC_CONF
does PyTorch's (`key:value,...`; keys: backend, front_depth, front_max_mb, large_fit_slack_mb,
expandable_segments, release_idle_on_miss, live_slack_percent, cross_stream_waits,
map_ahead_mb, own_range_mb, max_mapping_mb, lowest_for_whole_pages); `install()` raises
ValueError for a bad one.
`memory_stats()` gives the figures under torch.cuda.memory_stats()'s key names, which PyTorch
cannot give under a pluggable allocator. The allocator keeps the streams PyTorch allocates on:
a stream wrapped with `torch.cuda.ExternalStream` must never be destroyed while it is installed.
`install()` also sets the pluggable allocator's optional hooks, so `Tensor.record_stream`,
`torch.cuda.empty_cache()` and `torch.cuda.set_per_process_memory_fraction` reach it (the
fraction sets the limit, which bounds the bytes PyTorch holds rather than what is reserved),
and so that CUDA graph captures (`torch.cuda.graph`) allocate from the graph's private pool, as
with PyTorch's own allocator: memory a graph uses is never handed to other tensors while the
graph exists, and returns to the driver at an `empty_cache()` after the graph is gone.

Sleep and wake: what a thread allocates inside `with cuda_mem.torch.region("weights"):` comes from
a cache of that tag's own. `cuda_mem.torch.sleep("weights")` gives its device memory back (the
bytes copied to pinned host memory; `offload=False` drops them, for a KV cache that will be
recomputed) and `cuda_mem.torch.wake("weights")` maps new memory at the same addresses with the
bytes restored: tensors, `data_ptr()`s and captured CUDA graphs stay valid, with no re-capture.
While a tag sleeps, its allocations raise RuntimeError and its tensors' frees wait for the wake;
its tensors must not be used (nothing stops a kernel from reading them: it would fault). A sleep
waits for the work queued on its tensors' streams and those `Tensor.record_stream` named; work on
other streams that used them must have finished. `region_stats()` shows what sleeps.
"""
import contextlib
import ctypes
import os
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PATH = os.path.join(HERE, "libcuda_mem_torch_alloc.so")
FIELDS = (
    "allocated_current",
    "allocated_peak",
    "reserved_current",
    "reserved_peak",
    "alloc_count",
    "free_count",
    "failed_count",
    "limit",
    "cache_hits",
    "cache_misses",
    "segments",
    "segment_releases",
    "alloc_retries",
    "inactive_split_bytes",
)
BACKENDS = ("cache", "cache-compact", "pool")
# The pluggable allocator's optional hooks (setter on PyTorch's side, function in the library).
HOOKS = (
    ("set_record_stream_fn", "cuda_mem_torch_record_stream"),
    ("set_reset_fn", "cuda_mem_torch_empty_all_caches"),
    ("set_memory_fraction_fn", "cuda_mem_torch_set_memory_fraction"),
    # CUDA graphs: what a capture allocates comes from the graph's private pool.
    ("set_begin_allocate_to_pool", "cuda_mem_torch_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "cuda_mem_torch_end_allocate_to_pool"),
    ("set_release_pool", "cuda_mem_torch_release_pool"),
)
GRAPH_HOOKS = ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")
NO_LIMIT = (1 << 64) - 1


class Allocator:
    """The library's statistics and controls, through ctypes."""

    def __init__(self, path=DEFAULT_PATH):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.cuda_mem_torch_stats.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.lib.cuda_mem_torch_set_limit.argtypes = [ctypes.c_int, ctypes.c_uint64]
        self.lib.cuda_mem_torch_reset_peaks.argtypes = [ctypes.c_int]
        self.lib.cuda_mem_torch_empty_cache.argtypes = [ctypes.c_int]
        self.lib.cuda_mem_torch_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self.lib.cuda_mem_torch_last_error.restype = ctypes.c_size_t
        self.lib.cuda_mem_torch_record_history.argtypes = [ctypes.c_int, ctypes.c_size_t]
        self.lib.cuda_mem_torch_snapshot.argtypes = [ctypes.c_char_p]
        self.lib.cuda_mem_torch_dump_on_oom.argtypes = [ctypes.c_char_p]
        self.lib.cuda_mem_torch_select_backend.argtypes = [ctypes.c_char_p]
        self.lib.cuda_mem_torch_memory_stats.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        self.lib.cuda_mem_torch_memory_stats.restype = ctypes.c_ssize_t
        self.lib.cuda_mem_torch_enter_region.argtypes = [ctypes.c_char_p]
        self.lib.cuda_mem_torch_enter_region.restype = ctypes.c_int64
        self.lib.cuda_mem_torch_leave_region.argtypes = [ctypes.c_int64]
        self.lib.cuda_mem_torch_sleep.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
        self.lib.cuda_mem_torch_wake.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
        self.lib.cuda_mem_torch_region_stats.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        self.lib.cuda_mem_torch_region_stats.restype = ctypes.c_ssize_t
        self.lib.cuda_mem_torch_release_host_backups.argtypes = [ctypes.c_int]
        self.lib.cuda_mem_torch_release_host_backups.restype = ctypes.c_int64
        self.torch_allocator = None
        self.backend = None
        self.missing_hooks = None

    def select_backend(self, backend):
        """Chooses the memory behind the allocator ("cache", "cache-compact" or "pool"); only before the first
        allocation. Another name raises ValueError."""
        if not isinstance(backend, str):
            raise TypeError(f"backend is a str ({', '.join(BACKENDS)}), not {type(backend).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: use {', '.join(map(repr, BACKENDS))}")
        self._check(self.lib.cuda_mem_torch_select_backend(backend.encode()), "cuda_mem_torch_select_backend")
        self.backend = backend

    def install(self, backend=None):
        """Makes this PyTorch's CUDA allocator, over `backend` (None: CUDA_MEM_TORCH_ALLOC_CONF's
        choice, else "cache"); must run before PyTorch allocates CUDA memory. A bad
        CUDA_MEM_TORCH_ALLOC_CONF raises ValueError here."""
        import torch

        if self.lib.cuda_mem_torch_check_conf() != 0:
            raise ValueError(self.last_error())
        if backend is not None:
            self.select_backend(backend)
        else:
            self.backend = _conf_backend()
        self.torch_allocator = torch.cuda.memory.CUDAPluggableAllocator(
            self.path, "cuda_mem_torch_alloc", "cuda_mem_torch_free"
        )
        self._set_hooks()
        torch.cuda.memory.change_current_allocator(self.torch_allocator)
        return self

    def _set_hooks(self):
        """Points PyTorch's optional hooks of the pluggable allocator at the library, so that
        Tensor.record_stream, torch.cuda.empty_cache(), set_per_process_memory_fraction and CUDA
        graph captures reach it. A PyTorch without them leaves those calls doing nothing: listed in
        `missing_hooks` (with a warning for record_stream and for graphs, whose memory is then not
        protected)."""
        native = self.torch_allocator.allocator()
        self.missing_hooks = []
        for setter, function in HOOKS:
            set_hook = getattr(native, setter, None)
            if set_hook is None:
                self.missing_hooks.append(setter)
                continue
            set_hook(ctypes.cast(getattr(self.lib, function), ctypes.c_void_p).value)
        if "set_record_stream_fn" in self.missing_hooks:
            warnings.warn("this PyTorch cannot pass Tensor.record_stream to a pluggable allocator: "
                          "order other streams' use of a tensor before its free yourself")
        if any(hook in self.missing_hooks for hook in GRAPH_HOOKS):
            warnings.warn("this PyTorch cannot tell a pluggable allocator about CUDA graph captures: "
                          "memory a captured graph uses may be handed out again; do not capture graphs")

    def _check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: {self.last_error()}")

    def last_error(self):
        buffer = ctypes.create_string_buffer(1024)
        self.lib.cuda_mem_torch_last_error(buffer, len(buffer))
        return buffer.value.decode(errors="replace")

    def stats(self, device=0):
        """The device's figures: allocated/reserved current and peak (bytes), alloc/free/failed
        counts, the limit (None when unlimited), and requests served from cached memory, requests
        that took new memory, and segments held (the last three 0 for the pool backend)."""
        values = (ctypes.c_uint64 * len(FIELDS))()
        self._check(self.lib.cuda_mem_torch_stats(_ordinal(device), values, len(FIELDS)), "cuda_mem_torch_stats")
        stats = dict(zip(FIELDS, values))
        stats["limit"] = None if stats["limit"] == NO_LIMIT else stats["limit"]
        return stats

    def memory_stats(self, device=0):
        """The device's figures under torch.cuda.memory_stats()'s key names (those this allocator
        counts: allocated_bytes.all.current/peak, reserved_bytes.all.current/peak, allocation.all.*,
        segment.all.current, num_device_alloc/free, num_alloc_retries, num_ooms,
        inactive_split_bytes.all.current)."""
        size = 4096
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = self.lib.cuda_mem_torch_memory_stats(_ordinal(device), buffer, size)
            if n < 0:
                raise RuntimeError(f"cuda_mem_torch_memory_stats: {self.last_error()}")
            if n < size:
                break
            size = n + 1
        return {key: int(value) for key, value in (line.split() for line in buffer.value.decode().splitlines())}

    def set_limit(self, device, nbytes):
        """Refuses allocations that would take the device's allocated bytes above `nbytes`
        (None: no limit)."""
        limit = NO_LIMIT if nbytes is None else _non_negative(nbytes, "the limit")
        self._check(self.lib.cuda_mem_torch_set_limit(_ordinal(device), limit), "cuda_mem_torch_set_limit")

    def reset_peaks(self, device=0):
        self._check(self.lib.cuda_mem_torch_reset_peaks(_ordinal(device)), "cuda_mem_torch_reset_peaks")

    def empty_cache(self, device=0):
        """Returns the device's cached memory that no tensor uses to the driver (waits for the
        work that last used it)."""
        self._check(self.lib.cuda_mem_torch_empty_cache(_ordinal(device)), "cuda_mem_torch_empty_cache")

    def record_history(self, device=0, max_entries=100_000):
        """Records the device's last `max_entries` allocations and frees (0 stops)."""
        self._check(self.lib.cuda_mem_torch_record_history(_ordinal(device), _non_negative(max_entries, "max_entries")), "cuda_mem_torch_record_history")

    def snapshot(self, path):
        """Writes a snapshot (live allocations since recording began, and the trace) in the
        format of torch.cuda.memory._snapshot(), for `python -m torch.cuda._memory_viz`."""
        self._check(self.lib.cuda_mem_torch_snapshot(_path(path)), "cuda_mem_torch_snapshot")

    @contextlib.contextmanager
    def region(self, tag):
        """Tags what this thread allocates inside the `with` block (outside CUDA graph captures,
        whose memory comes from the graph's pool): it comes from the cache of `tag`, which
        `sleep` and `wake` act on. Regions nest; leaving one puts back the tag before it."""
        previous = self.lib.cuda_mem_torch_enter_region(_tag(tag))
        if previous < 0:
            raise ValueError(f"region({tag!r}): {self.last_error()}")
        try:
            yield
        finally:
            self._check(self.lib.cuda_mem_torch_leave_region(previous), "cuda_mem_torch_leave_region")

    def sleep(self, tags=None, offload=True, device=None):
        """Gives the device memory of the regions `tags` (a tag, a list of them, or None: every
        awake region on the device) back to the driver, their addresses kept; their bytes go to
        pinned host memory unless `offload` is False. Returns the bytes given back. A tag no region
        used, or one asleep already, raises RuntimeError (the tags before it stay asleep)."""
        names = None if tags is None else _tags(tags)
        device = _device(device)
        if names is None:
            names = self._regions_in("awake", device)
        total = 0
        for name in names:
            slept = ctypes.c_uint64()
            status = self.lib.cuda_mem_torch_sleep(device, name.encode(), 1 if offload else 0, ctypes.byref(slept))
            self._check(status, f"sleep({name!r})")
            total += slept.value
        return total

    def wake(self, tags=None, device=None):
        """Maps new device memory at the sleeping regions' addresses (`tags`: a tag, a list, or
        None: every sleeping region on the device), with their bytes when the sleep kept them.
        Returns the bytes mapped. Out of memory raises RuntimeError ("out of memory") and leaves
        the region asleep with everything kept: call again once memory is free. A tag that is
        awake raises RuntimeError."""
        names = None if tags is None else _tags(tags)
        device = _device(device)
        if names is None:
            names = [n for state in ("kept", "dropped") for n in self._regions_in(state, device)]
        total = 0
        for name in names:
            woke = ctypes.c_uint64()
            self._check(self.lib.cuda_mem_torch_wake(device, name.encode(), ctypes.byref(woke)), f"wake({name!r})")
            total += woke.value
        return total

    def region_stats(self, device=None):
        """The regions on the device, by tag: bytes and blocks PyTorch holds, bytes of device
        memory the region's cache holds (`reserved`), `state` ("awake", or "kept"/"dropped" while
        asleep with or without its bytes), bytes the sleep gave back (`slept`) and pinned host
        bytes held for them (`host_backup`)."""
        device = _device(device)
        size = 4096
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = self.lib.cuda_mem_torch_region_stats(device, buffer, size)
            if n < 0:
                raise RuntimeError(f"cuda_mem_torch_region_stats: {self.last_error()}")
            if n < size:
                break
            size = n + 1
        stats = {}
        for line in buffer.value.decode().splitlines():
            name, allocated, blocks, reserved, state, slept, host_backup = line.split()
            stats[name] = {"allocated": int(allocated), "blocks": int(blocks), "reserved": int(reserved),
                           "state": state, "slept": int(slept), "host_backup": int(host_backup)}
        return stats

    def release_host_backups(self, device=None):
        """Frees the pinned host memory the regions keep for their next sleep (each awake region
        keeps its last sleep's, so that the next allocates none; a sleeping region keeps what
        holds its bytes). Returns the bytes freed."""
        freed = self.lib.cuda_mem_torch_release_host_backups(_device(device))
        if freed < 0:
            raise RuntimeError(f"cuda_mem_torch_release_host_backups: {self.last_error()}")
        return freed

    def _regions_in(self, state, device):
        return [name for name, stats in self.region_stats(device).items() if stats["state"] == state]

    def dump_on_oom(self, path):
        """Writes the snapshot to `path` whenever an allocation is refused for lack of memory
        (None: never)."""
        encoded = None if path is None else _path(path)
        self._check(self.lib.cuda_mem_torch_dump_on_oom(encoded), "cuda_mem_torch_dump_on_oom")


_installed = None


def _non_negative(value, what):
    """`value` as a non-negative int (ctypes would wrap a negative one), else TypeError/ValueError."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} is an int, not {type(value).__name__}")
    value = value.__index__()
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"{what} must be a non-negative 64-bit integer (got {value})")
    return value


def _path(path):
    """`path` as the library takes it: bytes without a NUL (C would read the path only up to it)."""
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        raise ValueError(f"path {path!r} holds a NUL byte")
    return encoded


def _ordinal(device):
    """A device ordinal, checked as cuda_mem's functions check theirs."""
    value = _non_negative(device, "device")
    if value > 0x7FFFFFFF:
        raise ValueError(f"device {value}: no such ordinal")
    return value


def _tag(tag):
    """A region tag as the library takes it: a str of 1 to 64 bytes without whitespace."""
    if not isinstance(tag, str):
        raise TypeError(f"a region tag is a str, not {type(tag).__name__}")
    encoded = tag.encode()
    if b"\0" in encoded:
        raise ValueError(f"region tag {tag!r} holds a NUL byte")
    return encoded


def _tags(tags):
    """`tags` (a tag or an iterable of them) as a list of checked names."""
    if isinstance(tags, str):
        names = [tags]
    else:
        try:
            names = list(tags)
        except TypeError:
            raise TypeError(f"tags are a str or an iterable of str, not {type(tags).__name__}") from None
    for name in names:
        _tag(name)
    return names


def _device(device):
    """The ordinal of `device` (None: PyTorch's current device; an int or a torch.device)."""
    if device is None:
        import torch

        return torch.cuda.current_device()
    if hasattr(device, "index") and not isinstance(device, int):
        return _ordinal(0 if device.index is None else device.index)
    return _ordinal(device)


def _conf_backend():
    """The backend CUDA_MEM_TORCH_ALLOC_CONF names (checked by the library first), else "cache"."""
    for item in os.environ.get("CUDA_MEM_TORCH_ALLOC_CONF", "").split(","):
        key, _, value = item.partition(":")
        if key.strip() == "backend":
            return {"cache-compact": "cache"}.get(value.strip(), value.strip())
    return "cache"


def install(path=DEFAULT_PATH, backend=None):
    """Loads the library and installs it as PyTorch's CUDA allocator, over `backend`."""
    global _installed
    _installed = Allocator(path).install(backend)
    return _installed


def _allocator():
    if _installed is None:
        raise RuntimeError("cuda_mem.torch.install() has not run")
    return _installed


def region(tag):
    """`with cuda_mem.torch.region("weights"):` tags what this thread allocates inside (see
    Allocator.region)."""
    return _allocator().region(tag)


def sleep(tags=None, offload=True, device=None):
    """Puts regions to sleep (see Allocator.sleep); returns the bytes given back."""
    return _allocator().sleep(tags, offload, device)


def wake(tags=None, device=None):
    """Wakes sleeping regions (see Allocator.wake); returns the bytes mapped."""
    return _allocator().wake(tags, device)


def region_stats(device=None):
    """The regions' figures by tag (see Allocator.region_stats)."""
    return _allocator().region_stats(device)


def release_host_backups(device=None):
    """Frees the pinned host memory kept for the regions' next sleeps (see
    Allocator.release_host_backups); returns its bytes."""
    return _allocator().release_host_backups(device)


def memory_stats(device=0):
    """torch.cuda.memory_stats() for the installed allocator (see Allocator.memory_stats)."""
    if _installed is None:
        raise RuntimeError("cuda_mem.torch.install() has not run")
    return _installed.memory_stats(device)
