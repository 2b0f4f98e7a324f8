//! `CacheBackend` over cuda-mem's caching allocator on host memory: which stream each of
//! PyTorch's handles reaches, what a free on another stream or on the per-thread stream does,
//! and the figures, through the source's log of calls.

use super::*;
use crate::allocator::DeviceAllocator;
use cuda_mem::caching::{self, CachingAllocator, Config};
use cuda_mem::{CudaError, ErrorKind};
use std::alloc::Layout;
use std::collections::HashSet;
use std::sync::Mutex;

/// A stream of the host source: its handle's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HostStream(usize);

/// Segments from the system allocator. Nothing ever runs on a host stream, so every fence is
/// complete when recorded.
#[derive(Debug)]
struct HostSegments;

const ALIGN: usize = 512;

// SAFETY: `allocate` returns fresh system-allocator memory aligned to 512 (overlapping no live
// segment); no work is ever queued on a host stream, so a fence covers only completed work and
// every wait is over at once; a `HostStream` names its handle's value for good.
unsafe impl caching::Backend for HostSegments {
    type Stream = HostStream;
    type Fence = ();
    type Error = CudaError;

    fn key(stream: &HostStream) -> StreamKey {
        StreamKey(stream.0)
    }

    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>> {
        let layout = Layout::from_size_align(bytes, ALIGN).expect("segment sizes are small");
        // SAFETY: `bytes` is non-zero (a multiple of 512).
        NonNull::new(unsafe { std::alloc::alloc(layout) })
            .ok_or_else(|| CudaError::new(ErrorKind::InvalidArgument("host allocation failed"), "HostSegments"))
    }

    unsafe fn release(&self, base: NonNull<u8>, bytes: usize) {
        let layout = Layout::from_size_align(bytes, ALIGN).expect("as allocated");
        // SAFETY: allocated by `allocate` with this layout, released once (the caller's contract).
        unsafe { std::alloc::dealloc(base.as_ptr(), layout) }
    }

    fn record(&self, _: &HostStream) -> Result<()> {
        Ok(())
    }

    fn is_done(&self, (): &()) -> bool {
        true
    }

    fn wait(&self, (): &()) -> Result<()> {
        Ok(())
    }

    fn stream_wait(&self, _: &HostStream, (): &()) -> Result<()> {
        Ok(())
    }
}

/// What the backend asked of its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Alloc(usize),
    Free(usize),
    Record(usize),
    Wait(usize),
    PerThreadWaitsFor(usize),
    Synchronize,
}

/// A handle the source refuses, as `DeviceCacheSource` refuses a stream of another device.
const FOREIGN: usize = 0xbad0;

/// Work on the host source's streams, as counts: what was queued, and what completed (a prefix).
#[derive(Debug, Default)]
struct Work {
    queued: FxHashMap<usize, u64>,
    completed: FxHashMap<usize, u64>,
}

/// The caching allocator over host segments, logging what it is asked. Its fences are (stream,
/// pieces of work queued before them); a test queues and completes work by hand.
#[derive(Debug)]
struct HostSource {
    cache: CachingAllocator<HostSegments>,
    log: Mutex<Vec<Call>>,
    work: Mutex<Work>,
    fail_per_thread_wait: bool,
}

impl HostSource {
    fn new() -> Self {
        let config = Config { small_segment: 64 << 10, small_max: 16 << 10, ..Config::default() };
        Self {
            cache: CachingAllocator::new(HostSegments, config).unwrap(),
            log: Mutex::default(),
            work: Mutex::default(),
            fail_per_thread_wait: false,
        }
    }

    fn note(&self, call: Call) {
        self.log.lock().unwrap().push(call);
    }

    fn take_log(&self) -> Vec<Call> {
        std::mem::take(&mut self.log.lock().unwrap())
    }

    /// Queues a piece of work on `stream`.
    fn submit(&self, stream: usize) {
        *self.work.lock().unwrap().queued.entry(stream).or_default() += 1;
    }

    /// Completes the work queued on `stream`.
    fn complete(&self, stream: usize) {
        let mut work = self.work.lock().unwrap();
        let queued = work.queued.get(&stream).copied().unwrap_or(0);
        work.completed.insert(stream, queued);
    }
}

impl BlockSource for HostSource {
    type Stream = HostStream;
    type Fence = (usize, u64);

    fn with_stream<R>(&self, stream: StreamRef<'static>, f: impl FnOnce(&HostStream) -> Result<R>) -> Result<R> {
        let raw = stream.as_raw() as usize;
        assert!(raw != LEGACY && raw != PER_THREAD, "the backend resolves built-in handle {raw}");
        if raw == FOREIGN {
            return Err(CudaError::new(ErrorKind::InvalidArgument("the stream belongs to another device"), "host"));
        }
        f(&HostStream(raw))
    }

    fn alloc(&self, bytes: usize, stream: &HostStream) -> Result<CachedBlock> {
        self.note(Call::Alloc(stream.0));
        Ok(self.cache.alloc(bytes, stream)?)
    }

    unsafe fn free(&self, block: CachedBlock) {
        self.note(Call::Free(block.stream().0));
        // SAFETY: forwarded from the caller.
        unsafe { self.cache.free(block) }
    }

    fn record(&self, stream: &HostStream) -> Result<(usize, u64)> {
        self.note(Call::Record(stream.0));
        Ok((stream.0, self.work.lock().unwrap().queued.get(&stream.0).copied().unwrap_or(0)))
    }

    fn is_done(&self, &(stream, seq): &(usize, u64)) -> bool {
        self.work.lock().unwrap().completed.get(&stream).copied().unwrap_or(0) >= seq
    }

    fn wait(&self, &(stream, _): &(usize, u64)) -> Result<()> {
        self.note(Call::Wait(stream));
        self.complete(stream);
        Ok(())
    }

    fn order_per_thread_after(&self, stream: &HostStream) -> Result<()> {
        self.note(Call::PerThreadWaitsFor(stream.0));
        if self.fail_per_thread_wait {
            return Err(CudaError::new(ErrorKind::InvalidArgument("no event"), "host"));
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.note(Call::Synchronize);
        Ok(())
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
        // SAFETY: forwarded from the caller (host segments have no pages: always refused).
        Ok(unsafe { self.cache.sleep(keep) }?)
    }

    fn wake(&self) -> Result<usize> {
        Ok(self.cache.wake()?)
    }

    fn host_backup_bytes(&self) -> usize {
        0
    }

    fn release_host_backups(&self) -> usize {
        0
    }
}

/// A handle as PyTorch passes it.
fn handle(raw: usize) -> StreamRef<'static> {
    // SAFETY: the host source never gives a handle to CUDA; it only compares values.
    unsafe { StreamRef::from_raw(raw as cuda_mem::launch::cudaStream_t) }
}

const POOLED: usize = 0x7000;
const OTHER_POOLED: usize = 0x7100;

fn backend() -> CacheBackend<HostSource> {
    CacheBackend::new(HostSource::new())
}

fn free(backend: &CacheBackend<HostSource>, ptr: NonNull<u8>, bytes: usize, stream: usize) {
    // SAFETY: from this backend, freed once; nothing uses host-source memory.
    unsafe { backend.deallocate(ptr, bytes, handle(stream)) }.unwrap();
}

#[test]
fn the_default_stream_and_cuda_stream_legacy_share_the_legacy_streams_cache() {
    let b = backend();
    let x = b.allocate(1000, handle(0)).unwrap();
    free(&b, x, 1000, 0);
    let y = b.allocate(1000, handle(LEGACY)).unwrap();
    assert_eq!(y, x, "reused on the same stream at once");
    free(&b, y, 1000, LEGACY);
    assert_eq!(b.source().take_log(), [Call::Alloc(0), Call::Free(0), Call::Alloc(0), Call::Free(0)]);
    let figures = b.figures();
    assert_eq!((figures.cache_hits, figures.cache_misses, figures.segments), (1, 1, 1));
    assert_eq!(b.held_blocks(), 0);
}

#[test]
fn pooled_streams_key_their_own_blocks_and_frees_return_there() {
    let b = backend();
    let x = b.allocate(4096, handle(POOLED)).unwrap();
    let y = b.allocate(4096, handle(OTHER_POOLED)).unwrap();
    assert_ne!(x, y);
    free(&b, x, 4096, POOLED);
    free(&b, y, 4096, OTHER_POOLED);
    let again = b.allocate(4096, handle(OTHER_POOLED)).unwrap();
    assert_eq!(again, y, "each stream gets back what was freed on it");
    free(&b, again, 4096, OTHER_POOLED);
    use Call::*;
    let log = b.source().take_log();
    assert_eq!(
        log,
        [Alloc(POOLED), Alloc(OTHER_POOLED), Free(POOLED), Free(OTHER_POOLED), Alloc(OTHER_POOLED), Free(OTHER_POOLED)]
    );
}

#[test]
fn a_free_on_another_stream_holds_the_block_back_until_that_streams_work_completes() {
    let b = backend();
    let x = b.allocate(4096, handle(POOLED)).unwrap();
    b.source().submit(0); // the legacy stream's use of `x`, still running
    free(&b, x, 4096, 0);
    assert_eq!(b.source().take_log(), [Call::Alloc(POOLED), Call::Record(0)]);
    assert_eq!((b.held_blocks(), b.deferred_blocks()), (0, 1));
    let y = b.allocate(4096, handle(POOLED)).unwrap();
    assert_ne!(y, x, "not reused while the legacy stream's work runs");
    b.source().complete(0);
    free(&b, y, 4096, POOLED);
    let z = b.allocate(4096, handle(POOLED)).unwrap();
    assert_eq!(b.deferred_blocks(), 0, "returned once its fence completed");
    use Call::*;
    assert_eq!(b.source().take_log(), [Alloc(POOLED), Free(POOLED), Free(POOLED), Alloc(POOLED)]);
    free(&b, z, 4096, POOLED);
    b.release_cached().unwrap();
    assert_eq!(b.figures().reserved.current, 0);
}

/// `Tensor.record_stream`: the free records an event on every stream that used the block and
/// returns it to its own stream once all have completed; its own stream needs none.
#[test]
fn recorded_streams_hold_the_block_back_until_their_work_completes() {
    let b = backend();
    let x = b.allocate(8192, handle(0)).unwrap();
    assert!(b.note_user(x, handle(POOLED)));
    assert!(b.note_user(x, handle(OTHER_POOLED)));
    assert!(b.note_user(x, handle(POOLED)), "recorded once");
    assert!(b.note_user(x, handle(LEGACY)), "its own stream: nothing to record");
    assert!(!b.note_user(NonNull::new(0x1000 as *mut u8).unwrap(), handle(POOLED)), "not this backend's memory");
    b.source().submit(POOLED);
    b.source().submit(OTHER_POOLED);
    free(&b, x, 8192, 0);
    use Call::*;
    assert_eq!(b.source().take_log(), [Alloc(0), Record(POOLED), Record(OTHER_POOLED)]);
    b.source().complete(POOLED);
    let y = b.allocate(8192, handle(0)).unwrap();
    assert_ne!(y, x, "one user's work still runs");
    free(&b, y, 8192, 0);
    b.source().complete(OTHER_POOLED);
    let z = b.allocate(8192, handle(0)).unwrap();
    assert_eq!(b.deferred_blocks(), 0);
    free(&b, z, 8192, 0);
    assert_eq!(b.source().take_log(), [Alloc(0), Free(0), Free(0), Alloc(0), Free(0)]);
    // Emptying the cache waits for held-back blocks.
    let w = b.allocate(8192, handle(0)).unwrap();
    assert!(b.note_user(w, handle(POOLED)));
    b.source().submit(POOLED);
    free(&b, w, 8192, 0);
    b.release_cached().unwrap();
    assert_eq!((b.deferred_blocks(), b.figures().reserved.current), (0, 0));
    assert!(b.source().take_log().contains(&Wait(POOLED)));
}

#[test]
fn a_stream_that_cannot_be_named_at_the_free_makes_it_wait_for_the_device() {
    let b = backend();
    let x = b.allocate(4096, handle(POOLED)).unwrap();
    assert!(b.note_user(x, handle(FOREIGN)));
    free(&b, x, 4096, POOLED);
    assert_eq!(b.source().take_log(), [Call::Alloc(POOLED), Call::Synchronize, Call::Free(POOLED)]);
    let y = b.allocate(4096, handle(POOLED)).unwrap();
    assert!(b.note_user(y, handle(PER_THREAD)));
    free(&b, y, 4096, POOLED);
    assert_eq!(b.source().take_log(), [Call::Alloc(POOLED), Call::Synchronize, Call::Free(POOLED)]);
}

#[test]
fn per_thread_blocks_come_from_the_legacy_stream_and_their_free_waits_for_the_device() {
    let b = backend();
    let x = b.allocate(2048, handle(PER_THREAD)).unwrap();
    assert_eq!(b.source().take_log(), [Call::Alloc(0), Call::PerThreadWaitsFor(0)]);
    free(&b, x, 2048, PER_THREAD);
    assert_eq!(b.source().take_log(), [Call::Synchronize, Call::Free(0)]);
    // A block of the legacy stream freed with the per-thread handle, and the other way round.
    let y = b.allocate(2048, handle(0)).unwrap();
    free(&b, y, 2048, PER_THREAD);
    let z = b.allocate(2048, handle(PER_THREAD)).unwrap();
    free(&b, z, 2048, 0);
    use Call::*;
    let log = b.source().take_log();
    assert_eq!(log, [Alloc(0), Synchronize, Free(0), Alloc(0), PerThreadWaitsFor(0), Synchronize, Free(0)]);
}

#[test]
fn a_failed_per_thread_wait_returns_the_block_and_reports() {
    let b = CacheBackend::new(HostSource { fail_per_thread_wait: true, ..HostSource::new() });
    assert!(b.allocate(2048, handle(PER_THREAD)).is_err());
    assert_eq!(b.held_blocks(), 0);
    assert_eq!(b.source().stats().allocated.current, 0, "the block went back");
}

#[test]
fn frees_of_unknown_or_freed_pointers_and_wrong_sizes_are_refused_and_free_nothing() {
    let b = backend();
    let x = b.allocate(4096, handle(POOLED)).unwrap();
    // SAFETY: nothing uses host-source memory; a refused free frees nothing.
    let refused = |ptr, bytes| unsafe { b.deallocate(ptr, bytes, handle(POOLED)) }.unwrap_err().to_string();
    assert!(refused(NonNull::new(0x1000 as *mut u8).unwrap(), 4096).contains("did not hand out"));
    assert!(refused(x, 4095).contains("a size other than the block was allocated with"));
    assert!(b.check_free(x, 4096).is_ok() && b.check_free(x, 4095).is_err());
    assert_eq!((b.held_blocks(), b.source().take_log()), (1, vec![Call::Alloc(POOLED)]));
    free(&b, x, 4096, POOLED);
    assert!(refused(x, 4096).contains("freed already"));
    assert!(b.check_free(x, 4096).is_err());
    assert_eq!(b.source().take_log(), [Call::Free(POOLED)], "freed once");
}

#[test]
fn a_refused_stream_is_an_error_and_holds_nothing() {
    let b = backend();
    let err = b.allocate(100, handle(FOREIGN)).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    assert_eq!((b.held_blocks(), b.source().stats().allocated.current), (0, 0));
}

#[test]
fn figures_come_from_the_cache_and_its_peaks_restart() {
    let b = backend();
    let small = b.allocate(1000, handle(0)).unwrap();
    let large = b.allocate(3 << 20, handle(0)).unwrap();
    let figures = b.figures();
    // Small segments grow with the pool: the first is the request rounded to a power of two.
    assert_eq!(figures.reserved, Reserved { current: 1024 + (20 << 20), peak: 1024 + (20 << 20) });
    assert_eq!((figures.cache_hits, figures.cache_misses, figures.segments), (0, 2, 2));
    free(&b, large, 3 << 20, 0);
    b.release_cached().unwrap();
    assert_eq!(b.figures().reserved.current, 1024, "the held block's segment stays");
    b.reset_peak();
    assert_eq!(b.figures().reserved, Reserved { current: 1024, peak: 1024 });
    free(&b, small, 1000, 0);
}

#[test]
fn the_allocator_counts_and_limits_over_the_cache() {
    let a = DeviceAllocator::new(backend(), 0);
    a.set_limit(1 << 20);
    let zero = [a.allocate(0, handle(0)).unwrap(), a.allocate(0, handle(0)).unwrap()];
    assert_ne!(zero[0], zero[1], "zero-byte requests get distinct addresses");
    let x = a.allocate(700 << 10, handle(POOLED)).unwrap();
    assert!(a.allocate(400 << 10, handle(POOLED)).unwrap_err().is_out_of_memory());
    let s = a.stats();
    // Three misses: each zero-byte request's minimal block fills a segment sized to it (small
    // segments grow with the pool), and the 700 KiB request needs its own.
    assert_eq!((s.allocated_current, s.alloc_count, s.failed_count, s.backend.cache_misses), (700 << 10, 3, 1, 3));
    // SAFETY: from this allocator, freed once each; nothing uses host-source memory.
    unsafe {
        a.free(x, 700 << 10, handle(POOLED)).unwrap();
        a.free(zero[0], 0, handle(0)).unwrap();
        a.free(zero[1], 0, handle(0)).unwrap();
    }
    let y = a.allocate(700 << 10, handle(POOLED)).unwrap();
    assert_eq!(y, x);
    // SAFETY: as above.
    unsafe { a.free(y, 700 << 10, handle(POOLED)) }.unwrap();
    let s = a.stats();
    assert_eq!((s.allocated_current, s.free_count, s.backend.cache_hits), (0, 4, 1)); // the re-allocation of x is the one hit
    assert_eq!(
        s.to_array()[8..],
        [s.backend.cache_hits, s.backend.cache_misses, s.backend.segments, 0, 0, s.backend.inactive_split_bytes]
    );
    // Blocks parked in this thread's front cache keep their segments in use: the rest of those
    // segments is free space split off them.
    assert!(s.backend.inactive_split_bytes > 0);
}

/// PyTorch allocates on its main thread and frees on autograd's (and the other way round): blocks
/// freed on one thread are found by address there, and no address is live twice.
#[test]
fn blocks_move_between_threads_and_no_address_is_handed_out_twice() {
    let b = backend();
    let live = Mutex::new(HashSet::new());
    let (to_free, freed_elsewhere) = std::sync::mpsc::channel::<(usize, usize)>();
    std::thread::scope(|s| {
        let (b, live) = (&b, &live);
        s.spawn(move || {
            for (addr, bytes) in freed_elsewhere {
                live.lock().unwrap().remove(&addr);
                free(b, NonNull::new(addr as *mut u8).unwrap(), bytes, 0);
            }
        });
        for thread in 0..3 {
            let to_free = to_free.clone();
            s.spawn(move || {
                for i in 0..300 {
                    let bytes = 512 * (1 + (i * 7 + thread) % 40);
                    let ptr = b.allocate(bytes, handle(0)).unwrap();
                    assert!(live.lock().unwrap().insert(ptr.as_ptr() as usize), "{ptr:p} handed out twice");
                    if i % 2 == 0 {
                        to_free.send((ptr.as_ptr() as usize, bytes)).unwrap();
                    } else {
                        live.lock().unwrap().remove(&(ptr.as_ptr() as usize));
                        free(b, ptr, bytes, 0);
                    }
                }
            });
        }
        drop(to_free);
    });
    assert_eq!(b.held_blocks(), 0);
    assert_eq!(b.source().stats().allocated.current, 0);
    b.release_cached().unwrap();
    assert_eq!(b.figures().reserved.current, 0);
}
