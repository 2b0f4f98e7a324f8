//! The shared core, used under one lock on front-cache misses and overflows: the arena, blocks
//! freed on a foreign stream and waiting for its fence, adoption of idle segments across
//! streams, growth, and release. Every backend call of the allocator happens here, and here the
//! allocator keeps a handle of every stream it holds something of.

use super::arena::{Arena, BlockId, BlockState, SegmentId};
use super::backend::{Backend, StreamKey};
use super::config::{Config, Pool};
use super::size_class::SizeClass;
use super::stats::CurrentPeak;
use crate::error::Result;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// A block freed on a stream other than its owner: reusable once `fence` (recorded on `stream`
/// at the free) completes.
struct PendingFree<F> {
    block: BlockId,
    stream: StreamKey,
    fence: Arc<F>,
}

/// The stream a call into the core is for: its key and its handle.
pub(super) struct On<'a, S> {
    pub key: StreamKey,
    pub stream: &'a S,
}

/// Figures kept under the core's lock, exact.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CoreFigures {
    pub reserved: CurrentPeak,
    /// Reserved bytes per pool (by `Pool as usize`).
    pub pool_reserved: [usize; 2],
    pub active: CurrentPeak,
    pub pending_bytes: usize,
    pub segment_allocations: u64,
    pub segment_releases: u64,
    pub core_hits: u64,
    pub misses: u64,
    pub segments_adopted: u64,
    pub stream_waits: u64,
    pub oom_retries: u64,
}

pub(super) struct Core<B: Backend> {
    arena: Arena<B::Fence>,
    pending: Vec<PendingFree<B::Fence>>,
    /// A handle of every stream the arena has a record of (segments or pending blocks), so that
    /// its key stays that stream's; dropped with the record.
    streams: FxHashMap<StreamKey, B::Stream>,
    pub figures: CoreFigures,
}

impl<B: Backend> Core<B> {
    pub fn new() -> Self {
        Self {
            arena: Arena::new(),
            pending: Vec::new(),
            streams: FxHashMap::default(),
            figures: CoreFigures::default(),
        }
    }

    pub fn arena(&self) -> &Arena<B::Fence> {
        &self.arena
    }

    /// Keys of the streams the core holds a handle of, in order (tests and fuzzing).
    #[cfg(any(test, fuzzing))]
    pub fn held_streams(&self) -> Vec<StreamKey> {
        let mut keys: Vec<_> = self.streams.keys().copied().collect();
        keys.sort();
        keys
    }

    fn hold(&mut self, on: &On<'_, B::Stream>) {
        self.streams.entry(on.key).or_insert_with(|| on.stream.clone());
    }

    fn handle(&self, key: StreamKey) -> &B::Stream {
        self.streams.get(&key).expect("a stream the arena knows has a handle")
    }

    /// A block of `class` from the stream's own free blocks, without growing.
    pub fn take_cached(&mut self, backend: &B, config: &Config, key: StreamKey, class: SizeClass) -> Option<BlockId> {
        self.poll_pending(backend);
        let bytes = class.bytes();
        let pool = config.pool_of(class);
        let target = config.segment_target(pool, self.figures.pool_reserved[pool as usize]);
        let id = self.arena.take_fitting(key, pool, bytes, |size| config.may_cut(pool, target, size, bytes))?;
        self.figures.active.add(class.bytes());
        self.figures.core_hits += 1;
        Some(id)
    }

    /// A block of `class` for the stream: its own free blocks, then an idle segment of another
    /// stream whose work is known to be complete (or, if the config allows, waited for on the
    /// device), then a new segment.
    pub fn take_or_grow(
        &mut self,
        backend: &B,
        config: &Config,
        on: On<'_, B::Stream>,
        class: SizeClass,
    ) -> Result<BlockId> {
        if let Some(id) = self.take_cached(backend, config, on.key, class) {
            return Ok(id);
        }
        let pool = config.pool_of(class);
        if let Some(segment) = self.adoptable(backend, config, &on, pool, class.bytes()) {
            self.hold(&on);
            let from = self.arena.adopt(segment, on.key);
            self.figures.segments_adopted += 1;
            self.forget_if_unused(from);
            let id = self.arena.take(on.key, pool, class.bytes()).expect("an adopted segment fits");
            self.figures.active.add(class.bytes());
            self.figures.core_hits += 1;
            return Ok(id);
        }
        let target = config.segment_target(pool, self.figures.pool_reserved[pool as usize]);
        let bytes = config.segment_bytes(class, target).ok_or_else(|| super::size_overflow(class.bytes()))?;
        if config.release_idle_on_miss {
            // Only what would raise the high-water mark: below it, cached segments cost no more
            // than the peak already did, and keeping them saves `cudaFree`s and later misses.
            // Waiting for a segment's last use costs nothing `cudaFree` would not: it waits for
            // the whole device.
            let over = (self.figures.reserved.current + bytes).saturating_sub(self.figures.reserved.peak);
            if over > 0 {
                self.release_idle(backend, over);
            }
        }
        let base = backend.allocate(bytes)?;
        self.hold(&on);
        self.arena.add_segment(base, bytes, on.key, pool);
        self.figures.reserved.add(bytes);
        self.figures.pool_reserved[pool as usize] += bytes;
        self.figures.segment_allocations += 1;
        self.figures.misses += 1;
        let id = self.arena.take(on.key, pool, class.bytes()).expect("a new segment fits its request");
        self.figures.active.add(class.bytes());
        Ok(id)
    }

    /// An idle segment of another stream that the stream `on` may use at once: its fence
    /// (recorded on the owner while idle, so after every use of it) has completed, or `on` now
    /// waits for it on the device.
    fn adoptable(
        &mut self,
        backend: &B,
        config: &Config,
        on: &On<'_, B::Stream>,
        pool: Pool,
        bytes: usize,
    ) -> Option<SegmentId> {
        let target = config.segment_target(pool, self.figures.pool_reserved[pool as usize]);
        let candidates: Vec<SegmentId> = self
            .arena
            .idle_at_least(pool, bytes)
            .filter(|&s| {
                let segment = self.arena.segment(s);
                segment.owner != on.key && config.may_cut(pool, target, segment.bytes, bytes)
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let done = |arena: &Arena<B::Fence>, s: SegmentId| {
            arena.segment(s).idle_fence.as_deref().is_some_and(|f| backend.is_done(f))
        };
        if let Some(&segment) = candidates.iter().find(|&&s| done(&self.arena, s)) {
            return Some(segment);
        }
        // One new fence per owner covers all of its idle segments; later misses reuse them.
        let mut fresh: FxHashMap<StreamKey, Option<Arc<B::Fence>>> = FxHashMap::default();
        for &s in &candidates {
            if self.arena.segment(s).idle_fence.is_none() {
                let owner = self.arena.segment(s).owner;
                let handle = self.handle(owner);
                let fence = fresh.entry(owner).or_insert_with(|| backend.record(handle).ok().map(Arc::new)).clone();
                self.arena.segment_mut(s).idle_fence = fence;
            }
        }
        if let Some(&segment) = candidates.iter().find(|&&s| done(&self.arena, s)) {
            return Some(segment);
        }
        if !config.cross_stream_waits {
            return None;
        }
        let segment = candidates.into_iter().find(|&s| {
            let fence = self.arena.segment(s).idle_fence.as_deref();
            fence.is_some_and(|f| backend.stream_wait(on.stream, f).is_ok())
        })?;
        self.figures.stream_waits += 1;
        Some(segment)
    }

    /// Returns a block that was out to its owner's free list.
    pub fn give_back(&mut self, id: BlockId) {
        let size = self.arena.give_back(id);
        self.figures.active.sub(size);
    }

    /// Keeps an out block from reuse until the work queued on the stream `on` so far completes.
    /// When no fence can be recorded the block stays out for good: leaked rather than reused
    /// under work.
    pub fn free_pending(&mut self, backend: &B, id: BlockId, on: On<'_, B::Stream>) -> Result<()> {
        let fence = backend.record(on.stream)?;
        self.hold(&on);
        self.arena.set_pending(id, on.key);
        self.figures.pending_bytes += self.arena.block(id).size;
        self.pending.push(PendingFree { block: id, stream: on.key, fence: Arc::new(fence) });
        Ok(())
    }

    /// Frees the pending blocks whose fences have completed (or all of them, waiting, when
    /// `wait`); a fence that cannot be waited for keeps its block pending.
    fn settle_pending(&mut self, backend: &B, wait: bool) {
        if self.pending.is_empty() {
            return;
        }
        let mut settled = Vec::new();
        self.pending.retain(|p| {
            let done = backend.is_done(&p.fence) || (wait && backend.wait(&p.fence).is_ok());
            if done {
                settled.push((p.block, p.stream));
            }
            !done
        });
        for (block, stream) in settled {
            debug_assert_eq!(self.arena.block(block).state, BlockState::Pending);
            let size = self.arena.block(block).size;
            self.arena.end_pending(block, stream);
            self.figures.pending_bytes -= size;
            self.figures.active.sub(size);
            self.forget_if_unused(stream);
        }
    }

    fn poll_pending(&mut self, backend: &B) {
        self.settle_pending(backend, false);
    }

    /// Releases every idle segment to the backend, after waiting for the pending blocks and for
    /// the work of each segment's owner (a segment whose owner's fence fails stays cached).
    /// Blocks the calling thread while that work runs. Returns the bytes released.
    pub fn release_cached(&mut self, backend: &B) -> usize {
        self.settle_pending(backend, true);
        self.release_idle(backend, usize::MAX)
    }

    /// Releases idle segments after their owners' work on them (waited for), large pool first
    /// and largest first, until at least `enough` bytes are released; a segment whose fence
    /// cannot be recorded or waited for stays cached. A fence recorded for a segment stays with
    /// it, for later calls and adoption.
    fn release_idle(&mut self, backend: &B, enough: usize) -> usize {
        let mut fresh: FxHashMap<StreamKey, Option<Arc<B::Fence>>> = FxHashMap::default();
        let mut released = 0;
        for id in self.arena.idle_segments().into_iter().rev() {
            if released >= enough {
                break;
            }
            let owner = self.arena.segment(id).owner;
            if self.arena.segment(id).idle_fence.is_none() {
                let handle = self.handle(owner);
                let fence = fresh.entry(owner).or_insert_with(|| backend.record(handle).ok().map(Arc::new)).clone();
                self.arena.segment_mut(id).idle_fence = fence;
            }
            let fence = self.arena.segment(id).idle_fence.clone();
            let Some(fence) = fence else { continue };
            if !backend.is_done(&fence) && backend.wait(&fence).is_err() {
                continue;
            }
            let segment = self.arena.remove_idle(id);
            // SAFETY: the segment came from this backend's `allocate`, leaves the arena here (so
            // it is released once), and every use of it completed: its blocks were all free, so
            // every use was queued on `owner` before the fence, recorded while the segment was
            // idle, that has just completed (uses on other streams were pending until their own
            // fences completed).
            unsafe { backend.release(segment.base, segment.bytes) };
            self.figures.reserved.sub(segment.bytes);
            self.figures.pool_reserved[segment.pool as usize] -= segment.bytes;
            self.figures.segment_releases += 1;
            released += segment.bytes;
            self.forget_if_unused(owner);
        }
        released
    }

    /// Drops the handle of a stream the core holds nothing of any more.
    fn forget_if_unused(&mut self, stream: StreamKey) {
        if self.arena.drop_if_unused(stream) {
            self.streams.remove(&stream);
        }
    }

    /// Panics if the bookkeeping is inconsistent (tests and fuzzing).
    #[cfg(any(test, fuzzing))]
    pub fn check(&self) {
        self.arena.check();
        let (_, free, _) = self.arena.free_figures();
        assert_eq!(free + self.figures.active.current, self.figures.reserved.current, "free + active = reserved");
        let pending: usize = self.pending.iter().map(|p| self.arena.block(p.block).size).sum();
        assert_eq!(pending, self.figures.pending_bytes);
        assert!(self.pending.iter().all(|p| self.arena.block(p.block).state == BlockState::Pending));
        assert_eq!(self.held_streams(), self.arena.streams(), "a handle for every stream known, no other");
    }
}
