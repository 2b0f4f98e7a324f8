//! A PyTorch CUDA allocator backed by cuda-mem: the functions
//! `torch.cuda.memory.CUDAPluggableAllocator(path, "cuda_mem_torch_alloc", "cuda_mem_torch_free")`
//! loads, with statistics and a limit read and set through more exported functions (ctypes;
//! `python/cuda_mem_torch.py` in the bundle wraps them).
//!
//! Each device gets a retaining memory pool of its own (`cudaMallocFromPoolAsync` on PyTorch's
//! stream, `cudaFreeAsync` on the stream PyTorch recorded), behind the [`Backend`] trait.
//! Nothing unwinds across the C boundary: panics are caught and become a failed call. A refused
//! allocation (over the limit, or out of memory) is thrown to PyTorch as a C++ exception, because
//! PyTorch's pluggable allocator does not check for a null pointer; PyTorch raises it as
//! `RuntimeError` with cuda-mem's message. `cuda_mem_torch_try_alloc` returns null instead, for
//! other callers.

mod allocator;
mod backend;

pub use allocator::{DeviceAllocator, NO_LIMIT, Stats};
pub use backend::{Backend, PoolBackend, Reserved};

use cuda_mem::resource::StreamRef;
use cuda_mem::resource::snapshot::{MemorySnapshot, snapshot_of};
use cuda_mem::{CudaError, Device, ErrorKind, Result};
use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock, PoisonError};

/// One device's allocator and the device it serves.
struct Entry {
    device: Device,
    allocator: DeviceAllocator<PoolBackend>,
}

static SLOTS: OnceLock<Box<[OnceLock<Entry>]>> = OnceLock::new();

/// The allocator of device `ordinal`, created at first use.
fn entry(ordinal: c_int) -> Result<&'static Entry> {
    static CREATING: Mutex<()> = Mutex::new(());
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
    let allocator = DeviceAllocator::new(PoolBackend::new(device)?, ordinal);
    Ok(slot.get_or_init(|| Entry { device, allocator }))
}

/// Runs `f` with the stream PyTorch passed. A built-in handle (0, `cudaStreamLegacy`,
/// `cudaStreamPerThread`) means a stream of the current device, so the entry's device is made
/// current for the call (PyTorch may free from another device's context).
fn on_stream<R>(entry: &Entry, stream: *mut c_void, f: impl FnOnce(StreamRef<'_>) -> Result<R>) -> Result<R> {
    // SAFETY: PyTorch passes live stream handles (or built-in ones, resolved below).
    let stream_ref = unsafe { StreamRef::from_raw(stream.cast()) };
    if stream as usize > 2 {
        return f(stream_ref);
    }
    entry.device.run_on(|| f(stream_ref))?
}

thread_local! {
    /// The message of this thread's last failed call.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn remember(message: String) {
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

/// Runs `f`, turning a panic into an error: nothing unwinds into C.
fn guarded<R>(what: &'static str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(CudaError::new(ErrorKind::InvalidArgument("a panic inside the allocator"), what)))
}

fn try_alloc(size: isize, device: c_int, stream: *mut c_void) -> Result<NonNull<u8>> {
    guarded("cuda_mem_torch_alloc", || {
        let size = usize::try_from(size)
            .map_err(|_| CudaError::new(ErrorKind::InvalidArgument("a negative size"), format!("allocating {size}")))?;
        let entry = entry(device)?;
        on_stream(entry, stream, |s| entry.allocator.allocate(size, s)).inspect_err(|err| {
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
    if let Some(path) = path {
        if let Err(io) = snapshot().write(&path) {
            remember(format!("writing the out-of-memory snapshot to {}: {io}", path.display()));
        }
    }
}

/// The snapshot of every device whose allocator records its history.
fn snapshot() -> MemorySnapshot {
    let recorders: Vec<_> = SLOTS
        .get()
        .into_iter()
        .flat_map(|slots| slots.iter())
        .filter_map(|slot| slot.get()?.allocator.history())
        .collect();
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
/// `stream` is a live stream of `device`, or a built-in handle; called by PyTorch (C++), which
/// can receive the exception.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn cuda_mem_torch_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    let err = match try_alloc(size, device, stream) {
        Ok(ptr) => return ptr.as_ptr().cast(),
        Err(err) => err,
    };
    // The message goes into a fixed buffer, so no value with a destructor is live when the
    // exception passes through this frame.
    let mut message = [0u8; 1024];
    let text = if err.is_out_of_memory() {
        format!("CUDA out of memory (cuda-mem allocator): {err}")
    } else {
        format!("cuda-mem allocator: {err}")
    };
    let len = text.len().min(message.len());
    message[..len].copy_from_slice(&text.as_bytes()[..len]);
    remember(text);
    // SAFETY: the buffer holds `len` bytes; the exception unwinds through this `C-unwind` frame,
    // which holds nothing to drop, into PyTorch.
    unsafe { cuda_mem_torch_throw(message.as_ptr().cast(), len) }
}

/// Like [`cuda_mem_torch_alloc`], but returns null when refused (the reason is in
/// [`cuda_mem_torch_last_error`]).
///
/// # Safety
/// `stream` is a live stream of `device`, or a built-in handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_try_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    match try_alloc(size, device, stream) {
        Ok(ptr) => ptr.as_ptr().cast(),
        Err(err) => {
            remember(err.to_string());
            std::ptr::null_mut()
        }
    }
}

/// The free function for `CUDAPluggableAllocator`: `cudaFreeAsync` on `stream`.
///
/// # Safety
/// `ptr` came from this allocator with `size` and `device`, is freed once, and nothing uses it
/// after the work queued on `stream` (PyTorch's contract with its allocators).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    let Some(ptr) = NonNull::new(ptr.cast::<u8>()) else { return };
    let freed = guarded("cuda_mem_torch_free", || {
        let entry = entry(device)?;
        let size = usize::try_from(size).unwrap_or(0);
        on_stream(entry, stream, |s| {
            // SAFETY: forwarded from the caller.
            unsafe { entry.allocator.free(ptr, size, s) };
            Ok(())
        })
    });
    if let Err(err) = freed {
        remember(err.to_string());
    }
}

/// Copies this thread's last error message into `buffer` (at most `len` bytes, NUL-terminated
/// when room is left) and returns its full length.
///
/// # Safety
/// `buffer` is writable for `len` bytes (or null with `len` 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_last_error(buffer: *mut c_char, len: usize) -> usize {
    LAST_ERROR.with(|last| {
        let last = last.borrow();
        let n = last.len().min(len.saturating_sub(1));
        if !buffer.is_null() && len > 0 {
            // SAFETY: the caller gives `len` writable bytes; `n + 1 <= len`.
            unsafe {
                std::ptr::copy_nonoverlapping(last.as_ptr(), buffer.cast::<u8>(), n);
                *buffer.add(n) = 0;
            }
        }
        last.len()
    })
}

/// Runs `f` on device `device`'s allocator: 0 on success, -1 on failure (message in
/// [`cuda_mem_torch_last_error`]).
fn with_allocator(
    device: c_int,
    what: &'static str,
    f: impl FnOnce(&DeviceAllocator<PoolBackend>) -> Result<()>,
) -> c_int {
    match guarded(what, || f(&entry(device)?.allocator)) {
        Ok(()) => 0,
        Err(err) => {
            remember(err.to_string());
            -1
        }
    }
}

/// Writes up to `len` of the device's figures to `out`, in this order: allocated current and
/// peak, reserved current and peak (bytes), allocation, free and failure counts, the limit
/// (`u64::MAX`: none). Returns 0, or -1 on failure.
///
/// # Safety
/// `out` is writable for `len` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_stats(device: c_int, out: *mut u64, len: usize) -> c_int {
    with_allocator(device, "cuda_mem_torch_stats", |a| {
        let figures = a.stats().to_array();
        let n = len.min(Stats::LEN);
        if n > 0 && !out.is_null() {
            // SAFETY: the caller gives `len >= n` writable values.
            unsafe { std::ptr::copy_nonoverlapping(figures.as_ptr(), out, n) };
        }
        Ok(())
    })
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

/// Returns the device pool's cached memory to the driver (`cudaMemPoolTrimTo(0)`; memory of
/// frees still pending in stream order is released once they complete). Returns 0, or -1.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_empty_cache(device: c_int) -> c_int {
    with_allocator(device, "cuda_mem_torch_empty_cache", DeviceAllocator::release_cached)
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
    match written {
        Ok(()) => 0,
        Err(err) => {
            remember(err.to_string());
            -1
        }
    }
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
    match set {
        Ok(()) => 0,
        Err(err) => {
            remember(err.to_string());
            -1
        }
    }
}
