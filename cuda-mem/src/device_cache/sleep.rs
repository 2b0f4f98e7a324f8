//! Sleep and wake: a cache gives its device memory back and takes it again at the same
//! addresses, its blocks' bytes kept in pinned host memory in between.
//!
//! Safe code cannot touch sleeping memory: [`DeviceCache::sleep`] takes the cache by value, so no
//! [`CachedBuffer`](super::CachedBuffer) (which borrows the cache) and no view of one can live
//! across the sleep, and the [`SleepingCache`] it returns has no method that allocates, frees or
//! gives out memory. Raw blocks ([`DeviceCache::alloc_block`]) keep their addresses; their memory
//! is reached only through unsafe code, whose contract excludes the sleep.

use super::DeviceCache;
use crate::caching::{CachingStats, Keep};
use crate::error::{CudaError, ErrorKind, Result};
use std::fmt;

/// A [`DeviceCache`] asleep: no device memory behind its blocks, their addresses reserved and,
/// when the sleep kept them, their bytes in pinned host memory. [`SleepingCache::wake`] gives the
/// cache back.
pub struct SleepingCache {
    cache: DeviceCache,
    slept: usize,
}

/// A sleep or wake that failed, with what it was called on, unchanged: the awake cache for a
/// sleep (every block mapped, with its bytes), the sleeping one for a wake (everything it kept
/// still kept): the call can be tried again.
pub struct SleepError<T> {
    /// What the call was made on.
    pub cache: T,
    /// Why it failed.
    pub error: CudaError,
}

impl<T> fmt::Debug for SleepError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SleepError").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<T> fmt::Display for SleepError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<T> std::error::Error for SleepError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl DeviceCache {
    /// Puts the cache to sleep: waits for the work queued so far on the device (a
    /// `cudaDeviceSynchronize`: a buffer used on another stream and then forgotten leaves work
    /// the cache cannot see; [`DeviceCache::sleep_in_place`] waits only for its streams' work),
    /// returns its free memory to the device
    /// (as [`DeviceCache::empty_cache`]), copies the bytes of the pages behind the blocks still
    /// allocated (raw blocks, and those out through [`MemoryResource`](crate::resource::MemoryResource))
    /// to pinned host memory when `keep` is [`Keep::Contents`], and gives those pages back to
    /// the device too, keeping their addresses reserved. Device memory in use afterwards is none
    /// of the cache's.
    ///
    /// Fails with the cache returned as it was: [`ErrorKind::Unsupported`](crate::ErrorKind)
    /// without virtual memory management (segments from `cudaMalloc` cannot keep their
    /// addresses), or the runtime's error (no pinned memory for the copies, say).
    #[allow(clippy::result_large_err, reason = "the error gives the cache back by value, as the success does")]
    pub fn sleep(self, keep: Keep) -> std::result::Result<SleepingCache, SleepError<DeviceCache>> {
        if self.page_bytes().is_none() {
            let kind = ErrorKind::Unsupported("sleep needs the driver's virtual memory management");
            let error = CudaError::new(kind, "DeviceCache::sleep");
            return Err(SleepError { cache: self, error });
        }
        // Work on a block may be queued on a stream the cache does not know of, by a buffer that
        // was used there (`use_on`) and then forgotten (`mem::forget` ends its borrow of the
        // cache): only the device's whole queue covers it.
        if let Err(error) = self.device.synchronize() {
            return Err(SleepError { cache: self, error });
        }
        // SAFETY: the cache is owned here, so no `CachedBuffer` or view of one lives, and the
        // device has finished all work queued so far; raw blocks' memory is used only by unsafe
        // code, whose contract (`alloc_block`) leaves it unused while the cache sleeps.
        match unsafe { self.sleep_in_place(keep) } {
            Ok(slept) => Ok(SleepingCache { cache: self, slept }),
            Err(error) => Err(SleepError { cache: self, error }),
        }
    }

    /// [`DeviceCache::sleep`] without giving up the cache, for allocators built on raw blocks
    /// (PyTorch's allocator hooks): allocations are refused ([`ErrorKind::SleepState`](crate::ErrorKind))
    /// until [`DeviceCache::wake_in_place`]. Returns the bytes given back. A sleep of a sleeping
    /// cache is refused the same way.
    ///
    /// # Safety
    /// From this call until a wake succeeds, no work uses the memory of any block of the cache,
    /// and no block is freed; no allocation is in progress when the call starts; work queued
    /// before the call on other streams than the blocks' own has completed.
    pub unsafe fn sleep_in_place(&self, keep: Keep) -> Result<usize> {
        // SAFETY: forwarded from the caller.
        Ok(unsafe { self.allocator.sleep(keep) }?)
    }

    /// Wakes a cache put to sleep by [`DeviceCache::sleep_in_place`]: new memory at the blocks'
    /// addresses, with their bytes when the sleep kept them. Out of memory is the typed
    /// out-of-memory error with the cache's figures, and leaves the cache asleep with what it
    /// kept: the wake can be tried again. A wake of an awake cache is refused
    /// ([`ErrorKind::SleepState`](crate::ErrorKind)).
    pub fn wake_in_place(&self) -> Result<usize> {
        Ok(self.allocator.wake()?)
    }

    /// True while the cache sleeps.
    pub fn is_asleep(&self) -> bool {
        self.allocator.is_asleep()
    }

    /// Bytes of pinned host memory the cache's sleeps hold: the kept bytes of a sleeping cache,
    /// and backups kept for the next sleep of an awake one.
    pub fn host_backup_bytes(&self) -> usize {
        self.vmm_pages().map_or(0, |pages| pages.host_backup_bytes())
    }

    /// Gives back the pinned host memory kept for the next sleep (an awake cache keeps the
    /// backups of its last sleep, so that the next one allocates none); returns its bytes. A
    /// sleeping cache keeps the backups that hold its bytes. The next sleep allocates what it
    /// needs again.
    pub fn release_host_backups(&self) -> usize {
        self.vmm_pages().map_or(0, |pages| pages.release_host_backups())
    }
}

impl SleepingCache {
    /// Bytes of device memory the sleep gave back: the pages behind the blocks still allocated.
    pub fn slept_bytes(&self) -> usize {
        self.slept
    }

    /// Bytes of pinned host memory held for the kept bytes.
    pub fn host_backup_bytes(&self) -> usize {
        self.cache.host_backup_bytes()
    }

    /// The cache's figures while it sleeps (its reserve counts no slept page).
    pub fn stats(&self) -> CachingStats {
        self.cache.stats()
    }

    /// Wakes the cache: new device memory at the addresses of its blocks, with their bytes when
    /// the sleep kept them. Out of memory (another user holds the device) is the typed
    /// out-of-memory error with the cache's figures, and returns the cache asleep with
    /// everything it kept: wake it again once memory is free.
    #[allow(clippy::result_large_err, reason = "the error gives the cache back by value, as the success does")]
    pub fn wake(self) -> std::result::Result<DeviceCache, SleepError<SleepingCache>> {
        match self.cache.wake_in_place() {
            Ok(_) => Ok(self.cache),
            Err(error) => Err(SleepError { cache: self, error }),
        }
    }
}

impl fmt::Debug for SleepingCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SleepingCache").field("device", &self.cache.device).field("slept", &self.slept).finish()
    }
}
