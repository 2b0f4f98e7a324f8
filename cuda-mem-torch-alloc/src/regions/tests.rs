//! Regions over caches of the fake paged backend: where tagged allocations come from and go back
//! to, what a sleep gives back and keeps, what a wake restores, frees during a sleep, and every
//! refusal and failure leaving the region as it was.

use super::*;
use crate::allocator::DeviceAllocator;
use cuda_mem::caching::fake::{FakeBackend, FakeFence};
use cuda_mem::caching::{self, Backend as _, CachedBlock, CachingAllocator, Config, StreamKey};
use cuda_mem::{CachingStats, OomReport};
use std::sync::Arc;

const PAGE: usize = 64 << 10;
const MIB: usize = 1 << 20;

fn fake_error(err: caching::Error<caching::fake::FakeError>) -> CudaError {
    match err {
        caching::Error::SleepState(why) => CudaError::new(ErrorKind::SleepState(why), "fake cache"),
        err if err.is_out_of_memory() => {
            let kind = ErrorKind::OutOfMemory { code: None, report: Box::new(OomReport::default()) };
            CudaError::new(kind, format!("fake cache: {err}"))
        }
        err => CudaError::new(ErrorKind::InvalidArgument("a fake refusal"), format!("fake cache: {err}")),
    }
}

/// A paged cache over the fake backend; stream handles are their keys.
#[derive(Debug)]
struct PagesSource {
    cache: CachingAllocator<FakeBackend>,
    backend: FakeBackend,
}

/// Where the next fake cache's addresses start: caches of one device never share an address.
static NEXT_BASE: AtomicUsize = AtomicUsize::new(1 << 40);

impl PagesSource {
    fn new() -> Self {
        let base = NEXT_BASE.fetch_add(1 << 36, Ordering::Relaxed);
        let backend = FakeBackend::with_pages(PAGE, 4096 * PAGE).starting_at(base);
        let config = Config { max_mapping_bytes: 4 * PAGE, ..Config::default() };
        Self { cache: CachingAllocator::new(backend.clone(), config).unwrap(), backend }
    }
}

impl BlockSource for PagesSource {
    type Stream = StreamKey;
    type Fence = FakeFence;

    fn with_stream<R>(&self, stream: StreamRef<'static>, f: impl FnOnce(&StreamKey) -> Result<R>) -> Result<R> {
        f(&StreamKey(stream.as_raw() as usize))
    }

    fn alloc(&self, bytes: usize, stream: &StreamKey) -> Result<CachedBlock> {
        self.cache.alloc(bytes, stream).map_err(fake_error)
    }

    unsafe fn free(&self, block: CachedBlock) {
        // SAFETY: forwarded from the caller.
        unsafe { self.cache.free(block) }
    }

    fn record(&self, stream: &StreamKey) -> Result<FakeFence> {
        self.backend.record(stream).map_err(|err| fake_error(caching::Error::Backend(err)))
    }

    fn is_done(&self, fence: &FakeFence) -> bool {
        self.backend.is_done(fence)
    }

    fn wait(&self, fence: &FakeFence) -> Result<()> {
        self.backend.wait(fence).map_err(|err| fake_error(caching::Error::Backend(err)))
    }

    fn order_per_thread_after(&self, _: &StreamKey) -> Result<()> {
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.backend.complete_all();
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
        // SAFETY: forwarded from the caller.
        unsafe { self.cache.sleep(keep) }.map_err(fake_error)
    }

    fn wake(&self) -> Result<usize> {
        self.cache.wake().map_err(fake_error)
    }

    fn host_backup_bytes(&self) -> usize {
        0
    }

    fn release_host_backups(&self) -> usize {
        0
    }
}

/// Region caches over fake backends, each kept for the test to look into.
#[derive(Debug, Default)]
struct FakeRegions {
    made: Arc<Mutex<Vec<FakeBackend>>>,
}

impl RegionMemory for FakeRegions {
    fn create(&self) -> Result<Box<dyn RegionBackend>> {
        let source = PagesSource::new();
        self.made.lock().unwrap().push(source.backend.clone());
        Ok(Box::new(CacheBackend::new(source)))
    }
}

struct Setup {
    allocator: DeviceAllocator<CacheBackend<PagesSource>>,
    main: FakeBackend,
    made: Arc<Mutex<Vec<FakeBackend>>>,
}

impl Setup {
    fn new() -> Self {
        let source = PagesSource::new();
        let main = source.backend.clone();
        let regions = FakeRegions::default();
        let made = regions.made.clone();
        let allocator =
            DeviceAllocator::new(CacheBackend::new(source), 0).with_regions(Regions::new(Box::new(regions)));
        Self { allocator, main, made }
    }

    /// The fake backend of the `index`th region cache made.
    fn region(&self, index: usize) -> FakeBackend {
        self.made.lock().unwrap()[index].clone()
    }

    fn alloc_in(&self, name: &str, bytes: usize) -> Result<NonNull<u8>> {
        let previous = enter(tag_named(name).unwrap());
        let ptr = self.allocator.allocate(bytes, stream(0x10));
        leave(previous).unwrap();
        ptr
    }

    fn free(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()> {
        // SAFETY: fake memory, used by no work.
        unsafe { self.allocator.free(ptr, bytes, stream(0x10)) }
    }

    fn sleep(&self, name: &str, keep: Keep) -> Result<usize> {
        // SAFETY: fake memory, used by no work.
        unsafe { self.allocator.sleep_region(existing_tag(name)?, keep) }
    }

    fn wake(&self, name: &str) -> Result<usize> {
        self.allocator.wake_region(existing_tag(name)?)
    }

    fn stats_of(&self, name: &str) -> RegionStats {
        let tag = existing_tag(name).unwrap();
        self.allocator.region_stats().into_iter().find(|s| s.tag == tag).expect("a region of that tag")
    }
}

fn stream(raw: usize) -> StreamRef<'static> {
    // SAFETY: the fake source never gives a handle to CUDA; it only keys streams by it.
    unsafe { StreamRef::from_raw(raw as cuda_mem::launch::cudaStream_t) }
}

fn addr(ptr: NonNull<u8>) -> usize {
    ptr.as_ptr().addr()
}

fn is_sleep_state(err: &CudaError, what: &str) -> bool {
    matches!(err.kind(), ErrorKind::SleepState(why) if why.contains(what))
}

#[test]
fn tagged_allocations_come_from_the_tags_cache_and_frees_find_it() {
    let s = Setup::new();
    let untagged = s.allocator.allocate(3 * MIB, stream(0x10)).unwrap();
    let weights = s.alloc_in("t-weights", 5 * MIB).unwrap();
    let cache = s.alloc_in("t-kv", 2 * MIB).unwrap();
    assert_eq!(s.made.lock().unwrap().len(), 2, "a cache per tag, made at its first allocation");
    assert!(s.main.is_mapped(addr(untagged), 3 * MIB) && !s.main.is_mapped(addr(weights), 1));
    assert!(s.region(0).is_mapped(addr(weights), 5 * MIB) && s.region(1).is_mapped(addr(cache), 2 * MIB));
    let stats = s.stats_of("t-weights");
    assert_eq!((stats.allocated, stats.blocks, stats.asleep, stats.slept), (5 * MIB, 1, None, 0));
    assert!(stats.reserved >= 5 * MIB);
    // The device's figures count every cache.
    let all = s.allocator.stats();
    assert_eq!(all.allocated_current, 10 * MIB as u64);
    assert!(all.backend.reserved.current >= 10 * MIB);
    // A free finds the block's cache, whichever thread tag is current; a wrong size is refused.
    let err = s.free(weights, 4 * MIB).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(why) if why.contains("size")), "{err}");
    s.free(weights, 5 * MIB).unwrap();
    s.free(cache, 2 * MIB).unwrap();
    s.free(untagged, 3 * MIB).unwrap();
    assert_eq!(s.stats_of("t-weights").allocated, 0);
    assert!(s.free(weights, 5 * MIB).is_err(), "a second free is refused");
    assert_eq!(s.allocator.stats().allocated_current, 0);
}

#[test]
fn a_sleep_gives_the_tags_memory_back_and_a_wake_restores_it_at_the_same_addresses() {
    let s = Setup::new();
    let other = s.alloc_in("s-other", MIB).unwrap();
    let tensors: Vec<_> = [MIB, 7 * MIB, 300 << 10].iter().map(|&b| (s.alloc_in("s-weights", b).unwrap(), b)).collect();
    let weights = s.region(1);
    for (i, &(ptr, _)) in tensors.iter().enumerate() {
        assert!(weights.stamp(addr(ptr), 0xA000 + i as u64));
    }
    let slept = s.sleep("s-weights", Keep::Contents).unwrap();
    assert!(slept >= MIB + 7 * MIB + (300 << 10));
    assert_eq!((weights.mapped_bytes(), weights.reserved()), (0, 0), "nothing of the tag's stays on the device");
    let stats = s.stats_of("s-weights");
    assert_eq!((stats.asleep, stats.slept, stats.reserved, stats.blocks), (Some(Keep::Contents), slept, 0, 3));
    assert!(s.region(0).is_mapped(addr(other), MIB), "other tags stay awake");
    // Allocations in the sleeping region are refused, others go on.
    let refused = s.alloc_in("s-weights", MIB).unwrap_err();
    assert!(is_sleep_state(&refused, "allocation in a sleeping region"), "{refused}");
    let during = s.allocator.allocate(MIB, stream(0x10)).unwrap();
    assert_eq!(s.wake("s-weights").unwrap(), slept);
    for (i, &(ptr, bytes)) in tensors.iter().enumerate() {
        assert!(weights.is_mapped(addr(ptr), bytes), "memory back at the same address");
        assert_eq!(weights.stamp_of(addr(ptr)), Some(0xA000 + i as u64), "contents restored");
    }
    assert_eq!(s.stats_of("s-weights").asleep, None);
    let again = s.alloc_in("s-weights", MIB).unwrap();
    for (ptr, bytes) in tensors.into_iter().chain([(again, MIB), (other, MIB), (during, MIB)]) {
        s.free(ptr, bytes).unwrap();
    }
    assert_eq!(s.allocator.stats().allocated_current, 0);
}

#[test]
fn frees_during_a_sleep_wait_for_the_wake_and_a_second_one_is_refused() {
    let s = Setup::new();
    let a = s.alloc_in("f-weights", 2 * MIB).unwrap();
    let b = s.alloc_in("f-weights", 3 * MIB).unwrap();
    let weights = s.region(0);
    s.sleep("f-weights", Keep::Contents).unwrap();
    let (maps, unmaps) = weights.page_calls();
    s.free(a, 2 * MIB).unwrap();
    assert_eq!(weights.page_calls(), (maps, unmaps), "a sleeping cache is not touched by a free");
    let twice = s.free(a, 2 * MIB).unwrap_err();
    assert!(matches!(twice.kind(), ErrorKind::InvalidArgument(_)), "{twice}");
    let stats = s.stats_of("f-weights");
    assert_eq!((stats.allocated, stats.blocks), (3 * MIB, 1), "the free counts at once");
    assert_eq!(s.allocator.stats().allocated_current, 3 * MIB as u64);
    s.wake("f-weights").unwrap();
    // The held free was made at the wake: its memory is the cache's to hand out again.
    let reused = s.alloc_in("f-weights", 2 * MIB).unwrap();
    assert_eq!(reused, a);
    s.free(reused, 2 * MIB).unwrap();
    s.free(b, 3 * MIB).unwrap();
    assert_eq!(s.stats_of("f-weights").blocks, 0);
}

#[test]
fn keeping_nothing_restores_the_addresses_not_the_bytes() {
    let s = Setup::new();
    let kv = s.alloc_in("n-kv", 4 * MIB).unwrap();
    let backend = s.region(0);
    assert!(backend.stamp(addr(kv), 7));
    s.sleep("n-kv", Keep::Nothing).unwrap();
    assert_eq!(s.stats_of("n-kv").asleep, Some(Keep::Nothing));
    s.wake("n-kv").unwrap();
    assert!(backend.is_mapped(addr(kv), 4 * MIB));
    assert_eq!(backend.stamp_of(addr(kv)), Some(0), "the bytes were dropped");
    s.free(kv, 4 * MIB).unwrap();
}

#[test]
fn sleep_and_wake_refuse_the_wrong_state_and_unknown_tags() {
    let s = Setup::new();
    let ptr = s.alloc_in("r-weights", MIB).unwrap();
    let err = s.wake("r-weights").unwrap_err();
    assert!(is_sleep_state(&err, "wake of an awake region"), "{err}");
    s.sleep("r-weights", Keep::Contents).unwrap();
    let err = s.sleep("r-weights", Keep::Contents).unwrap_err();
    assert!(is_sleep_state(&err, "sleep of a sleeping region"), "{err}");
    let err = s.sleep("r-never-used-anywhere", Keep::Contents).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(why) if why.contains("no region has this tag")), "{err}");
    s.wake("r-weights").unwrap();
    // A tag used elsewhere with no memory on this device sleeps and wakes with nothing to move.
    tag_named("r-elsewhere").unwrap();
    assert_eq!(s.sleep("r-elsewhere", Keep::Contents).unwrap(), 0);
    assert!(s.alloc_in("r-elsewhere", MIB).is_err(), "asleep, even with nothing in it");
    assert_eq!(s.wake("r-elsewhere").unwrap(), 0);
    s.free(ptr, MIB).unwrap();
}

#[test]
fn no_region_sleeps_during_a_capture() {
    let s = Setup::new();
    let ptr = s.alloc_in("c-weights", MIB).unwrap();
    let regions = s.allocator_regions();
    regions.hold_event_queries(true);
    // SAFETY: fake memory.
    let err = unsafe { regions.sleep(existing_tag("c-weights").unwrap(), Keep::Contents) }.unwrap_err();
    assert!(is_sleep_state(&err, "capture"), "{err}");
    assert_eq!(s.stats_of("c-weights").asleep, None);
    regions.hold_event_queries(false);
    s.sleep("c-weights", Keep::Contents).unwrap();
    s.wake("c-weights").unwrap();
    s.free(ptr, MIB).unwrap();
}

#[test]
fn a_failed_sleep_leaves_the_region_awake_and_a_wake_out_of_memory_can_be_retried() {
    let s = Setup::new();
    let ptr = s.alloc_in("o-weights", 6 * MIB).unwrap();
    let backend = s.region(0);
    assert!(backend.stamp(addr(ptr), 42));
    backend.fail_next_evictions(1);
    assert!(s.sleep("o-weights", Keep::Contents).is_err());
    assert_eq!(s.stats_of("o-weights").asleep, None);
    assert!(backend.is_mapped(addr(ptr), 6 * MIB) && backend.stamp_of(addr(ptr)) == Some(42), "as it was");
    let slept = s.sleep("o-weights", Keep::Contents).unwrap();
    backend.set_capacity(Some(slept - PAGE));
    let err = s.wake("o-weights").unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(s.stats_of("o-weights").asleep, Some(Keep::Contents), "still asleep");
    backend.set_capacity(None);
    assert_eq!(s.wake("o-weights").unwrap(), slept);
    assert_eq!(backend.stamp_of(addr(ptr)), Some(42), "nothing lost by the failed wake");
    s.free(ptr, 6 * MIB).unwrap();
}

#[test]
fn record_stream_reaches_a_regions_block_and_its_sleep_waits_for_that_work() {
    let s = Setup::new();
    let ptr = s.alloc_in("w-weights", MIB).unwrap();
    assert!(s.allocator.record_stream(ptr, stream(0x20)).unwrap());
    let backend = s.region(0);
    backend.submit(StreamKey(0x20));
    // Freed with a user on another stream: held back behind an event there.
    s.free(ptr, MIB).unwrap();
    let queued = backend.queued(StreamKey(0x20));
    s.sleep("w-weights", Keep::Contents).unwrap();
    assert!(backend.is_complete(StreamKey(0x20), queued), "the sleep waited for the other stream's work");
    assert_eq!(backend.mapped_bytes(), 0);
    s.wake("w-weights").unwrap();
}

#[test]
fn tag_names_are_checked_and_regions_nest() {
    for bad in ["", "two words", "tab\there", &"x".repeat(MAX_NAME + 1)] {
        let err = tag_named(bad).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{bad:?}: {err}");
    }
    let outer = tag_named("n-outer").unwrap();
    let inner = tag_named("n-inner").unwrap();
    assert_eq!(tag_named("n-outer").unwrap(), outer, "a name keeps its number");
    assert_eq!(name_of(inner).as_deref(), Some("n-inner"));
    assert_eq!(enter(outer), NO_TAG);
    assert_eq!(enter(inner), outer);
    assert_eq!(current(), inner);
    leave(outer).unwrap();
    assert_eq!(current(), outer);
    assert!(leave(u32::MAX).is_err(), "a number no tag has");
    assert_eq!(current(), outer, "unchanged by the refused leave");
    leave(NO_TAG).unwrap();
    assert_eq!(current(), NO_TAG);
}

impl Setup {
    fn allocator_regions(&self) -> &Regions {
        self.allocator.regions().unwrap()
    }
}
