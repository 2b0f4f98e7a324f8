//! The shared core, used under one lock on front-cache misses and overflows: the arena, blocks
//! freed on a foreign stream and waiting for its fence, adoption of idle segments across
//! streams, growth, and release. Every backend call of the allocator happens here.

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

/// Figures kept under the core's lock, exact.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CoreFigures {
    pub reserved: CurrentPeak,
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

pub(super) struct Core<F> {
    arena: Arena<F>,
    pending: Vec<PendingFree<F>>,
    pub figures: CoreFigures,
}

impl<F: Send + Sync> Core<F> {
    pub fn new() -> Self {
        Self { arena: Arena::new(), pending: Vec::new(), figures: CoreFigures::default() }
    }

    pub fn arena(&self) -> &Arena<F> {
        &self.arena
    }

    /// A block of `class` from `stream`'s own free blocks, without growing.
    pub fn take_cached<B: Backend<Fence = F>>(
        &mut self,
        backend: &B,
        config: &Config,
        stream: StreamKey,
        class: SizeClass,
    ) -> Option<BlockId> {
        self.poll_pending(backend);
        let id = self.arena.take(stream, config.pool_of(class), class.bytes())?;
        self.note_out(class.bytes());
        self.figures.core_hits += 1;
        Some(id)
    }

    /// A block of `class` for `stream`: its own free blocks, then an idle segment of another
    /// stream whose work is known to be complete (or, if the config allows, waited for on the
    /// device), then a new segment.
    pub fn take_or_grow<B: Backend<Fence = F>>(
        &mut self,
        backend: &B,
        config: &Config,
        stream: StreamKey,
        class: SizeClass,
    ) -> Result<BlockId> {
        if let Some(id) = self.take_cached(backend, config, stream, class) {
            return Ok(id);
        }
        let pool = config.pool_of(class);
        if let Some(segment) = self.adoptable(backend, config, stream, pool, class.bytes()) {
            let from = self.arena.adopt(segment, stream);
            self.figures.segments_adopted += 1;
            self.forget_if_unused(backend, from);
            let id = self.arena.take(stream, pool, class.bytes()).expect("an adopted segment fits");
            self.note_out(class.bytes());
            self.figures.core_hits += 1;
            return Ok(id);
        }
        let bytes = config.segment_bytes(class).ok_or_else(|| super::size_overflow(class.bytes()))?;
        let base = backend.allocate(bytes)?;
        self.arena.add_segment(base, bytes, stream, pool);
        self.figures.reserved.add(bytes);
        self.figures.segment_allocations += 1;
        self.figures.misses += 1;
        let id = self.arena.take(stream, pool, class.bytes()).expect("a new segment fits its request");
        self.note_out(class.bytes());
        Ok(id)
    }

    fn note_out(&mut self, bytes: usize) {
        self.figures.active.add(bytes);
    }

    /// An idle segment of another stream that `stream` may use at once: its fence (recorded on
    /// the owner while idle, so after every use of it) has completed, or `stream` now waits for
    /// it on the device.
    fn adoptable<B: Backend<Fence = F>>(
        &mut self,
        backend: &B,
        config: &Config,
        stream: StreamKey,
        pool: Pool,
        bytes: usize,
    ) -> Option<SegmentId> {
        let candidates: Vec<SegmentId> =
            self.arena.idle_at_least(pool, bytes).filter(|&s| self.arena.segment(s).owner != stream).collect();
        if candidates.is_empty() {
            return None;
        }
        let done =
            |arena: &Arena<F>, s: SegmentId| arena.segment(s).idle_fence.as_deref().is_some_and(|f| backend.is_done(f));
        if let Some(&segment) = candidates.iter().find(|&&s| done(&self.arena, s)) {
            return Some(segment);
        }
        // One new fence per owner covers all of its idle segments; later misses reuse them.
        let mut fresh: FxHashMap<StreamKey, Option<Arc<F>>> = FxHashMap::default();
        for &s in &candidates {
            let segment = self.arena.segment_mut(s);
            if segment.idle_fence.is_none() {
                let owner = segment.owner;
                segment.idle_fence =
                    fresh.entry(owner).or_insert_with(|| backend.record(owner).ok().map(Arc::new)).clone();
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
            fence.is_some_and(|f| backend.stream_wait(stream, f).is_ok())
        })?;
        self.figures.stream_waits += 1;
        Some(segment)
    }

    /// Returns a block that was out to its owner's free list.
    pub fn give_back(&mut self, id: BlockId) {
        let size = self.arena.give_back(id);
        self.figures.active.sub(size);
    }

    /// Keeps an out block from reuse until the work queued on `stream` so far completes. When no
    /// fence can be recorded the block stays out for good: leaked rather than reused under work.
    pub fn free_pending<B: Backend<Fence = F>>(&mut self, backend: &B, id: BlockId, stream: StreamKey) -> Result<()> {
        let fence = backend.record(stream)?;
        self.arena.set_pending(id, stream);
        self.figures.pending_bytes += self.arena.block(id).size;
        self.pending.push(PendingFree { block: id, stream, fence: Arc::new(fence) });
        Ok(())
    }

    /// Frees the pending blocks whose fences have completed (or all of them, waiting, when
    /// `wait`); a fence that cannot be waited for keeps its block pending.
    fn settle_pending<B: Backend<Fence = F>>(&mut self, backend: &B, wait: bool) {
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
            self.forget_if_unused(backend, stream);
        }
    }

    fn poll_pending<B: Backend<Fence = F>>(&mut self, backend: &B) {
        self.settle_pending(backend, false);
    }

    /// Releases every idle segment to the backend, after waiting for the pending blocks and for
    /// the work of each segment's owner (a segment whose owner's fence fails stays cached).
    /// Blocks the calling thread while that work runs. Returns the bytes released.
    pub fn release_cached<B: Backend<Fence = F>>(&mut self, backend: &B) -> usize {
        self.settle_pending(backend, true);
        let mut fresh: FxHashMap<StreamKey, Option<Arc<F>>> = FxHashMap::default();
        let mut released = 0;
        for id in self.arena.idle_segments() {
            let segment = self.arena.segment(id);
            let owner = segment.owner;
            let fence = match &segment.idle_fence {
                Some(fence) => Some(Arc::clone(fence)),
                None => fresh.entry(owner).or_insert_with(|| backend.record(owner).ok().map(Arc::new)).clone(),
            };
            let Some(fence) = fence else { continue };
            if !backend.is_done(&fence) && backend.wait(&fence).is_err() {
                continue;
            }
            let segment = self.arena.remove_idle(id);
            // SAFETY: the segment came from this backend's `allocate`, leaves the arena here (so
            // it is released once), and every use of it completed: its blocks were all free, so
            // every use was queued on `owner` before the fence just waited for (uses on other
            // streams were pending until their own fences completed).
            unsafe { backend.release(segment.base, segment.bytes) };
            self.figures.reserved.sub(segment.bytes);
            self.figures.segment_releases += 1;
            released += segment.bytes;
            self.forget_if_unused(backend, owner);
        }
        released
    }

    fn forget_if_unused<B: Backend<Fence = F>>(&mut self, backend: &B, stream: StreamKey) {
        if self.arena.drop_if_unused(stream) {
            backend.forget_stream(stream);
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
    }
}
