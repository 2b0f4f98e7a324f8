//! One device's allocator: a byte limit and PyTorch-style statistics around a [`AllocatorBackend`].

use crate::backend::{AllocatorBackend, Figures, is_unknown_block};
use crate::graphs::{CaptureFilter, GraphPools, PoolId};
use crate::regions::{self, NO_TAG, RegionStats, Regions, Tag};
use cuda_mem::caching::Keep;
use cuda_mem::resource::StreamRef;
use cuda_mem::{CudaError, ErrorKind, OomReport, Result};
use cuda_mem_snapshot::{Frames, TraceRecorder};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// "No limit".
pub const NO_LIMIT: usize = usize::MAX;

/// The figures of one device: this allocator's counts around what its backend reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Bytes handed to PyTorch and not yet freed (as requested).
    pub allocated_current: u64,
    /// Highest `allocated_current` since the start or the last peak reset.
    pub allocated_peak: u64,
    /// Successful allocations.
    pub alloc_count: u64,
    /// Frees.
    pub free_count: u64,
    /// Refused allocations (over the limit, or the backend out of memory).
    pub failed_count: u64,
    /// The limit in bytes (`u64::MAX`: none).
    pub limit: u64,
    /// The backend's figures, with tagged regions and CUDA graph pools: their memory is in
    /// `reserved`, whose peak is the backend's, or the figure now when that is higher (the
    /// memory of graph pools counts from when the figures are read).
    pub backend: Figures,
}

impl Stats {
    /// Number of figures.
    pub const LEN: usize = 14;

    /// The figures in the order `cuda_mem_torch_stats` writes them.
    pub fn to_array(self) -> [u64; Self::LEN] {
        let b = self.backend;
        [
            self.allocated_current,
            self.allocated_peak,
            b.reserved.current as u64,
            b.reserved.peak as u64,
            self.alloc_count,
            self.free_count,
            self.failed_count,
            self.limit,
            b.cache_hits,
            b.cache_misses,
            b.segments,
            b.segment_releases,
            b.alloc_retries,
            b.inactive_split_bytes,
        ]
    }

    /// The figures under the key names of `torch.cuda.memory_stats()` (which PyTorch cannot give
    /// under a pluggable allocator), for the keys this allocator counts. `.all.` keys are the
    /// device's totals; PyTorch's per-pool splits (`small_pool`, `large_pool`) are not kept.
    pub fn pytorch_keys(&self) -> [(&'static str, u64); 13] {
        let b = &self.backend;
        [
            ("allocated_bytes.all.current", self.allocated_current),
            ("allocated_bytes.all.peak", self.allocated_peak),
            ("reserved_bytes.all.current", b.reserved.current as u64),
            ("reserved_bytes.all.peak", b.reserved.peak as u64),
            ("allocation.all.allocated", self.alloc_count),
            ("allocation.all.freed", self.free_count),
            ("allocation.all.current", self.alloc_count.saturating_sub(self.free_count)),
            ("segment.all.current", b.segments),
            ("num_device_alloc", b.cache_misses),
            ("num_device_free", b.segment_releases),
            ("num_alloc_retries", b.alloc_retries),
            ("num_ooms", self.failed_count),
            ("inactive_split_bytes.all.current", b.inactive_split_bytes),
        ]
    }
}

/// Allocations of one device through `B`, under a limit, counted.
#[derive(Debug)]
pub struct DeviceAllocator<B> {
    backend: B,
    /// Private pools of CUDA graphs, where the allocator takes part in captures.
    graphs: Option<GraphPools>,
    /// Caches of tagged regions, where allocations can be tagged.
    regions: Option<Regions>,
    device: i32,
    /// True while a trace is recorded (checked before taking the lock).
    recording: AtomicBool,
    trace: Mutex<Option<Arc<TraceRecorder>>>,
    limit: AtomicUsize,
    allocated: AtomicUsize,
    peak: AtomicUsize,
    allocs: AtomicU64,
    frees: AtomicU64,
    failures: AtomicU64,
}

impl<B: AllocatorBackend> DeviceAllocator<B> {
    /// An allocator of device `device` over `backend`, without a limit.
    pub fn new(backend: B, device: i32) -> Self {
        Self {
            backend,
            graphs: None,
            regions: None,
            device,
            recording: AtomicBool::new(false),
            trace: Mutex::new(None),
            limit: AtomicUsize::new(NO_LIMIT),
            allocated: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// The same allocator, giving what CUDA graph captures allocate private pools (see
    /// [`GraphPools`]).
    pub fn with_graph_pools(self, pools: GraphPools) -> Self {
        Self { graphs: Some(pools), ..self }
    }

    /// The same allocator, serving the allocations made with a tag set ([`regions::enter`]) from
    /// the tag's region (see [`Regions`]).
    pub fn with_regions(self, regions: Regions) -> Self {
        Self { regions: Some(regions), ..self }
    }

    /// A capture into `pool` begins: the streams `filter` accepts allocate from the pool (PyTorch's
    /// `beginAllocateToPool`). Without graph pools, an error: the capture must not go on with
    /// memory the cache would hand out again while the graph may replay.
    pub fn begin_capture(&self, pool: PoolId, filter: Box<dyn CaptureFilter>) -> Result<()> {
        let Some(graphs) = &self.graphs else {
            let kind = ErrorKind::Unsupported("CUDA graph capture without graph pools");
            return Err(CudaError::new(kind, "cuda-mem's PyTorch allocator"));
        };
        graphs.begin(pool, filter, || self.hold_event_queries(true));
        Ok(())
    }

    /// The capture into `pool` has ended (PyTorch's `endAllocateToPool`); after the last one
    /// underway, the frees held back during the captures reach the backend. An error, changing
    /// nothing, when no capture into `pool` is underway.
    pub fn end_capture(&self, pool: PoolId) -> Result<()> {
        let Some(graphs) = &self.graphs else { return Ok(()) };
        let ended = graphs.end(pool, |deferred| {
            self.hold_event_queries(false);
            for free in deferred {
                // SAFETY: freed by PyTorch during the capture with this size and stream, under
                // the contract of `free` (its accounting was done then); held back until now.
                // The backend or a region held it then; a refusal now means a second free of it
                // during the capture, which frees nothing.
                let _ = unsafe { self.deallocate_outside_pools(free.ptr, free.bytes, free.stream) };
            }
        });
        if ended { Ok(()) } else { Err(unknown_pool(pool, "ending a capture")) }
    }

    /// The graphs captured into `pool` are gone (PyTorch's `releasePool`). An error, changing
    /// nothing, for a pool no capture began into, or released as often as captured into.
    pub fn release_pool(&self, pool: PoolId) -> Result<()> {
        match &self.graphs {
            Some(graphs) if !graphs.release(pool) => Err(unknown_pool(pool, "releasing a graph pool")),
            _ => Ok(()),
        }
    }

    /// `size` bytes for PyTorch on `stream`. A request of 0 bytes gets a unique allocation of
    /// one byte (PyTorch keys its records by address). Over the limit, or when the backend is
    /// out of memory, the error is [`ErrorKind::OutOfMemory`].
    pub fn allocate(&self, size: usize, stream: StreamRef<'static>) -> Result<NonNull<u8>> {
        let limit = self.limit.load(Ordering::Relaxed);
        // Reserve under the limit first, so concurrent requests cannot overshoot it together.
        let reserved = self.allocated.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            used.checked_add(size).filter(|&total| total <= limit)
        });
        let used = match reserved {
            Ok(used) => used,
            Err(used) => {
                let report = OomReport { limit: Some((limit, used)), ..OomReport::requested(size) };
                let kind = ErrorKind::OutOfMemory { code: None, report: Box::new(report) };
                let err = CudaError::new(kind, format!("cuda-mem's PyTorch allocator: allocating {size} bytes"));
                return Err(self.refused(err, size, stream));
            }
        };
        let from_pool = self.graphs.as_ref().and_then(|graphs| graphs.allocate(size.max(1), stream));
        match from_pool.unwrap_or_else(|| self.allocate_outside_pools(size.max(1), stream)) {
            Ok(ptr) => {
                self.peak.fetch_max(used + size, Ordering::Relaxed);
                self.allocs.fetch_add(1, Ordering::Relaxed);
                if let Some(trace) = self.recorder() {
                    trace.alloc(ptr.as_ptr() as usize, size, stream.as_raw() as usize, Frames::from([]));
                }
                Ok(ptr)
            }
            Err(err) => {
                self.allocated.fetch_sub(size, Ordering::Relaxed);
                Err(self.refused(err, size, stream))
            }
        }
    }

    /// `bytes` from the calling thread's region, else from the backend. Out of memory where
    /// regions hold memory releases what all of them cache and tries once more: a cache of one
    /// may hold what another needs.
    #[inline]
    fn allocate_outside_pools(&self, bytes: usize, stream: StreamRef<'static>) -> Result<NonNull<u8>> {
        let Some(regions) = &self.regions else { return self.backend.allocate(bytes, stream) };
        let tag = regions::current();
        let allocate = || match tag {
            NO_TAG => self.backend.allocate(bytes, stream),
            tag => regions.allocate(tag, bytes, stream),
        };
        match allocate() {
            Err(err) if err.is_out_of_memory() && regions.any() => {
                self.release_caches()?;
                allocate()
            }
            other => other,
        }
    }

    /// Returns what the backend and the regions cache to the driver (not the graph pools').
    fn release_caches(&self) -> Result<()> {
        self.backend.release_cached()?;
        self.regions.as_ref().map_or(Ok(()), Regions::release_cached)
    }

    fn hold_event_queries(&self, hold: bool) {
        self.backend.hold_event_queries(hold);
        if let Some(regions) = &self.regions {
            regions.hold_event_queries(hold);
        }
    }

    /// Frees a block of the backend's or of a region's.
    ///
    /// # Safety
    /// As [`DeviceAllocator::free`].
    unsafe fn deallocate_outside_pools(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        stream: StreamRef<'static>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; the backend refuses what it did not hand out.
        let err = match unsafe { self.backend.deallocate(ptr, bytes, stream) } {
            Err(err) if is_unknown_block(&err) => err,
            other => return other,
        };
        match &self.regions {
            // SAFETY: forwarded from the caller; the regions refuse what they did not hand out.
            Some(regions) if unsafe { regions.deallocate(ptr, bytes, stream) }? => Ok(()),
            _ => Err(err),
        }
    }

    /// The refusal a free of a block of the backend's or of a region's would get.
    fn check_free_outside_pools(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()> {
        let err = match self.backend.check_free(ptr, bytes) {
            Err(err) if is_unknown_block(&err) => err,
            other => return other,
        };
        match &self.regions {
            Some(regions) if regions.check_free(ptr, bytes)? => Ok(()),
            _ => Err(err),
        }
    }

    /// Puts region `tag` to sleep on this device ([`Regions::sleep`]): its memory is given back,
    /// its bytes kept in pinned host memory when `keep` says so. Returns the bytes given back.
    /// Refused without regions.
    ///
    /// # Safety
    /// As [`Regions::sleep`]: from this call until the wake, no work uses the memory of the
    /// region's blocks, and work on other streams that used them has completed.
    pub unsafe fn sleep_region(&self, tag: Tag, keep: Keep) -> Result<usize> {
        // SAFETY: forwarded from the caller.
        unsafe { self.regions()?.sleep(tag, keep) }
    }

    /// Wakes region `tag` ([`Regions::wake`]); when the device is out of memory, releases what the
    /// other caches hold and tries once more. Returns the bytes mapped.
    pub fn wake_region(&self, tag: Tag) -> Result<usize> {
        let regions = self.regions()?;
        match regions.wake(tag) {
            Err(err) if err.is_out_of_memory() => {
                self.release_caches()?;
                regions.wake(tag)
            }
            other => other,
        }
    }

    /// Frees the pinned host memory the regions keep for their next sleeps; returns its bytes.
    pub fn release_host_backups(&self) -> usize {
        self.regions.as_ref().map_or(0, Regions::release_host_backups)
    }

    /// The regions' figures on this device.
    pub fn region_stats(&self) -> Vec<RegionStats> {
        self.regions.as_ref().map_or_else(Vec::new, Regions::stats)
    }

    pub(crate) fn regions(&self) -> Result<&Regions> {
        self.regions.as_ref().ok_or_else(|| {
            CudaError::new(ErrorKind::Unsupported("regions without region caches"), "cuda-mem's PyTorch allocator")
        })
    }

    #[cold]
    fn refused(&self, err: CudaError, size: usize, stream: StreamRef<'static>) -> CudaError {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if let (Some(trace), ErrorKind::OutOfMemory { report, .. }) = (self.recorder(), err.kind()) {
            trace.oom(size, stream.as_raw() as usize, report.free.unwrap_or(0));
        }
        err
    }

    fn recorder(&self) -> Option<Arc<TraceRecorder>> {
        if !self.recording.load(Ordering::Relaxed) {
            return None;
        }
        self.trace.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Records the last `capacity` allocations and frees (a new, empty trace); 0 stops.
    pub fn record_history(&self, capacity: usize) {
        let mut trace = self.trace.lock().unwrap_or_else(PoisonError::into_inner);
        *trace = (capacity > 0).then(|| Arc::new(TraceRecorder::new(self.device, capacity)));
        self.recording.store(capacity > 0, Ordering::Relaxed);
    }

    /// The recorded trace and live allocations, when recording.
    pub fn history(&self) -> Option<Arc<TraceRecorder>> {
        self.trace.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Frees `ptr` of `size` bytes in stream order on `stream`. A pointer this allocator did not
    /// hand out (or freed already), or a size other than it was allocated with, is refused with
    /// an `InvalidArgument` error, and nothing is freed or counted.
    ///
    /// # Safety
    /// Nothing uses the block after the work queued on `stream`.
    pub unsafe fn free(&self, ptr: NonNull<u8>, size: usize, stream: StreamRef<'static>) -> Result<()> {
        // `allocate` asked for `size.max(1)`; the pools and the backend check it.
        let bytes = size.max(1);
        let taken = match &self.graphs {
            // SAFETY: forwarded from the caller.
            Some(graphs) => unsafe { graphs.free(ptr, bytes, stream, || self.check_free_outside_pools(ptr, bytes)) }?,
            None => false,
        };
        if !taken {
            // SAFETY: forwarded from the caller.
            unsafe { self.deallocate_outside_pools(ptr, bytes, stream) }?;
        }
        if let Some(trace) = self.recorder() {
            trace.free(ptr.as_ptr() as usize, size, stream.as_raw() as usize);
        }
        // Saturating: a zero-byte block freed as one byte (one byte to the backend either way)
        // must not wrap the figure.
        let _ =
            self.allocated.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| Some(used.saturating_sub(size)));
        self.frees.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Notes that work on `stream` uses the block at `ptr` (PyTorch's `Tensor.record_stream`).
    /// `Ok(false)` when `ptr` is not this allocator's.
    pub fn record_stream(&self, ptr: NonNull<u8>, stream: StreamRef<'static>) -> Result<bool> {
        if self.backend.record_stream(ptr, stream)? {
            return Ok(true);
        }
        self.regions.as_ref().map_or(Ok(false), |regions| regions.record_stream(ptr, stream))
    }

    /// The figures now.
    pub fn stats(&self) -> Stats {
        let mut backend = match &self.regions {
            Some(regions) if regions.any() => self.backend.figures().plus(regions.figures()),
            _ => self.backend.figures(),
        };
        let in_pools = self.graphs.as_ref().map_or(0, GraphPools::reserved);
        backend.reserved.current += in_pools;
        backend.reserved.peak = backend.reserved.peak.max(backend.reserved.current);
        Stats {
            allocated_current: self.allocated.load(Ordering::Relaxed) as u64,
            allocated_peak: self.peak.load(Ordering::Relaxed) as u64,
            alloc_count: self.allocs.load(Ordering::Relaxed),
            free_count: self.frees.load(Ordering::Relaxed),
            failed_count: self.failures.load(Ordering::Relaxed),
            limit: self.limit.load(Ordering::Relaxed) as u64,
            backend,
        }
    }

    /// Sets the limit in bytes ([`NO_LIMIT`]: none). Live allocations stay; later requests that
    /// would exceed it are refused.
    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Restarts both peaks from the current figures.
    pub fn reset_peaks(&self) {
        self.peak.store(self.allocated.load(Ordering::Relaxed), Ordering::Relaxed);
        self.backend.reset_peak();
        if let Some(regions) = &self.regions {
            regions.reset_peak();
        }
    }

    /// Returns the backend's and the awake regions' cached memory to the driver, and the memory of released graph pools
    /// (after the device is idle; not while a capture is underway).
    pub fn release_cached(&self) -> Result<()> {
        self.release_caches()?;
        self.graphs.as_ref().map_or(Ok(0), GraphPools::release_freeable).map(drop)
    }
}

/// The refusal of a pool id no capture uses.
fn unknown_pool((first, second): PoolId, what: &str) -> CudaError {
    let kind = ErrorKind::InvalidArgument("a graph pool no capture began into, or released already");
    CudaError::new(kind, format!("{what} ({first}, {second})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Reserved;
    use std::sync::Mutex;

    /// Host memory standing in for device memory; counts what it holds.
    #[derive(Debug, Default)]
    struct HostBackend {
        held: Mutex<Vec<(usize, Box<[u8]>)>>,
        peak: AtomicUsize,
    }

    impl AllocatorBackend for HostBackend {
        fn allocate(&self, bytes: usize, _: StreamRef<'static>) -> Result<NonNull<u8>> {
            let mut block = vec![0u8; bytes].into_boxed_slice();
            let ptr = NonNull::new(block.as_mut_ptr()).unwrap();
            let mut held = self.held.lock().unwrap();
            held.push((ptr.as_ptr() as usize, block));
            let total = held.iter().map(|(_, b)| b.len()).sum();
            self.peak.fetch_max(total, Ordering::Relaxed);
            Ok(ptr)
        }

        unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, _: StreamRef<'static>) -> Result<()> {
            self.check_free(ptr, bytes)?;
            let mut held = self.held.lock().unwrap();
            held.retain(|(p, _)| *p != ptr.as_ptr() as usize);
            Ok(())
        }

        fn check_free(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()> {
            let held = self.held.lock().unwrap();
            match held.iter().find(|(p, _)| *p == ptr.as_ptr() as usize) {
                Some((_, b)) if b.len() == bytes => Ok(()),
                Some((_, b)) => Err(crate::backend::wrong_size(ptr, bytes, b.len())),
                None => Err(crate::backend::unknown_block(ptr, bytes)),
            }
        }

        fn record_stream(&self, _: NonNull<u8>, _: StreamRef<'static>) -> Result<bool> {
            Ok(false)
        }

        fn figures(&self) -> Figures {
            let current = self.held.lock().unwrap().iter().map(|(_, b)| b.len()).sum();
            Figures { reserved: Reserved { current, peak: self.peak.load(Ordering::Relaxed) }, ..Figures::default() }
        }

        fn reset_peak(&self) {
            self.peak.store(self.figures().reserved.current, Ordering::Relaxed);
        }

        fn release_cached(&self) -> Result<()> {
            Ok(())
        }
    }

    const S: StreamRef<'static> = StreamRef::LEGACY;

    /// Graph pools over host memory, with small segments.
    fn host_pools() -> GraphPools {
        let memory = crate::graphs::tests::HostMemory(Default::default());
        GraphPools::new(Box::new(memory), crate::graphs::tests::config())
    }

    /// A capture of every stream.
    struct Everything;

    impl CaptureFilter for Everything {
        fn accepts(&self, _: StreamRef<'static>) -> Option<bool> {
            Some(true)
        }
    }

    #[test]
    fn captures_allocate_from_graph_pools_and_the_caches_frees_wait_for_their_end() {
        let plain = DeviceAllocator::new(HostBackend::default(), 0);
        let err = plain.begin_capture((1, 0), Box::new(Everything)).unwrap_err();
        assert!(err.to_string().contains("CUDA graph capture without graph pools"), "{err}");

        let a = DeviceAllocator::new(HostBackend::default(), 0).with_graph_pools(host_pools());
        let eager = a.allocate(100, S).unwrap();
        a.begin_capture((1, 0), Box::new(Everything)).unwrap();
        let captured = a.allocate(100, S).unwrap();
        assert_eq!(a.backend.held.lock().unwrap().len(), 1, "the capture's memory is the pool's");
        // SAFETY: from this allocator, freed once each.
        unsafe {
            a.free(eager, 100, S).unwrap();
            a.free(captured, 100, S).unwrap();
        }
        assert_eq!(a.backend.held.lock().unwrap().len(), 1, "the cache's free waits for the capture's end");
        let s = a.stats();
        // The cache's 100 bytes and the pool's small segment.
        assert_eq!((s.allocated_current, s.free_count, s.backend.reserved.current), (0, 2, 100 + 16 * 1024));
        a.end_capture((1, 0)).unwrap();
        assert!(a.backend.held.lock().unwrap().is_empty());
        a.release_cached().unwrap();
        assert_eq!(a.stats().backend.reserved.current, 16 * 1024, "the graph may still replay");
        a.release_pool((1, 0)).unwrap();
        a.release_cached().unwrap();
        assert_eq!(a.stats().backend.reserved.current, 0);
        // Pool ids no capture uses (any two integers can come through the C functions).
        let ended = a.end_capture((1, 0)).unwrap_err().to_string();
        assert!(ended.contains("a graph pool no capture began into, or released already"), "{ended}");
        assert!(a.release_pool((1, 0)).unwrap_err().to_string().contains("releasing a graph pool (1, 0)"));
        assert!(a.release_pool((u64::MAX, 7)).is_err());
    }

    #[test]
    fn statistics_count_what_pytorch_asked_for() {
        let a = DeviceAllocator::new(HostBackend::default(), 0);
        let x = a.allocate(1000, S).unwrap();
        let y = a.allocate(24, S).unwrap();
        let s = a.stats();
        assert_eq!((s.allocated_current, s.allocated_peak, s.alloc_count, s.free_count), (1024, 1024, 2, 0));
        assert_eq!((s.backend.reserved.current, s.limit), (1024, u64::MAX));
        // SAFETY: from this allocator, freed once.
        unsafe { a.free(x, 1000, S) }.unwrap();
        let s = a.stats();
        assert_eq!((s.allocated_current, s.allocated_peak, s.free_count), (24, 1024, 1));
        a.reset_peaks();
        assert_eq!((a.stats().allocated_peak, a.stats().backend.reserved.peak), (24, 24));
        // SAFETY: as above.
        unsafe { a.free(y, 24, S) }.unwrap();
        assert_eq!(a.stats().to_array(), [0, 24, 0, 24, 2, 2, 0, u64::MAX, 0, 0, 0, 0, 0, 0]);
        let keys = a.stats().pytorch_keys();
        let value = |key: &str| keys.iter().find(|(k, _)| *k == key).map(|&(_, v)| v);
        assert_eq!(value("allocated_bytes.all.peak"), Some(24));
        assert_eq!(value("reserved_bytes.all.peak"), Some(24));
        assert_eq!((value("allocation.all.allocated"), value("allocation.all.current")), (Some(2), Some(0)));
        assert_eq!(value("num_alloc_retries"), Some(0));
    }

    #[test]
    fn zero_byte_requests_get_distinct_addresses() {
        let a = DeviceAllocator::new(HostBackend::default(), 0);
        let (x, y) = (a.allocate(0, S).unwrap(), a.allocate(0, S).unwrap());
        assert_ne!(x, y);
        assert_eq!((a.stats().allocated_current, a.stats().backend.reserved.current), (0, 2));
        // SAFETY: from this allocator, freed once each.
        unsafe {
            a.free(x, 0, S).unwrap();
            a.free(y, 0, S).unwrap();
        }
        assert_eq!(a.stats().backend.reserved.current, 0);
    }

    /// What the C functions' callers can pass wrong: a pointer never handed out, one freed
    /// already, another size. Each is refused, and nothing is freed or counted.
    #[test]
    fn frees_of_unknown_or_freed_pointers_and_wrong_sizes_are_refused() {
        let a = DeviceAllocator::new(HostBackend::default(), 0);
        let x = a.allocate(100, S).unwrap();
        let refused = |ptr, size| {
            // SAFETY: nothing uses host memory; a refused free frees nothing.
            let err = unsafe { a.free(ptr, size, S) }.unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
            err.to_string()
        };
        let unknown = refused(NonNull::new(0x1000 as *mut u8).unwrap(), 100);
        assert!(unknown.contains("a pointer this allocator did not hand out, or freed already"), "{unknown}");
        let interior = refused(NonNull::new(x.as_ptr().wrapping_add(8)).unwrap(), 92);
        assert!(interior.contains("did not hand out"), "{interior}");
        let resized = refused(x, 99);
        assert!(resized.contains("a size other than the block was allocated with"), "{resized}");
        assert_eq!(
            (a.stats().allocated_current, a.stats().free_count, a.backend.held.lock().unwrap().len()),
            (100, 0, 1)
        );
        // SAFETY: from this allocator, with its size; nothing uses host memory.
        unsafe { a.free(x, 100, S) }.unwrap();
        assert!(refused(x, 100).contains("freed already"));
        assert_eq!((a.stats().allocated_current, a.stats().free_count), (0, 1));
        // A zero-byte block is one byte to the backend: freed as one byte, the figure must not wrap.
        let z = a.allocate(0, S).unwrap();
        // SAFETY: as above.
        unsafe { a.free(z, 1, S) }.unwrap();
        assert_eq!(a.stats().allocated_current, 0);
    }

    /// During a capture a free of memory that is no pool block is held back for the cache: one
    /// the cache does not hold is refused at once, as is a pool block with another size.
    #[test]
    fn frees_during_a_capture_are_checked_before_they_are_held_back() {
        let a = DeviceAllocator::new(HostBackend::default(), 0).with_graph_pools(host_pools());
        let eager = a.allocate(100, S).unwrap();
        a.begin_capture((1, 0), Box::new(Everything)).unwrap();
        let captured = a.allocate(100, S).unwrap();
        // SAFETY: nothing uses host memory; a refused free frees nothing.
        let refused = |ptr, size| unsafe { a.free(ptr, size, S) }.unwrap_err().to_string();
        assert!(refused(NonNull::new(0x1000 as *mut u8).unwrap(), 100).contains("did not hand out"));
        assert!(refused(eager, 50).contains("a size other than"));
        assert!(refused(captured, 50).contains("a size other than"));
        assert_eq!((a.stats().allocated_current, a.stats().free_count), (200, 0));
        // SAFETY: from this allocator, with their sizes, freed once each.
        unsafe {
            a.free(eager, 100, S).unwrap();
            a.free(captured, 100, S).unwrap();
        }
        assert!(refused(captured, 100).contains("freed already"));
        a.end_capture((1, 0)).unwrap();
        assert!(a.backend.held.lock().unwrap().is_empty());
        assert_eq!((a.stats().allocated_current, a.stats().free_count), (0, 2));
    }

    #[test]
    fn the_limit_refuses_with_out_of_memory_and_can_change() {
        let a = DeviceAllocator::new(HostBackend::default(), 0);
        a.set_limit(100);
        let x = a.allocate(60, S).unwrap();
        let err = a.allocate(41, S).unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
        assert!(
            err.to_string().contains("the limit of 100 bytes would be exceeded (60 bytes in use under it)"),
            "{err}"
        );
        let y = a.allocate(40, S).unwrap();
        assert_eq!((a.stats().failed_count, a.stats().allocated_current, a.stats().limit), (1, 100, 100));
        a.set_limit(NO_LIMIT);
        let z = a.allocate(1 << 20, S).unwrap();
        // SAFETY: from this allocator, freed once each.
        unsafe {
            a.free(x, 60, S).unwrap();
            a.free(y, 40, S).unwrap();
            a.free(z, 1 << 20, S).unwrap();
        }
        assert_eq!(a.stats().allocated_current, 0);
    }

    #[test]
    fn history_records_allocations_frees_and_refusals() {
        let a = DeviceAllocator::new(HostBackend::default(), 0);
        let untraced = a.allocate(8, S).unwrap();
        assert!(a.history().is_none());
        a.record_history(100);
        a.set_limit(1000);
        let x = a.allocate(100, S).unwrap();
        assert!(a.allocate(10_000, S).is_err());
        // SAFETY: from this allocator, freed once each.
        unsafe {
            a.free(x, 100, S).unwrap();
            a.free(untraced, 8, S).unwrap();
        }
        let (segments, trace) = a.history().unwrap().snapshot();
        let actions: Vec<&str> = trace.iter().map(|e| e.action.name()).collect();
        assert_eq!(actions, ["alloc", "oom", "free_requested", "free_completed", "free_requested", "free_completed"]);
        assert_eq!((trace[0].addr, trace[0].size, trace[1].size), (x.as_ptr() as usize, 100, 10_000));
        assert!(segments.is_empty());
        a.record_history(0);
        assert!(a.history().is_none());
    }

    #[test]
    fn concurrent_requests_never_overshoot_the_limit() {
        let a = DeviceAllocator::new(HostBackend::default(), 0);
        a.set_limit(64 * 100);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..500 {
                        if let Ok(p) = a.allocate(64, S) {
                            assert!(a.stats().allocated_current <= 6400);
                            // SAFETY: from this allocator, freed once.
                            unsafe { a.free(p, 64, S) }.unwrap();
                        }
                    }
                });
            }
        });
        let s = a.stats();
        assert_eq!(s.allocated_current, 0);
        assert!(s.allocated_peak <= 6400);
        assert_eq!(s.alloc_count + s.failed_count, 2000);
    }
}
