//! Pinned host memory for a sleep's backups, had in one registration: anonymous memory
//! (transparent huge pages asked for), its pages faulted in by several threads, then pinned with
//! one `cudaHostRegister`. `cudaHostAlloc` faults and pins page by page on the calling thread,
//! which made a first sleep of tens of GiB take seconds per GiB (docs/sleep-wake.md).

use crate::HostRegisterFlags;
use crate::error::{CudaError, ErrorKind, OomReport, Result};
use crate::raw;
use std::ffi::c_void;
use std::ptr::NonNull;

/// Most threads that fault the pages in.
const MAX_THREADS: usize = 8;

/// The page the threads step by: one write per base page faults it in (or its huge page).
const PAGE: usize = 4096;

/// Pinned host memory, registered with the driver, freed when dropped.
#[derive(Debug)]
pub(super) struct PinnedArena {
    ptr: NonNull<c_void>,
    bytes: usize,
}

// SAFETY: anonymous memory this value alone owns and frees; it is read and written only through
// raw pointers by copies its owner orders (behind the evictions' mutex), from any thread.
unsafe impl Send for PinnedArena {}
// SAFETY: `&PinnedArena` gives only the address and size.
unsafe impl Sync for PinnedArena {}

impl PinnedArena {
    /// `bytes` (> 0) of pinned host memory.
    pub fn new(bytes: usize) -> Result<Self> {
        let refused = |what: String| {
            let kind = ErrorKind::OutOfMemory { code: None, report: Box::new(OomReport::requested(bytes)) };
            CudaError::new(kind, what)
        };
        // SAFETY: a new private anonymous mapping; no existing memory is named.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(refused(format!(
                "mmap of {bytes} bytes for pinned backups: {}",
                std::io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(ptr).expect("mmap never returns null on success");
        // Advice only: where transparent huge pages are off, base pages serve as well.
        // SAFETY: the mapping made above.
        unsafe { libc::madvise(ptr.as_ptr(), bytes, libc::MADV_HUGEPAGE) };
        fault_in(ptr, bytes);
        // SAFETY: mapped for `bytes` above, unmapped only by `drop`, after `unregister`.
        if let Err(err) = unsafe { raw::host::register(ptr.as_ptr(), bytes, HostRegisterFlags::empty()) } {
            // SAFETY: the mapping made above, registered nowhere, used by nothing.
            unsafe { libc::munmap(ptr.as_ptr(), bytes) };
            return Err(err);
        }
        Ok(Self { ptr, bytes })
    }

    /// The start.
    pub fn ptr(&self) -> NonNull<c_void> {
        self.ptr
    }

    /// Its size.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Faults in every page of the `bytes` at `ptr`, a share each on a few threads.
fn fault_in(ptr: NonNull<c_void>, bytes: usize) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
    let share = bytes.div_ceil(threads).next_multiple_of(PAGE);
    let base = ptr.as_ptr() as usize;
    std::thread::scope(|scope| {
        for start in (0..bytes).step_by(share) {
            let end = (start + share).min(bytes);
            scope.spawn(move || {
                for offset in (start..end).step_by(PAGE) {
                    // SAFETY: within the mapping (offset < bytes), which no one else uses yet;
                    // each thread writes its own share.
                    unsafe { std::ptr::write_volatile((base + offset) as *mut u8, 0) };
                }
            });
        }
    });
}

impl Drop for PinnedArena {
    fn drop(&mut self) {
        // SAFETY: registered by `new`; no copy is pending on it (every copy is waited for before
        // the backups that use it can go). A failure leaves it registered: then it is not
        // unmapped either (the driver may still think it pinned).
        if raw::quiet(unsafe { raw::host::unregister(self.ptr.as_ptr()) }) {
            // SAFETY: the mapping made by `new`, unregistered, used by nothing.
            unsafe { libc::munmap(self.ptr.as_ptr(), self.bytes) };
        }
    }
}
