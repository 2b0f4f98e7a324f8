#![no_main]
//! Sequences of allocations, frees on the block's own stream or a foreign one, work queued and
//! completed on streams, flushes, `empty_cache`, refused allocations and refused fences, over the
//! device caching allocator with its fake backend. Checks after every step:
//! - live blocks never overlap;
//! - a block handed out on a stream comes after every earlier use of its memory (same stream,
//!   completed, or waited for on the device);
//! - a released segment or unmapped run of pages had no incomplete work on it and no live block
//!   in it, and every live block lies on mapped pages (over a backend with pages, whose fake
//!   refuses to unmap part of a mapping, as the driver does);
//! - the figures match a model (exact: one thread) and the core's bookkeeping is consistent;
//! - at the end, with every block freed, `empty_cache` releases everything but the segments of
//!   blocks whose fence could not be recorded;
//! - sleep and wake (with evictions refused, fences refused and wakes out of memory): allocations
//!   refused while asleep, no live block mapped while asleep and every one mapped again after,
//!   failed sleeps leaving the cache awake and failed wakes leaving it asleep.

use arbitrary::Arbitrary;
use cuda_mem_cache::fake::FakeBackend as FakeDeviceBackend;
use cuda_mem_cache::{CachedBlock, CachingAllocator, Config as CachingConfig, Keep, StreamKey};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

const KIB: usize = 1024;
const STREAMS: usize = 3;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc { size: u16, stream: u8 },
    Free { index: u8 },
    FreeOn { index: u8, stream: u8 },
    Submit { stream: u8 },
    Complete { stream: u8 },
    Flush,
    EmptyCache,
    FailNext { count: u8 },
    Capacity { segments: u8 },
    FailRecords { fail: bool },
    Sleep { keep: bool },
    Wake,
    FailEviction,
}

#[derive(Arbitrary, Debug)]
struct Input {
    depth: u8,
    cross_stream_waits: bool,
    /// Bits: grow small segments with the pool (1), close fits only, small and large (2),
    /// release idle segments or unmap free pages on a miss (4), front caches of small blocks
    /// only (8), live slack (16), map ahead (32), large blocks apart (64), whole pages at the
    /// lowest address (128).
    thrift: u8,
    /// A backend with pages of 16 KiB (growable segments) rather than whole segments.
    pages: bool,
    /// Pages of the backend's largest new mapping, less one (of 4): mappings go back whole only.
    mapping_pages: u8,
    ops: Vec<Op>,
}

fn stream(index: u8) -> StreamKey {
    StreamKey(1 + usize::from(index) % STREAMS)
}

/// Address ranges and the last free of their memory: (end, stream, work queued there at the free).
#[derive(Default)]
struct History(BTreeMap<usize, (usize, StreamKey, u64)>);

impl History {
    /// Removes and returns the entries overlapping `start..end`, keeping the parts outside it.
    fn take(&mut self, start: usize, end: usize) -> Vec<(StreamKey, u64)> {
        let overlapping: Vec<usize> = self.0.range(..end).filter(|(_, v)| v.0 > start).map(|(&s, _)| s).collect();
        let mut taken = Vec::new();
        for s in overlapping {
            let (e, stream, seq) = self.0.remove(&s).unwrap();
            taken.push((stream, seq));
            if s < start {
                self.0.insert(s, (start, stream, seq));
            }
            if e > end {
                self.0.insert(end, (e, stream, seq));
            }
        }
        taken
    }

    fn record(&mut self, start: usize, end: usize, stream: StreamKey, seq: u64) {
        self.take(start, end);
        self.0.insert(start, (end, stream, seq));
    }
}

struct Model {
    cache: CachingAllocator<FakeDeviceBackend>,
    backend: FakeDeviceBackend,
    held: Vec<CachedBlock>,
    /// Live blocks by address: end.
    live: BTreeMap<usize, usize>,
    history: History,
    /// Bytes (rounded, requested) of blocks whose foreign free failed: held by nobody, for good.
    lost: (usize, usize),
    lost_addrs: Vec<(usize, usize)>,
    peak: usize,
    /// The backend has pages (growable segments).
    pages: bool,
    /// The cache sleeps: no block is freed (the sleep's contract) and allocations are refused.
    asleep: bool,
}

impl Model {
    fn allocated(&self) -> (usize, usize) {
        let held = self.held.iter().fold((0, 0), |(b, r), x| (b + x.bytes(), r + x.requested()));
        (held.0 + self.lost.0, held.1 + self.lost.1)
    }

    fn claim(&mut self, block: &CachedBlock) {
        let (start, end) = (block.ptr().as_ptr().addr(), block.ptr().as_ptr().addr() + block.bytes());
        assert_eq!(start % 256, 0, "misaligned block");
        if let Some((_, &prev_end)) = self.live.range(..=start).next_back() {
            assert!(prev_end <= start, "{block:?} overlaps a live block");
        }
        if let Some((&next, _)) = self.live.range(start..).next() {
            assert!(end <= next, "{block:?} overlaps a live block");
        }
        // Segments released by this allocation (out of memory) may be where the block now lies.
        self.absorb_releases();
        self.live.insert(start, end);
        for (from, seq) in self.history.take(start, end) {
            assert!(self.backend.is_ordered(from, seq, block.stream()), "{block:?} reused before {from:?}'s work");
        }
    }

    fn unclaim(&mut self, block: &CachedBlock, freed_on: StreamKey) {
        let start = block.ptr().as_ptr().addr();
        assert!(self.live.remove(&start).is_some());
        let seq = self.backend.queued(freed_on);
        self.history.record(start, start + block.bytes(), freed_on, seq);
    }

    /// Checks the segments released since the last call and forgets their history.
    fn absorb_releases(&mut self) {
        for (start, bytes) in self.backend.take_released() {
            let end = start + bytes;
            assert!(self.live.range(..end).all(|(_, &e)| e <= start), "released under a live block");
            for (stream, seq) in self.history.take(start, end) {
                assert!(self.backend.is_complete(stream, seq), "released before {stream:?}'s work completed");
            }
        }
    }

    fn check(&mut self) {
        self.absorb_releases();
        self.cache.check_invariants();
        let stats = self.cache.stats();
        let (allocated, requested) = self.allocated();
        self.peak = self.peak.max(allocated);
        assert_eq!((stats.allocated.current, stats.requested.current), (allocated, requested));
        assert_eq!(stats.allocated.peak, self.peak, "one thread: exact peak");
        assert!(stats.requested.peak <= stats.allocated.peak);
        assert_eq!(stats.active.current, allocated + stats.parked_bytes + stats.pending_bytes);
        assert_eq!(stats.reserved.current, self.backend.reserved());
        // A sleeping cache's blocks and free space lie on evicted mappings, out of the reserve.
        let evicted = self.backend.evicted_bytes();
        assert!(self.asleep || evicted == 0, "mappings evicted while awake");
        assert_eq!(stats.free_bytes + stats.active.current + stats.kept_bytes, stats.reserved.current + evicted);
        assert_eq!(stats.kept_bytes, self.backend.kept_bytes());
        assert!(stats.largest_free_block <= stats.free_bytes);
        assert!(stats.reserved.peak >= stats.reserved.current && stats.active.peak >= stats.active.current);
        if self.pages {
            assert_eq!(stats.segments, self.backend.live_ranges());
            for (&start, &end) in &self.live {
                let mapped = self.backend.is_mapped(start, end - start);
                assert!(
                    mapped != self.asleep,
                    "a live block on the map {}: {start:#x}",
                    if mapped { "while asleep" } else { "off it" }
                );
            }
        } else {
            assert_eq!(stats.segments, self.backend.live_segments().len());
            assert_eq!(stats.segment_allocations - stats.segment_releases, stats.segments as u64);
        }
    }
}

fuzz_target!(|input: Input| {
    let config = CachingConfig {
        small_max: 4 * KIB,
        small_segment: 16 * KIB,
        large_segment: 64 * KIB,
        own_segment_from: 32 * KIB,
        granularity: 16 * KIB,
        front_depth: usize::from(input.depth % 5),
        front_max_bytes: 256 * KIB,
        front_max_block: if input.thrift & 8 != 0 { 8 * KIB } else { usize::MAX },
        front_large_slot: input.depth / 5 % 2 == 1,
        cross_stream_waits: input.cross_stream_waits,
        small_segment_divisor: if input.thrift & 1 != 0 { 4 } else { 0 },
        small_fit_divisor: if input.thrift & 2 != 0 { 8 } else { 0 },
        large_fit_slack: if input.thrift & 2 != 0 { 16 * KIB } else { usize::MAX },
        release_idle_on_miss: input.thrift & 4 != 0,
        live_slack_percent: if input.thrift & 16 != 0 { 25 } else { 0 },
        expandable_segments: true,
        max_mapping_bytes: (1 + usize::from(input.mapping_pages % 4)) * 16 * KIB,
        map_ahead_bytes: if input.thrift & 32 != 0 { 48 * KIB } else { 0 },
        own_range_from: if input.thrift & 64 != 0 { 32 * KIB } else { 0 },
        lowest_for_whole_pages: input.thrift & 128 != 0,
    };
    let backend =
        if input.pages { FakeDeviceBackend::with_pages(16 * KIB, 1 << 20) } else { FakeDeviceBackend::default() };
    let cache = CachingAllocator::new(backend.clone(), config).unwrap();
    let mut m = Model {
        cache,
        backend,
        held: Vec::new(),
        live: BTreeMap::new(),
        history: History::default(),
        lost: (0, 0),
        lost_addrs: Vec::new(),
        peak: 0,
        pages: input.pages,
        asleep: false,
    };
    // DEVICE_CACHE_TRACE=1 prints each step, to follow a crash input.
    let trace = std::env::var_os("DEVICE_CACHE_TRACE").is_some();
    for op in input.ops {
        if trace {
            eprintln!("{op:?}");
        }
        match op {
            Op::Alloc { size, stream: s } => match m.cache.alloc(usize::from(size) * 4, &stream(s)) {
                Ok(_) if m.asleep => panic!("an allocation from a sleeping cache"),
                Err(err) if m.asleep => assert!(matches!(err, cuda_mem_cache::Error::SleepState(_)), "{err}"),
                Ok(block) => {
                    if trace {
                        eprintln!("  -> {block:?}");
                    }
                    assert!(block.bytes() >= block.requested() && block.stream() == stream(s));
                    m.claim(&block);
                    m.held.push(block);
                }
                Err(err) => {
                    // Out of memory after the retry, with the cache's figures.
                    assert!(matches!(err, cuda_mem_cache::Error::OutOfMemory { .. }), "{err}");
                }
            },
            Op::Free { index } if !m.held.is_empty() && !m.asleep => {
                let block = m.held.swap_remove(usize::from(index) % m.held.len());
                m.unclaim(&block, block.stream());
                // SAFETY: fake memory is never touched; the model's uses are ordered on the stream.
                unsafe { m.cache.free(block) };
            }
            Op::FreeOn { index, stream: s } if !m.held.is_empty() && !m.asleep => {
                let block = m.held.swap_remove(usize::from(index) % m.held.len());
                let (addr, bytes, requested) = (block.ptr().as_ptr().addr(), block.bytes(), block.requested());
                m.unclaim(&block, stream(s));
                // SAFETY: as above, with the last use on `stream(s)`.
                if unsafe { m.cache.free_on(block, &stream(s)) }.is_err() {
                    m.lost.0 += bytes;
                    m.lost.1 += requested;
                    m.lost_addrs.push((addr, bytes));
                }
            }
            Op::Submit { stream: s } => {
                m.backend.submit(stream(s));
            }
            Op::Complete { stream: s } => m.backend.complete(stream(s)),
            Op::Flush => m.cache.flush_thread(),
            Op::EmptyCache => {
                m.cache.empty_cache();
            }
            Op::FailNext { count } => m.backend.fail_next_allocations(usize::from(count % 4)),
            Op::Capacity { segments } => {
                m.backend.set_capacity((segments != 0).then(|| usize::from(segments) * 64 * KIB));
            }
            Op::FailRecords { fail } => m.backend.fail_records(fail),
            Op::Sleep { keep } => {
                let keep = if keep { Keep::Contents } else { Keep::Nothing };
                // SAFETY: fake memory is never touched, and no block is freed while asleep.
                match unsafe { m.cache.sleep(keep) } {
                    Ok(_) => {
                        assert!(m.pages && !m.asleep, "a sleep without pages, or of a sleeping cache");
                        m.asleep = true;
                        // The sleep waited for every stream the cache holds memory on.
                        m.absorb_releases();
                    }
                    Err(cuda_mem_cache::Error::SleepState(_)) => assert!(m.asleep),
                    Err(cuda_mem_cache::Error::Refused(_)) => assert!(!m.pages),
                    Err(err) => assert!(!m.cache.is_asleep(), "a failed sleep left the cache asleep: {err}"),
                }
                assert_eq!(m.cache.is_asleep(), m.asleep);
            }
            Op::Wake => {
                match m.cache.wake() {
                    Ok(_) => m.asleep = false,
                    Err(cuda_mem_cache::Error::SleepState(_)) => assert!(!m.asleep),
                    Err(err) => assert!(m.asleep && err.is_out_of_memory(), "{err}"),
                }
                assert_eq!(m.cache.is_asleep(), m.asleep);
            }
            Op::FailEviction => m.backend.fail_next_evictions(1),
            _ => {}
        }
        m.check();
    }
    if m.asleep {
        m.backend.set_capacity(None);
        m.backend.fail_next_allocations(0);
        m.cache.wake().expect("a wake with memory to spare");
        m.asleep = false;
        m.check();
    }
    for block in std::mem::take(&mut m.held) {
        m.unclaim(&block, block.stream());
        // SAFETY: as above.
        unsafe { m.cache.free(block) };
    }
    m.backend.fail_records(false);
    m.cache.empty_cache();
    m.check();
    let stats = m.cache.stats();
    assert_eq!((stats.parked_bytes, stats.pending_bytes, stats.allocated.current), (0, 0, m.lost.0));
    // Only segments and pages holding a lost block stay.
    let holds_lost = |start: usize, bytes: usize| m.lost_addrs.iter().any(|&(a, n)| a < start + bytes && start < a + n);
    for (start, bytes) in m.backend.live_segments() {
        assert!(holds_lost(start, bytes), "segment {start:#x} kept");
    }
    // A mapping goes back whole only: one holding a lost block stays whole.
    for (start, bytes) in m.backend.mappings() {
        assert!(holds_lost(start, bytes), "mapping {start:#x} kept");
    }
    if m.lost_addrs.is_empty() {
        assert_eq!(m.backend.reserved(), 0);
        assert!(m.cache.held_streams().is_empty(), "stream handles kept without memory");
    }
});
