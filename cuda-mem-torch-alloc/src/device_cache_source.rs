//! `DeviceCacheSource`: cuda-mem's `DeviceCache` of one device as a [`BlockSource`], PyTorch's stream
//! handles borrowed as cuda-mem streams.

use crate::cache::{BlockSource, CacheBackend};
use crate::graphs::{PoolBlock, PoolMemory};
use crate::regions::{RegionBackend, RegionMemory};
use cuda_mem::caching::{CachedBlock, Config, Keep};
use cuda_mem::resource::StreamRef;
use cuda_mem::{CachingStats, Device, DeviceBuffer, DeviceCache, Event, Result, Stream};
use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Source ids key the threads' tables of borrowed streams.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The streams this thread borrowed, by source id and handle: found without a lock shared
    /// between threads (PyTorch allocates on its main thread and frees on autograd's too).
    static BORROWED: RefCell<Vec<(u64, usize, Stream)>> = const { RefCell::new(Vec::new()) };
}

/// A device cache of its own (so its figures are the allocator's alone) and the device's legacy
/// stream.
#[derive(Debug)]
pub struct DeviceCacheSource {
    cache: DeviceCache,
    legacy: Stream,
    id: u64,
}

impl DeviceCacheSource {
    /// A new, empty cache on `device` with `config`.
    pub fn new(device: Device, config: Config) -> Result<Self> {
        let legacy = device.run_on(Stream::legacy_default)??;
        let cache = DeviceCache::with_config(device, config)?;
        Ok(Self { cache, legacy, id: NEXT_ID.fetch_add(1, Ordering::Relaxed) })
    }

    /// The cache.
    pub fn cache(&self) -> &DeviceCache {
        &self.cache
    }

    #[cold]
    #[inline(never)]
    fn borrow<R>(&self, stream: StreamRef<'static>, f: impl FnOnce(&Stream) -> Result<R>) -> Result<R> {
        // SAFETY: a `'static` stream reference names a stream that is never destroyed (the C
        // functions' contract: PyTorch's default and pooled streams live as long as the process,
        // and a wrapped external stream must too), so it outlives every clone of this value, the
        // cache's included. Built-in handles are refused by `borrow_raw`.
        let borrowed = unsafe { Stream::borrow_raw(stream.as_raw(), self.cache.device()) }?;
        let result = f(&borrowed);
        // Kept for this thread's later calls (not when the thread's storage is being torn down).
        let _ = BORROWED.try_with(|table| {
            if let Ok(mut table) = table.try_borrow_mut() {
                table.push((self.id, stream.as_raw() as usize, borrowed));
            }
        });
        result
    }
}

impl BlockSource for DeviceCacheSource {
    type Stream = Stream;
    type Fence = Event;

    #[inline]
    fn with_stream<R>(&self, stream: StreamRef<'static>, f: impl FnOnce(&Stream) -> Result<R>) -> Result<R> {
        let raw = stream.as_raw() as usize;
        if raw == 0 {
            return f(&self.legacy);
        }
        let known = BORROWED.try_with(|table| {
            let table = table.try_borrow().ok()?;
            table.iter().find(|(id, handle, _)| *id == self.id && *handle == raw).map(|(_, _, s)| s.clone())
        });
        match known {
            Ok(Some(borrowed)) => f(&borrowed),
            _ => self.borrow(stream, f),
        }
    }

    #[inline]
    fn alloc(&self, bytes: usize, stream: &Stream) -> Result<CachedBlock> {
        self.cache.alloc_block(bytes, stream)
    }

    #[inline]
    unsafe fn free(&self, block: CachedBlock) {
        // SAFETY: forwarded from the caller.
        unsafe { self.cache.free_block(block) }
    }

    fn record(&self, stream: &Stream) -> Result<Event> {
        // An event records only on a stream of the device current at its creation.
        self.cache.device().run_on(|| {
            let event = Event::without_timing()?;
            event.record(stream)?;
            Ok(event)
        })?
    }

    fn is_done(&self, fence: &Event) -> bool {
        // A failed query means a broken context, where no work runs any more.
        fence.is_complete().unwrap_or(true)
    }

    fn wait(&self, fence: &Event) -> Result<()> {
        fence.synchronize()
    }

    fn order_per_thread_after(&self, stream: &Stream) -> Result<()> {
        let done = self.record(stream)?;
        self.cache.device().run_on(|| Stream::per_thread()?.wait_event(&done))?
    }

    fn synchronize(&self) -> Result<()> {
        self.cache.device().synchronize()
    }

    fn stats(&self) -> CachingStats {
        self.cache.stats()
    }

    fn reset_peaks(&self) {
        self.cache.reset_peaks();
    }

    fn empty_cache(&self) -> usize {
        self.cache.empty_cache()
    }

    unsafe fn sleep(&self, keep: Keep) -> Result<usize> {
        // SAFETY: forwarded from the caller.
        unsafe { self.cache.sleep_in_place(keep) }
    }

    fn wake(&self) -> Result<usize> {
        self.cache.wake_in_place()
    }

    fn host_backup_bytes(&self) -> usize {
        self.cache.host_backup_bytes()
    }

    fn release_host_backups(&self) -> usize {
        self.cache.release_host_backups()
    }
}

/// The caches of tagged regions: a `DeviceCache` each on the device, with the main cache's
/// configuration.
#[derive(Debug)]
pub struct RegionCaches {
    /// The device.
    pub device: Device,
    /// The caches' parameters.
    pub config: Config,
}

impl RegionMemory for RegionCaches {
    fn create(&self) -> Result<Box<dyn RegionBackend>> {
        Ok(Box::new(CacheBackend::new(DeviceCacheSource::new(self.device, self.config.clone())?)))
    }
}

/// Fresh device memory for CUDA graph pools: a `cudaMalloc` each (with the thread relaxed, as a
/// capture in global or thread-local mode refuses it otherwise), freed when dropped.
#[derive(Debug)]
pub struct FreshMemory(pub Device);

// SAFETY: each segment is a `cudaMalloc` allocation of its own (256-byte aligned), freed when its
// `PoolBlock` (the `DeviceBuffer`) drops.
unsafe impl PoolMemory for FreshMemory {
    fn allocate(&self, bytes: usize) -> Result<(NonNull<u8>, PoolBlock)> {
        // SAFETY: the memory goes to PyTorch, which writes it before reading it; Rust never
        // reads it.
        let mut memory = self.0.run_on(|| unsafe { DeviceBuffer::<u8>::uninit_relaxed(bytes) })??;
        let ptr = NonNull::new(memory.as_mut_slice().as_device_ptr()).expect("cudaMalloc never returns null");
        Ok((ptr, Box::new(memory)))
    }

    fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
}
