//! A PyTorch CUDA allocator backed by cuda-mem: the functions
//! `torch.cuda.memory.CUDAPluggableAllocator(path, "cuda_mem_torch_alloc", "cuda_mem_torch_free")`
//! loads, with statistics and a limit read and set through more exported functions (ctypes;
//! `cuda_mem.torch` in the `cuda-mem` wheel wraps them for PyTorch, `cuda_mem.cupy` for CuPy:
//! `cuda-mem-py/package/cuda_mem/`).
//!
//! Each device gets a device caching allocator of its own (cuda-mem's `DeviceCache`, behind the
//! [`AllocatorBackend`] trait as [`CacheBackend`]): blocks cached per stream, reused on PyTorch's stream
//! at once and moved between streams only behind events, as PyTorch's own allocator does. A
//! retaining `MemPool` ([`PoolBackend`]: `cudaMallocFromPoolAsync` / `cudaFreeAsync`) can be
//! chosen instead before the first allocation (`cuda_mem_torch_select_backend`).
//!
//! Nothing unwinds across the C boundary: panics are caught and become a failed call. A refused
//! allocation (over the limit, or out of memory) is thrown to PyTorch as a C++ exception, because
//! PyTorch's pluggable allocator does not check for a null pointer; PyTorch raises it as
//! `RuntimeError` with cuda-mem's message. `cuda_mem_torch_try_alloc` returns null instead, for
//! other callers.
//!
//! **Arguments.** What a caller can get wrong and the library can see is refused, with the
//! message kept for `cuda_mem_torch_last_error`: a free of memory the device's allocator did not
//! hand out (or freed already) or with another size, a negative size, a device that does not
//! exist, null strings, output buffers and capture filters, graph pools no capture uses. What it
//! cannot see is each function's `# Safety` contract: live streams (below), buffers as long as
//! the length given, NUL-terminated strings, and no use of a block after its free.
//!
//! **Streams.** The allocator keeps every stream it is given for as long as it holds memory freed
//! there, and records events on it: a stream passed in must never be destroyed. PyTorch's default
//! stream and the streams of its pool never are; a stream wrapped with `torch.cuda.ExternalStream`
//! must live as long as the process when this allocator is installed.

pub mod alloc_conf;
mod allocator;
mod backend;
mod cache;
mod device_cache_source;
pub mod graphs;
mod pool;
pub mod regions;
mod regions_ffi;

pub use allocator::{DeviceAllocator, NO_LIMIT, Stats};
pub use backend::{AllocatorBackend, Figures, Reserved};
pub use cache::{BlockSource, CacheBackend};
pub use device_cache_source::{DeviceCacheSource, FreshMemory, RegionCaches};
pub use graphs::{CaptureFilter, GraphPools, PoolId, PoolMemory};
pub use pool::PoolBackend;
pub use regions::{RegionBackend, RegionMemory, RegionStats, Regions};
pub use regions_ffi::{
    cuda_mem_torch_enter_region, cuda_mem_torch_leave_region, cuda_mem_torch_region_stats,
    cuda_mem_torch_release_host_backups, cuda_mem_torch_sleep, cuda_mem_torch_wake,
};

use cuda_mem::resource::StreamRef;
use cuda_mem::{CudaError, Device, ErrorKind, Result};
use cuda_mem_snapshot::{MemorySnapshot, snapshot_of};
use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// The memory behind one device's allocator.
#[derive(Debug)]
pub enum DeviceBackend {
    /// cuda-mem's device caching allocator (the default).
    Cache(CacheBackend<DeviceCacheSource>),
    /// A retaining memory pool.
    Pool(PoolBackend),
}

/// Which memory the devices' allocators are made over ([`cuda_mem_torch_select_backend`], or
/// the `backend` key of [`alloc_conf::VARIABLE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BackendChoice {
    /// cuda-mem's device cache, with the parameters [`alloc_conf::VARIABLE`] sets (by default
    /// [`Config::default`](cuda_mem::caching::Config::default): one policy for speed and a reserve that follows what is in use).
    Cache = 0,
    /// A retaining memory pool.
    Pool = 1,
}

/// No backend was chosen by a call: the environment's choice, else the cache.
const UNCHOSEN: u8 = u8::MAX;

impl BackendChoice {
    /// Names and what they choose; `cache-compact` is the cache (it was the cache's compact
    /// parameters when the cache had two sets, and they are its only ones now).
    const NAMES: [(&'static str, BackendChoice); 3] =
        [("cache", Self::Cache), ("cache-compact", Self::Cache), ("pool", Self::Pool)];

    fn from_name(name: &str) -> Option<Self> {
        Self::NAMES.iter().find(|(n, _)| *n == name).map(|&(_, choice)| choice)
    }

    /// The choice a call made, if one did.
    fn chosen() -> Option<Self> {
        match BACKEND.load(Ordering::Relaxed) {
            0 => Some(Self::Cache),
            1 => Some(Self::Pool),
            _ => None,
        }
    }
}

impl DeviceBackend {
    /// The backend for `device`: the choice a call made, else the environment's; and that choice.
    fn new(device: Device) -> Result<(Self, BackendChoice)> {
        let conf = alloc_conf::AllocConf::from_env()?;
        let choice = BackendChoice::chosen().or(conf.backend).unwrap_or(BackendChoice::Cache);
        let backend = match choice {
            BackendChoice::Cache => Self::Cache(CacheBackend::new(DeviceCacheSource::new(device, conf.config)?)),
            BackendChoice::Pool => Self::Pool(PoolBackend::new(device)?),
        };
        Ok((backend, choice))
    }
}

impl AllocatorBackend for DeviceBackend {
    #[inline]
    fn allocate(&self, bytes: usize, stream: StreamRef<'static>) -> Result<NonNull<u8>> {
        match self {
            Self::Cache(cache) => cache.allocate(bytes, stream),
            Self::Pool(pool) => pool.allocate(bytes, stream),
        }
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'static>) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Self::Cache(cache) => cache.deallocate(ptr, bytes, stream),
                Self::Pool(pool) => pool.deallocate(ptr, bytes, stream),
            }
        }
    }

    fn check_free(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()> {
        match self {
            Self::Cache(cache) => cache.check_free(ptr, bytes),
            Self::Pool(pool) => pool.check_free(ptr, bytes),
        }
    }

    fn record_stream(&self, ptr: NonNull<u8>, stream: StreamRef<'static>) -> Result<bool> {
        match self {
            Self::Cache(cache) => AllocatorBackend::record_stream(cache, ptr, stream),
            Self::Pool(pool) => pool.record_stream(ptr, stream),
        }
    }

    fn figures(&self) -> Figures {
        match self {
            Self::Cache(cache) => cache.figures(),
            Self::Pool(pool) => pool.figures(),
        }
    }

    fn reset_peak(&self) {
        match self {
            Self::Cache(cache) => cache.reset_peak(),
            Self::Pool(pool) => pool.reset_peak(),
        }
    }

    fn release_cached(&self) -> Result<()> {
        match self {
            Self::Cache(cache) => cache.release_cached(),
            Self::Pool(pool) => pool.release_cached(),
        }
    }

    fn hold_event_queries(&self, hold: bool) {
        if let Self::Cache(cache) = self {
            cache.hold_event_queries(hold);
        }
    }
}

/// The [`BackendChoice`] new devices' allocators are made over.
static BACKEND: AtomicU8 = AtomicU8::new(UNCHOSEN);

/// Serializes the creation of devices' allocators with the choice of backend.
static CREATING: Mutex<()> = Mutex::new(());

/// One device's allocator.
struct Entry {
    allocator: DeviceAllocator<DeviceBackend>,
}

static SLOTS: OnceLock<Box<[OnceLock<Entry>]>> = OnceLock::new();

/// The allocator of device `ordinal`, created at first use.
fn entry(ordinal: c_int) -> Result<&'static Entry> {
    let slots = match SLOTS.get() {
        Some(slots) => slots,
        None => {
            let count = Device::count()?;
            SLOTS.get_or_init(|| (0..count).map(|_| OnceLock::new()).collect())
        }
    };
    let slot = usize::try_from(ordinal).ok().and_then(|i| slots.get(i)).ok_or_else(|| {
        let kind = ErrorKind::InvalidDevice { ordinal, count: slots.len() as c_int };
        CudaError::new(kind, "cuda-mem's PyTorch allocator")
    })?;
    if let Some(entry) = slot.get() {
        return Ok(entry);
    }
    let _creating = CREATING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(entry) = slot.get() {
        return Ok(entry);
    }
    let device = Device::new(ordinal as usize)?;
    let (backend, choice) = DeviceBackend::new(device)?;
    // Every device gets the same backend: later devices, and later calls, see this choice.
    BACKEND.store(choice as u8, Ordering::Relaxed);
    let config = alloc_conf::AllocConf::from_env()?.config;
    let pools = GraphPools::new(Box::new(FreshMemory(device)), config.clone());
    let regions = Regions::new(Box::new(RegionCaches { device, config }));
    let allocator = DeviceAllocator::new(backend, ordinal).with_graph_pools(pools).with_regions(regions);
    Ok(slot.get_or_init(|| Entry { allocator }))
}

/// The stream handle PyTorch passed, as the `'static` reference the backends keep.
///
/// # Safety
/// `stream` is a stream handle that is never destroyed, or a built-in one (0,
/// `cudaStreamLegacy`, `cudaStreamPerThread`).
unsafe fn pytorch_stream(stream: *mut c_void) -> StreamRef<'static> {
    // SAFETY: forwarded from the caller.
    unsafe { StreamRef::from_raw(stream.cast()) }
}

thread_local! {
    /// The message of this thread's last failed call.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn remember(message: String) {
    // Not while the thread's storage is torn down (a tensor freed by a thread-local destructor):
    // `with` would panic, and a panic cannot leave an `extern "C"` function.
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = message);
}

/// Runs `f`, turning a panic into an error: nothing unwinds into C.
fn guarded<R>(what: &'static str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(CudaError::new(ErrorKind::InvalidArgument("a panic inside the allocator"), what)))
}

/// # Safety
/// As [`cuda_mem_torch_alloc`].
unsafe fn try_alloc(size: isize, device: c_int, stream: *mut c_void) -> Result<NonNull<u8>> {
    // SAFETY: forwarded from the caller.
    let stream = unsafe { pytorch_stream(stream) };
    guarded("cuda_mem_torch_alloc", || {
        let size = usize::try_from(size)
            .map_err(|_| CudaError::new(ErrorKind::InvalidArgument("a negative size"), format!("allocating {size}")))?;
        entry(device)?.allocator.allocate(size, stream).inspect_err(|err| {
            if err.is_out_of_memory() {
                dump_on_oom();
            }
        })
    })
}

/// Where to write a snapshot when an allocation is refused for lack of memory.
static DUMP_ON_OOM: Mutex<Option<PathBuf>> = Mutex::new(None);

fn dump_on_oom() {
    let path = DUMP_ON_OOM.lock().unwrap_or_else(PoisonError::into_inner).clone();
    if let Some(path) = path
        && let Err(io) = snapshot().write(&path)
    {
        remember(format!("writing the out-of-memory snapshot to {}: {io}", path.display()));
    }
}

/// The snapshot of every device whose allocator records its history.
fn snapshot() -> MemorySnapshot {
    let recorders: Vec<_> = entries().filter_map(|entry| entry.allocator.history()).collect();
    snapshot_of(recorders.iter().map(|r| &**r))
}

unsafe extern "C-unwind" {
    /// Throws a C++ exception with `message` (shim/throw.cpp).
    fn cuda_mem_torch_throw(message: *const c_char, len: usize) -> !;
}

/// The allocation function for `CUDAPluggableAllocator`: `size` bytes on `device`, ordered on
/// `stream`. A refusal is thrown as a C++ `std::runtime_error` (PyTorch raises `RuntimeError`
/// with its message, which starts "CUDA out of memory" when it is one and says why).
///
/// # Safety
/// `stream` is a stream of `device` that is never destroyed (PyTorch's default and pooled
/// streams; see the crate documentation), or a built-in handle; called by PyTorch (C++), which
/// can receive the exception.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn cuda_mem_torch_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    // SAFETY: forwarded from the caller.
    let err = match unsafe { try_alloc(size, device, stream) } {
        Ok(ptr) => return ptr.as_ptr().cast(),
        Err(err) => err,
    };
    let (message, len) = exception_text(err);
    // SAFETY: the buffer holds `len` bytes; the exception unwinds through this `C-unwind` frame,
    // which holds nothing to drop, into PyTorch.
    unsafe { cuda_mem_torch_throw(message.as_ptr().cast(), len) }
}

/// The message of the C++ exception for `err` (also remembered for
/// [`cuda_mem_torch_last_error`]), in a fixed buffer: no value with a destructor is then live in
/// the frame the exception passes through.
fn exception_text(err: CudaError) -> ([u8; 1024], usize) {
    let mut message = [0u8; 1024];
    let text = if err.is_out_of_memory() {
        format!("CUDA out of memory (cuda-mem allocator): {err}")
    } else {
        format!("cuda-mem allocator: {err}")
    };
    let len = text.len().min(message.len());
    message[..len].copy_from_slice(&text.as_bytes()[..len]);
    remember(text);
    (message, len)
}

/// The allocators created so far.
fn entries() -> impl Iterator<Item = &'static Entry> {
    SLOTS.get().into_iter().flat_map(|slots| slots.iter()).filter_map(OnceLock::get)
}

/// The hook for `Tensor.record_stream` (the `set_record_stream_fn` of PyTorch's pluggable
/// allocator): the block at `ptr` is also used by work on `stream`, so its free waits for the
/// work queued there by then. Memory this allocator did not hand out is left alone. A backend
/// that cannot honour it (the pool) throws, as PyTorch would otherwise reuse memory in use.
///
/// # Safety
/// `stream` is never destroyed, or is a built-in handle (as for [`cuda_mem_torch_alloc`]); called
/// by PyTorch (C++), which can receive the exception.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn cuda_mem_torch_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    let Some(ptr) = NonNull::new(ptr.cast::<u8>()) else { return };
    // SAFETY: forwarded from the caller.
    let stream = unsafe { pytorch_stream(stream) };
    let recorded = guarded("cuda_mem_torch_record_stream", || {
        for entry in entries() {
            if entry.allocator.record_stream(ptr, stream)? {
                break;
            }
        }
        Ok(())
    });
    let Err(err) = recorded else { return };
    let (message, len) = exception_text(err);
    // SAFETY: as in `cuda_mem_torch_alloc`.
    unsafe { cuda_mem_torch_throw(message.as_ptr().cast(), len) }
}

/// The hook for `torch.cuda.empty_cache()` (`set_reset_fn`): every device's cached memory that
/// no tensor uses goes back to the driver. A failure is remembered for
/// [`cuda_mem_torch_last_error`].
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_empty_all_caches() {
    let emptied =
        guarded("cuda_mem_torch_empty_all_caches", || entries().try_for_each(|e| e.allocator.release_cached()));
    if let Err(err) = emptied {
        remember(err.to_string());
    }
}

/// The hook for `torch.cuda.set_per_process_memory_fraction(fraction, device)`
/// (`set_memory_fraction_fn`): the device's limit becomes `fraction` of its total memory. The
/// limit bounds the bytes PyTorch holds (the native allocator's bounds what it reserves). A
/// fraction outside 0..=1 is thrown back as an error.
///
/// # Safety
/// Called by PyTorch (C++), which can receive the exception.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn cuda_mem_torch_set_memory_fraction(fraction: f64, device: c_int) {
    let set = guarded("cuda_mem_torch_set_memory_fraction", || {
        if !(0.0..=1.0).contains(&fraction) {
            let kind = ErrorKind::InvalidArgument("a memory fraction outside 0..=1");
            return Err(CudaError::new(kind, format!("set_per_process_memory_fraction({fraction}, {device})")));
        }
        let entry = entry(device)?;
        let (_, total) = Device::new(device as usize)?.mem_get_info()?;
        entry.allocator.set_limit((total as f64 * fraction) as usize);
        Ok(())
    });
    let Err(err) = set else { return };
    let (message, len) = exception_text(err);
    // SAFETY: as in `cuda_mem_torch_alloc`.
    unsafe { cuda_mem_torch_throw(message.as_ptr().cast(), len) }
}

/// Like [`cuda_mem_torch_alloc`], but returns null when refused (the reason is in
/// [`cuda_mem_torch_last_error`]).
///
/// # Safety
/// As [`cuda_mem_torch_alloc`]: `stream` is never destroyed, or is a built-in handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_try_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    // SAFETY: forwarded from the caller.
    match unsafe { try_alloc(size, device, stream) } {
        Ok(ptr) => ptr.as_ptr().cast(),
        Err(err) => {
            remember(err.to_string());
            std::ptr::null_mut()
        }
    }
}

/// The free function for `CUDAPluggableAllocator`: the block returns to `stream`'s cache,
/// reusable there at once (the pool backend: `cudaFreeAsync` on `stream`). Null is ignored. A
/// pointer `device`'s allocator did not hand out (or freed already), a size other than it was
/// allocated with, a negative size or a device that does not exist is refused: nothing is freed,
/// and the message is remembered for [`cuda_mem_torch_last_error`].
///
/// # Safety
/// Nothing uses the block after the work queued on `stream` (PyTorch's contract with its
/// allocators); `stream` is a stream of `device` that is never destroyed, or a built-in handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    const WHAT: &str = "cuda_mem_torch_free";
    let Some(ptr) = NonNull::new(ptr.cast::<u8>()) else { return };
    // SAFETY: forwarded from the caller.
    let stream = unsafe { pytorch_stream(stream) };
    let freed = guarded(WHAT, || {
        let size = usize::try_from(size).map_err(|_| {
            CudaError::new(ErrorKind::InvalidArgument("a negative size"), format!("{WHAT}({ptr:p}, {size})"))
        })?;
        // SAFETY: forwarded from the caller; the allocator refuses a pointer or size it did not
        // hand out.
        unsafe { entry(device)?.allocator.free(ptr, size, stream) }
    });
    if let Err(err) = freed {
        remember(err.to_string());
    }
}

/// Chooses the memory behind every device's allocator: `"cache"` (cuda-mem's device caching
/// allocator, the default; `"cache-compact"` names it too) or `"pool"` (a retaining `MemPool`),
/// over the `backend` key of `CUDA_MEM_TORCH_ALLOC_CONF`. Only before the first
/// allocation: returns 0, or -1 (message in [`cuda_mem_torch_last_error`]) for an unknown name
/// or once a device's allocator exists.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_select_backend(name: *const c_char) -> c_int {
    const WHAT: &str = "cuda_mem_torch_select_backend";
    let chosen = guarded(WHAT, || {
        if name.is_null() {
            return Err(CudaError::new(ErrorKind::InvalidArgument("a null backend name"), WHAT));
        }
        // SAFETY: NUL-terminated, per the caller.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let Some(choice) = BackendChoice::from_name(&name) else {
            let kind = ErrorKind::InvalidArgument("an unknown backend (\"cache\" or \"pool\")");
            return Err(CudaError::new(kind, format!("{WHAT}({name:?})")));
        };
        let _creating = CREATING.lock().unwrap_or_else(PoisonError::into_inner);
        let created = entries().next().is_some();
        if created && BackendChoice::chosen() != Some(choice) {
            let kind = ErrorKind::InvalidArgument("the backend is chosen before the first allocation");
            return Err(CudaError::new(kind, format!("{WHAT}({name:?})")));
        }
        BACKEND.store(choice as u8, Ordering::Relaxed);
        Ok(())
    });
    status(chosen)
}

/// Copies this thread's last error message into `buffer` (at most `len` bytes, NUL-terminated
/// when room is left; nothing when `buffer` is null) and returns its full length (0 while the
/// thread is exiting).
///
/// # Safety
/// `buffer` is null or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_last_error(buffer: *mut c_char, len: usize) -> usize {
    let copied = LAST_ERROR.try_with(|last| {
        let last = last.borrow();
        // SAFETY: the caller's promise about `buffer` and `len`.
        unsafe { copy_text(&last, buffer, len) };
        last.len()
    });
    copied.unwrap_or(0)
}

/// Copies as much of `text` as fits into `buffer` (`len` bytes), NUL-terminated when `len > 0`;
/// nothing when `buffer` is null.
///
/// # Safety
/// `buffer` is null or writable for `len` bytes.
unsafe fn copy_text(text: &str, buffer: *mut c_char, len: usize) {
    let n = text.len().min(len.saturating_sub(1));
    if !buffer.is_null() && len > 0 {
        // SAFETY: the caller gives `len` writable bytes; `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), n);
            *buffer.add(n) = 0;
        }
    }
}

/// 0 for success; -1 for failure, its message kept for [`cuda_mem_torch_last_error`].
fn status(result: Result<()>) -> c_int {
    match result {
        Ok(()) => 0,
        Err(err) => {
            remember(err.to_string());
            -1
        }
    }
}

/// Runs `f` on device `device`'s allocator: 0 on success, -1 on failure (message in
/// [`cuda_mem_torch_last_error`]).
fn with_allocator(
    device: c_int,
    what: &'static str,
    f: impl FnOnce(&DeviceAllocator<DeviceBackend>) -> Result<()>,
) -> c_int {
    status(guarded(what, || f(&entry(device)?.allocator)))
}

/// Writes up to `len` of the device's figures to `out`, in this order: allocated current and
/// peak, reserved current and peak (bytes), allocation, free and failure counts, the limit
/// (`u64::MAX`: none), then requests served from cached memory, requests that took new memory,
/// and segments held (the last three 0 for the pool backend). Returns 0, or -1 on failure (a
/// null or misaligned `out` with `len > 0` among them; message in [`cuda_mem_torch_last_error`]).
///
/// # Safety
/// `out` is null or writable for `len` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_stats(device: c_int, out: *mut u64, len: usize) -> c_int {
    const WHAT: &str = "cuda_mem_torch_stats";
    let n = len.min(Stats::LEN);
    if n > 0 && (out.is_null() || !out.is_aligned()) {
        remember(CudaError::new(ErrorKind::InvalidArgument("a null or misaligned output buffer"), WHAT).to_string());
        return -1;
    }
    with_allocator(device, WHAT, |a| {
        let figures = a.stats().to_array();
        if n > 0 {
            // SAFETY: `out` is non-null and aligned (checked), writable for `len >= n` values
            // (the caller's promise).
            unsafe { std::ptr::copy_nonoverlapping(figures.as_ptr(), out, n) };
        }
        Ok(())
    })
}

/// Writes the device's figures under `torch.cuda.memory_stats()`'s key names into `buffer` as
/// `key value` lines (at most `len` bytes, NUL-terminated when room is left; nothing when
/// `buffer` is null) and returns the text's full length, or -1 on failure (message in
/// [`cuda_mem_torch_last_error`]).
///
/// # Safety
/// `buffer` is null or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_memory_stats(device: c_int, buffer: *mut c_char, len: usize) -> isize {
    let mut text = String::new();
    let status = with_allocator(device, "cuda_mem_torch_memory_stats", |a| {
        for (key, value) in a.stats().pytorch_keys() {
            text.push_str(&format!("{key} {value}\n"));
        }
        Ok(())
    });
    if status != 0 {
        return -1;
    }
    // SAFETY: the caller's promise about `buffer` and `len`.
    unsafe { copy_text(&text, buffer, len) };
    isize::try_from(text.len()).unwrap_or(isize::MAX)
}

/// Checks `CUDA_MEM_TORCH_ALLOC_CONF` without making an allocator: 0 when it is unset or valid,
/// else -1 with the reason in [`cuda_mem_torch_last_error`].
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_check_conf() -> c_int {
    match guarded("cuda_mem_torch_check_conf", alloc_conf::AllocConf::from_env) {
        Ok(_) => 0,
        Err(err) => {
            remember(err.to_string());
            -1
        }
    }
}

/// Sets the device's limit in bytes (`u64::MAX`: none); allocations over it are refused, which
/// PyTorch raises as an out-of-memory `RuntimeError`. Returns 0, or -1 on failure.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_set_limit(device: c_int, bytes: u64) -> c_int {
    with_allocator(device, "cuda_mem_torch_set_limit", |a| {
        a.set_limit(usize::try_from(bytes).unwrap_or(NO_LIMIT));
        Ok(())
    })
}

/// Restarts the device's allocated and reserved peaks. Returns 0, or -1 on failure.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_reset_peaks(device: c_int) -> c_int {
    with_allocator(device, "cuda_mem_torch_reset_peaks", |a| {
        a.reset_peaks();
        Ok(())
    })
}

/// Returns the device's cached memory to the driver: every segment of the cache no block of which
/// PyTorch holds, after the work that used it has completed (the pool backend:
/// `cudaMemPoolTrimTo(0)`). Returns 0, or -1.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_empty_cache(device: c_int) -> c_int {
    with_allocator(device, "cuda_mem_torch_empty_cache", DeviceAllocator::release_cached)
}

unsafe extern "C" {
    /// A heap copy of the `std::function<bool(cudaStream_t)>` at `filter`, or null when copying
    /// threw (shim/graphs.cpp).
    fn cuda_mem_torch_filter_copy(filter: *const c_void) -> *mut c_void;
    /// 1 when the filter accepts `stream`, 0 when not, -1 when it threw.
    fn cuda_mem_torch_filter_accepts(filter: *mut c_void, stream: *mut c_void) -> c_int;
    /// Deletes a copy.
    fn cuda_mem_torch_filter_drop(filter: *mut c_void);
}

/// PyTorch's filter of a capture's streams (the shim's heap copy of its `std::function`).
struct TorchFilter(NonNull<c_void>);

// SAFETY: the filter is called only under the graph pools' lock, so from one thread at a time,
// and deleted once, by whichever thread ends the capture; PyTorch's filter reads the capture's
// id and queries the stream, which any thread may do.
unsafe impl Send for TorchFilter {}

impl graphs::CaptureFilter for TorchFilter {
    fn accepts(&self, stream: StreamRef<'static>) -> Option<bool> {
        // SAFETY: the copy is live until dropped; the stream is a handle PyTorch passed.
        match unsafe { cuda_mem_torch_filter_accepts(self.0.as_ptr(), stream.as_raw().cast()) } {
            1 => Some(true),
            0 => Some(false),
            _ => None,
        }
    }
}

impl Drop for TorchFilter {
    fn drop(&mut self) {
        // SAFETY: made by `cuda_mem_torch_filter_copy`, deleted once, here.
        unsafe { cuda_mem_torch_filter_drop(self.0.as_ptr()) }
    }
}

/// PyTorch's `MempoolId_t`, a `std::pair<unsigned long long, unsigned long long>`. The pair is
/// trivially copyable, so C++ passes it by value as it passes this struct (in two registers on
/// x86-64 and AArch64).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TorchPoolId {
    /// `first`.
    pub first: u64,
    /// `second`.
    pub second: u64,
}

/// The `set_begin_allocate_to_pool` hook: a CUDA graph capture into `pool` begins on `device`
/// (PyTorch's `beginAllocateToPool`). Until it ends, what the streams the filter accepts
/// allocate comes from the pool (see [`graphs`]). A refusal is thrown as a C++ exception, so
/// PyTorch raises it and does not capture with memory it could not protect.
///
/// PyTorch calls it as `void(int, MempoolId_t, std::function<bool(cudaStream_t)>)`: a
/// `std::function` is not trivially copyable, so the caller passes the address of its own
/// temporary (the C++ ABI of x86-64 and AArch64 Linux), destroyed by the caller after the call;
/// the allocator keeps a copy.
///
/// # Safety
/// Called by PyTorch with that signature (C++, which can receive the exception): `filter` points
/// to a live `std::function<bool(cudaStream_t)>` during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn cuda_mem_torch_begin_allocate_to_pool(
    device: c_int,
    pool: TorchPoolId,
    filter: *const c_void,
) {
    let begun = guarded("cuda_mem_torch_begin_allocate_to_pool", || {
        if filter.is_null() {
            return Err(CudaError::new(ErrorKind::InvalidArgument("a null capture filter"), "beginAllocateToPool"));
        }
        // SAFETY: `filter` points to a live `std::function` (the caller's contract).
        let copy = NonNull::new(unsafe { cuda_mem_torch_filter_copy(filter) }).ok_or_else(|| {
            CudaError::new(ErrorKind::InvalidArgument("a capture filter that cannot be copied"), "beginAllocateToPool")
        })?;
        let copy = TorchFilter(copy);
        entry(device)?.allocator.begin_capture((pool.first, pool.second), Box::new(copy))
    });
    let Err(err) = begun else { return };
    let (message, len) = exception_text(err);
    // SAFETY: as in `cuda_mem_torch_alloc`.
    unsafe { cuda_mem_torch_throw(message.as_ptr().cast(), len) }
}

/// The `set_end_allocate_to_pool_fn` hook: the capture into `pool` has ended (PyTorch's
/// `endAllocateToPool`). Never throws; a failure (a device that does not exist, a pool no capture
/// is underway into) is remembered for [`cuda_mem_torch_last_error`].
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_end_allocate_to_pool(device: c_int, pool: TorchPoolId) {
    with_allocator(device, "cuda_mem_torch_end_allocate_to_pool", |a| a.end_capture((pool.first, pool.second)));
}

/// The `set_release_pool` hook: a graph captured into `pool` is gone (PyTorch's `releasePool`,
/// also called from graph destructors: never throws). Once all are, the pool's memory goes back
/// to the driver at the next `empty_cache`. A pool no capture began into (or released as often
/// as captured into) changes nothing; the message is remembered for
/// [`cuda_mem_torch_last_error`].
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_release_pool(device: c_int, pool: TorchPoolId) {
    with_allocator(device, "cuda_mem_torch_release_pool", |a| a.release_pool((pool.first, pool.second)));
}

/// Records the last `max_entries` allocations and frees of `device` (0 stops), for
/// [`cuda_mem_torch_snapshot`]. Returns 0, or -1 on failure.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_record_history(device: c_int, max_entries: usize) -> c_int {
    with_allocator(device, "cuda_mem_torch_record_history", |a| {
        a.record_history(max_entries);
        Ok(())
    })
}

/// The path in a C string, or an error.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn path_of(path: *const c_char, what: &'static str) -> Result<PathBuf> {
    if path.is_null() {
        return Err(CudaError::new(ErrorKind::InvalidArgument("a null path"), what));
    }
    // SAFETY: NUL-terminated, per the caller.
    let path = unsafe { CStr::from_ptr(path) }.to_str();
    path.map(PathBuf::from).map_err(|_| CudaError::new(ErrorKind::InvalidArgument("a path that is not UTF-8"), what))
}

/// Writes a snapshot of every recording device (live allocations and the trace) to `path`, in
/// the pickle format of `torch.cuda.memory._snapshot()`, which
/// `python -m torch.cuda._memory_viz trace_plot` renders. Returns 0, or -1 on failure.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_snapshot(path: *const c_char) -> c_int {
    let written = guarded("cuda_mem_torch_snapshot", || {
        // SAFETY: forwarded from the caller.
        let path = unsafe { path_of(path, "cuda_mem_torch_snapshot") }?;
        snapshot().write(&path).map_err(|io| {
            CudaError::new(
                ErrorKind::InvalidArgument("the snapshot file could not be written"),
                format!("{}: {io}", path.display()),
            )
        })
    });
    status(written)
}

/// Writes the snapshot to `path` whenever an allocation is refused for lack of memory (null:
/// never). Returns 0, or -1 on failure.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_dump_on_oom(path: *const c_char) -> c_int {
    let set = guarded("cuda_mem_torch_dump_on_oom", || {
        // SAFETY: forwarded from the caller.
        let path = if path.is_null() { None } else { Some(unsafe { path_of(path, "cuda_mem_torch_dump_on_oom") }?) };
        *DUMP_ON_OOM.lock().unwrap_or_else(PoisonError::into_inner) = path;
        Ok(())
    });
    status(set)
}

#[cfg(test)]
mod tests {
    //! The C functions given what a caller can get wrong: each refuses with a message for
    //! `cuda_mem_torch_last_error`, with or without a GPU (without one, finding the device fails
    //! first where the argument is not checked before).
    use super::*;
    use std::ptr::{null, null_mut};

    fn last_error() -> String {
        let mut buffer = [0u8; 512];
        // SAFETY: the buffer holds 512 bytes.
        let len = unsafe { cuda_mem_torch_last_error(buffer.as_mut_ptr().cast(), buffer.len()) };
        String::from_utf8_lossy(&buffer[..len.min(511)]).into_owned()
    }

    /// Runs `call` on a clean slate and returns the error it left.
    fn error_of(call: impl FnOnce()) -> String {
        remember(String::new());
        call();
        last_error()
    }

    const UNKNOWN: *mut c_void = 0x1000 as *mut c_void;

    /// A free on the legacy default stream (handle 0) of memory no allocator handed out.
    fn free(ptr: *mut c_void, size: isize, device: c_int) {
        // SAFETY: the legacy stream's built-in handle; `ptr` is null or not the allocator's, so
        // nothing is freed (the point of the tests).
        unsafe { cuda_mem_torch_free(ptr, size, device, null_mut()) }
    }

    /// The error of a string function that must fail.
    fn refused(function: unsafe extern "C" fn(*const c_char) -> c_int, text: *const c_char) -> String {
        // SAFETY: the tests pass null or NUL-terminated strings.
        error_of(|| assert_eq!(unsafe { function(text) }, -1))
    }

    #[test]
    fn null_unknown_and_non_utf8_strings_are_refused() {
        let select = cuda_mem_torch_select_backend;
        assert!(refused(select, null()).contains("a null backend name"));
        assert!(refused(select, c"heap".as_ptr()).contains("an unknown backend"));
        assert!(refused(select, c"\xff".as_ptr()).contains("an unknown backend"));
        assert!(refused(cuda_mem_torch_snapshot, null()).contains("a null path"));
        assert!(refused(cuda_mem_torch_snapshot, c"\xff.pickle".as_ptr()).contains("not UTF-8"));
        assert!(refused(cuda_mem_torch_dump_on_oom, c"\xff".as_ptr()).contains("not UTF-8"));
        // SAFETY: null is allowed: no snapshot on out-of-memory.
        assert_eq!(unsafe { cuda_mem_torch_dump_on_oom(null()) }, 0);
    }

    #[test]
    fn frees_of_null_unknown_pointers_and_negative_sizes_free_nothing() {
        assert_eq!(error_of(|| free(null_mut(), 64, 0)), "", "null is ignored");
        let negative = error_of(|| free(UNKNOWN, -1, 0));
        assert!(negative.contains("a negative size"), "{negative}");
        for device in [0, 1, -1, c_int::MAX] {
            // With a GPU: "did not hand out" or "does not exist"; without: the driver's error.
            assert_ne!(error_of(|| free(UNKNOWN, 64, device)), "");
        }
        // SAFETY: the legacy default stream's built-in handle.
        let negative = error_of(|| assert!(unsafe { cuda_mem_torch_try_alloc(-1, 0, null_mut()) }.is_null()));
        assert!(negative.contains("a negative size"), "{negative}");
        // Null is ignored by `record_stream` (memory no allocator handed out is left alone).
        // SAFETY: as above.
        unsafe { cuda_mem_torch_record_stream(null_mut(), null_mut()) };
    }

    #[test]
    fn devices_that_do_not_exist_are_refused() {
        for device in [-1, c_int::MIN, 1 << 20, c_int::MAX] {
            let failed = |status: c_int| assert_eq!(status, -1, "device {device}");
            for error in [
                error_of(|| failed(cuda_mem_torch_set_limit(device, 1 << 20))),
                error_of(|| failed(cuda_mem_torch_reset_peaks(device))),
                error_of(|| failed(cuda_mem_torch_empty_cache(device))),
                error_of(|| failed(cuda_mem_torch_record_history(device, usize::MAX))),
                // SAFETY: null with length 0.
                error_of(|| failed(unsafe { cuda_mem_torch_stats(device, null_mut(), 0) })),
                // SAFETY: as above.
                error_of(|| assert_eq!(unsafe { cuda_mem_torch_memory_stats(device, null_mut(), 0) }, -1)),
                // SAFETY: the legacy default stream's handle.
                error_of(|| assert!(unsafe { cuda_mem_torch_try_alloc(64, device, null_mut()) }.is_null())),
                error_of(|| cuda_mem_torch_end_allocate_to_pool(device, TorchPoolId { first: 1, second: 0 })),
                error_of(|| cuda_mem_torch_release_pool(device, TorchPoolId { first: 1, second: 0 })),
            ] {
                assert_ne!(error, "", "device {device}");
            }
        }
    }

    #[test]
    fn null_short_and_misaligned_buffers_are_refused_or_written_within_their_length() {
        let mut values = [0u64; 2];
        let misaligned = values.as_mut_ptr().cast::<u8>().wrapping_add(1).cast::<u64>();
        for out in [null_mut(), misaligned] {
            // SAFETY: refused before anything is written.
            let error = error_of(|| assert_eq!(unsafe { cuda_mem_torch_stats(0, out, 1) }, -1));
            assert!(error.contains("a null or misaligned output buffer"), "{error}");
        }
        // The last error: its full length whatever the room; nothing written to null; cut and
        // NUL-terminated in a short buffer.
        remember("0123456789".into());
        // SAFETY: null is allowed whatever the length.
        assert_eq!(unsafe { cuda_mem_torch_last_error(null_mut(), 100) }, 10);
        let mut short = [b'x'; 6];
        // SAFETY: `short` holds 4 bytes and more.
        assert_eq!(unsafe { cuda_mem_torch_last_error(short.as_mut_ptr().cast(), 4) }, 10);
        assert_eq!(&short, b"012\0xx");
        // SAFETY: null with length 0.
        assert_eq!(unsafe { cuda_mem_torch_last_error(null_mut(), 0) }, 10);
    }

    /// A tensor freed by a thread-local destructor: the error is dropped once the thread's last
    /// error is gone, never a panic (which would abort in an `extern "C"` function).
    #[test]
    fn an_error_while_the_thread_exits_is_dropped() {
        struct FreesOnExit;
        impl Drop for FreesOnExit {
            fn drop(&mut self) {
                // Refused (a negative size) before anything else is looked at.
                free(UNKNOWN, -1, 0);
            }
        }
        thread_local! {
            static GUARD: FreesOnExit = const { FreesOnExit };
        }
        std::thread::spawn(|| {
            // Registered before the last error, so destroyed after it.
            GUARD.with(|_| ());
            remember("registered".into());
        })
        .join()
        .unwrap();
    }
}
