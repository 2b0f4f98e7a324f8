//! One shard of the shared core, used under its own lock on front-cache misses and overflows:
//! the arena of the streams that hash to the shard, blocks freed on a foreign stream and waiting
//! for its fence, adoption of idle segments across streams, growth, and release. Every backend
//! call of the allocator happens here, but for the maps and unmaps of pages a miss makes, which
//! the allocator makes without the shard's lock on pages claimed here ([`MapClaim`],
//! [`UnmapClaim`]); and here the allocator keeps a handle of every stream it holds something of.
//! [`Totals`] are the figures every shard shares (the reserve and its peak), read without a lock.

use super::arena::{Arena, BlockId, BlockState, Fit, SegmentId};
use super::backend::{Backend, Mapped, Pages, StreamKey};
use super::config::{Config, POOLS, Pool};
use super::growable::Run;
use super::size_class::SizeClass;
use super::stats::CurrentPeak;
use crate::Result;
use rustc_hash::FxHashMap;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The reserve of every shard together: changed only when a segment is allocated or released,
/// or pages are mapped or unmapped (under that shard's lock), and when kept pages are released;
/// read without a lock by every shard's decisions. The reserve counts the memory taken from the
/// device: segments, mapped pages, and pages kept unmapped for later maps.
#[derive(Debug, Default)]
pub(super) struct Totals {
    reserved: AtomicUsize,
    peak: AtomicUsize,
    /// Bytes in segments and mapped pages, per pool.
    pool: [AtomicUsize; POOLS],
    /// Bytes of pages unmapped and kept by the backend ([`Pages::unmap`]), in no pool.
    kept: AtomicUsize,
    /// Bytes of mapped pages a sleep gave back ([`Pages::evict`]): out of the reserve, still in
    /// the shards' figures, until the wake.
    slept: AtomicUsize,
    /// Bytes that misses over pages have decided to map and not mapped yet ([`InFlight`]).
    in_flight: AtomicUsize,
}

/// A miss's bytes counted in [`Totals`]' in-flight figure from its budget decision until it
/// drops: misses deciding at once each see what the others are about to map.
pub(super) struct InFlight<'a> {
    totals: &'a Totals,
    bytes: usize,
    ahead: usize,
}

impl InFlight<'_> {
    /// Bytes admitted beyond the miss's own ([`Totals::begin_miss_within`]).
    pub fn ahead(&self) -> usize {
        self.ahead
    }
}

/// What a miss may map beyond its request ([`Config::map_ahead_bytes`]): at most `most` bytes,
/// in whole `page`s, leaving `most` bytes below the reserve's peak
/// ([`Totals::begin_miss_within`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ahead {
    pub most: usize,
    pub page: usize,
}

impl Ahead {
    pub const NONE: Ahead = Ahead { most: 0, page: 1 };
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.totals.in_flight.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl Totals {
    fn add(&self, pool: Pool, bytes: usize) {
        self.grow(bytes);
        self.pool[pool as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    fn grow(&self, bytes: usize) {
        let now = self.reserved.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, pool: Pool, bytes: usize) {
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        self.pool[pool as usize].fetch_sub(bytes, Ordering::Relaxed);
    }

    /// `bytes` mapped into `pool`, `from_kept` of them kept pages: only the rest is new memory.
    fn mapped(&self, pool: Pool, bytes: usize, from_kept: usize) {
        self.kept.fetch_sub(from_kept, Ordering::Relaxed);
        self.grow(bytes - from_kept);
        self.pool[pool as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` of `pool` unmapped and kept: still the device's memory taken, in no pool.
    fn unmapped(&self, pool: Pool, bytes: usize) {
        self.pool[pool as usize].fetch_sub(bytes, Ordering::Relaxed);
        self.kept.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Mapped bytes of `bytes` given back to the device by a sleep: out of the reserve until
    /// the wake.
    pub fn slept(&self, bytes: usize) {
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        self.slept.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The same bytes mapped again by the wake.
    pub fn woke(&self, bytes: usize) {
        self.slept.fetch_sub(bytes, Ordering::Relaxed);
        self.grow(bytes);
    }

    /// Bytes a sleep gave back and no wake has mapped again.
    #[cfg(any(test, feature = "fake"))]
    pub fn asleep(&self) -> usize {
        self.slept.load(Ordering::Relaxed)
    }

    /// Kept pages of `bytes` given back to the device.
    pub fn released_kept(&self, bytes: usize) {
        self.kept.fetch_sub(bytes, Ordering::Relaxed);
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` as about to be mapped until the returned guard drops; returns it and the
    /// bytes other misses were about to map then.
    pub fn begin_miss(&self, bytes: usize) -> (InFlight<'_>, usize) {
        let before = self.in_flight.fetch_add(bytes, Ordering::Relaxed);
        (InFlight { totals: self, bytes, ahead: 0 }, before)
    }

    /// Counts `bytes` as about to be mapped, as [`begin_miss`](Self::begin_miss), if they keep
    /// the reserve within its budget ([`over_budget`](Self::over_budget) of `live_budget`)
    /// together with what other misses are about to map: such a miss needs no decision in
    /// order with others. `None` otherwise, with nothing counted. Counts up to `ahead.most` more
    /// ([`InFlight::ahead`]) where the reserve, with what the others are about to map, stays at
    /// least `ahead.most` below its peak: extras never take the reserve above the peak, nor the
    /// room below it that misses at once need.
    pub fn begin_miss_within(&self, bytes: usize, ahead: Ahead, live_budget: usize) -> Option<InFlight<'_>> {
        let mut others = self.in_flight.load(Ordering::Relaxed);
        loop {
            let total = others.checked_add(bytes)?;
            // Kept pages map without growing the reserve.
            if self.over_budget(total.saturating_sub(self.kept()), live_budget) > 0 {
                return None;
            }
            let reserved = self.reserved();
            // The last `most` bytes below the peak stay for other misses' requests: an extra
            // never takes the room a request at once would need.
            let below_peak = reserved.peak.saturating_sub(reserved.current.saturating_add(total));
            let extra = ahead.most.min(below_peak.saturating_sub(ahead.most)) / ahead.page * ahead.page;
            match self.in_flight.compare_exchange_weak(others, total + extra, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(InFlight { totals: self, bytes: bytes + extra, ahead: extra }),
                Err(now) => others = now,
            }
        }
    }

    /// Bytes of pages kept unmapped.
    pub fn kept(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }

    /// Bytes of segments held now, and the highest figure.
    pub fn reserved(&self) -> CurrentPeak {
        CurrentPeak { current: self.reserved.load(Ordering::Relaxed), peak: self.peak.load(Ordering::Relaxed) }
    }

    fn pool_reserved(&self, pool: Pool) -> usize {
        self.pool[pool as usize].load(Ordering::Relaxed)
    }

    pub fn reset_peak(&self) {
        self.peak.store(self.reserved.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Bytes that `bytes` more would take the reserve above what it may hold without trimming:
    /// its peak so far, or `live_budget` if more.
    pub fn over_budget(&self, bytes: usize, live_budget: usize) -> usize {
        let reserved = self.reserved();
        reserved.current.saturating_add(bytes).saturating_sub(reserved.peak.max(live_budget))
    }
}

/// An idle segment taken out of one shard for a stream of another; its fence has completed, or
/// that stream was made to wait for it.
pub(super) struct Detached {
    base: NonNull<u8>,
    bytes: usize,
    pool: Pool,
}

// SAFETY: the address of device memory the cache owns, never dereferenced by the bookkeeping;
// the shard that receives it takes it over.
unsafe impl Send for Detached {}

/// Pages a miss maps without its shard's lock ([`Core::claim_pages`]): the first `room` bytes
/// from `at`, unmapped pages of a range from [`Pages::reserve`], held out of every list (in a
/// [`Changing`](super::arena::BlockState::Changing) block) so that no other call maps, unmaps or
/// frees them until [`Core::finish_map`]. The map asks for `run.bytes` (whole pages) at least.
pub(super) struct MapClaim {
    pub at: NonNull<u8>,
    run: Run,
    pub room: usize,
    pub max_new: usize,
}

impl MapClaim {
    /// Bytes the map must give at least.
    pub fn bytes(&self) -> usize {
        self.run.bytes
    }
}

/// Whole mappings inside a free block that a trim unmaps ([`Core::claim_trim`]): `bytes` from
/// `at`, out of every list (a [`Changing`](super::arena::BlockState::Changing) block) so that
/// nothing hands them out or maps them until [`Core::finish_trim`], and unused: the owner's
/// fence recorded after their return has completed.
pub(super) struct UnmapClaim {
    block: BlockId,
    at: NonNull<u8>,
    bytes: usize,
    pool: Pool,
}

/// Unmaps the claimed runs.
///
/// # Safety
/// The claims come from [`Core::claim_trim`] and have not been finished: each is whole
/// mappings made by `map`, unused (its fence completed), that nothing else maps or unmaps.
pub(super) unsafe fn unmap_claimed<E: crate::BackendError>(pages: &dyn Pages<Error = E>, claimed: &[UnmapClaim]) {
    for claim in claimed {
        // SAFETY: the caller's contract.
        unsafe { pages.unmap(claim.at, claim.bytes) };
    }
}

/// A block freed on a stream other than its owner: reusable once `fence` (recorded on `stream`
/// at the free) completes.
struct PendingFree<F> {
    block: BlockId,
    stream: StreamKey,
    fence: Arc<F>,
}

/// What the core keeps of a stream it has a record of: a clone of its handle (so that its key
/// stays that stream's) and the two newest fences recorded on it as an owner of free blocks,
/// each with the stream's count of returns then ([`Arena::returns`]): a fence follows every use
/// of the free blocks returned up to its count. Two, so that a fence recorded for blocks
/// returned since does not hide an older one that has completed.
struct Held<S, F> {
    stream: S,
    fences: [Option<(Arc<F>, u64)>; 2],
}

/// The stream a call into the core is for: its key and its handle.
pub(super) struct On<'a, S> {
    pub key: StreamKey,
    pub stream: &'a S,
}

/// Figures kept under the shard's lock, exact for the shard.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CoreFigures {
    /// Bytes of this shard's segments, but pages claimed for an unmap (their sum over shards,
    /// with `unmapping` and the kept pages, is [`Totals::reserved`]).
    pub reserved: usize,
    /// Bytes of pages claimed for an unmap ([`Core::claim_trim`]) that no [`Core::finish_trim`]
    /// has ended: still mapped (or, after a backend's `unmap` panicked, mapped or not).
    pub unmapping: usize,
    pub active: CurrentPeak,
    pub pending_bytes: usize,
    pub segment_allocations: u64,
    pub segment_releases: u64,
    pub core_hits: u64,
    pub misses: u64,
    pub segments_adopted: u64,
    pub stream_waits: u64,
    pub oom_retries: u64,
    pub blocks_lent: u64,
}

impl CoreFigures {
    /// Adds another shard's figures; the sum of the shards' active peaks bounds the peak of the
    /// sum (exact with one shard in use, as with one stream).
    pub fn absorb(&mut self, other: &CoreFigures) {
        self.reserved += other.reserved;
        self.unmapping += other.unmapping;
        self.active.current += other.active.current;
        self.active.peak += other.active.peak;
        self.pending_bytes += other.pending_bytes;
        self.segment_allocations += other.segment_allocations;
        self.segment_releases += other.segment_releases;
        self.core_hits += other.core_hits;
        self.misses += other.misses;
        self.segments_adopted += other.segments_adopted;
        self.stream_waits += other.stream_waits;
        self.oom_retries += other.oom_retries;
        self.blocks_lent += other.blocks_lent;
    }
}

pub(super) struct Core<B: Backend> {
    arena: Arena<B::Fence>,
    pending: Vec<PendingFree<B::Fence>>,
    /// Every stream the arena has a record of (segments, pending or lent blocks); dropped with
    /// the record.
    streams: FxHashMap<StreamKey, Held<B::Stream, B::Fence>>,
    /// Blocks of this shard's segments lent to other streams, by their borrower.
    lent: FxHashMap<BlockId, StreamKey>,
    /// Lent blocks their borrower freed whose fence could not be recorded yet: still out and
    /// lent, counted as pending, tried again at every poll.
    unfenced: Vec<BlockId>,
    pub figures: CoreFigures,
}

impl<B: Backend> Core<B> {
    pub fn new() -> Self {
        Self {
            arena: Arena::new(),
            pending: Vec::new(),
            streams: FxHashMap::default(),
            lent: FxHashMap::default(),
            unfenced: Vec::new(),
            figures: CoreFigures::default(),
        }
    }

    pub fn arena(&self) -> &Arena<B::Fence> {
        &self.arena
    }

    /// Keys of the streams the core holds a handle of, in order (tests and fuzzing).
    #[cfg(any(test, feature = "fake"))]
    pub fn held_streams(&self) -> Vec<StreamKey> {
        let mut keys: Vec<_> = self.streams.keys().copied().collect();
        keys.sort();
        keys
    }

    /// Waits on the host for the work queued so far on every stream this shard holds (a fence
    /// recorded on each, all recorded before the first wait).
    pub fn wait_for_streams(&self, backend: &B) -> Result<(), B::Error> {
        let fences: Vec<B::Fence> =
            self.streams.values().map(|held| backend.record(&held.stream)).collect::<std::result::Result<_, _>>()?;
        Ok(fences.iter().try_for_each(|fence| backend.wait(fence))?)
    }

    fn hold(&mut self, on: &On<'_, B::Stream>) {
        self.streams.entry(on.key).or_insert_with(|| Held { stream: on.stream.clone(), fences: [None, None] });
    }

    fn handle(&self, key: StreamKey) -> &B::Stream {
        &self.streams.get(&key).expect("a stream the arena knows has a handle").stream
    }

    /// A fence on `owner` that follows every use of its free blocks returned up to `freed`:
    /// the newest one if it does, else one recorded now (kept for later calls, with the one
    /// before it). `None` when no fence can be recorded.
    fn owner_fence(&mut self, backend: &B, owner: StreamKey, freed: u64) -> Option<Arc<B::Fence>> {
        let returns = self.arena.returns(owner);
        let held = self.streams.get_mut(&owner).expect("a stream the arena knows has a handle");
        if let Some((fence, at)) = &held.fences[0]
            && *at >= freed
        {
            return Some(Arc::clone(fence));
        }
        let fence = Arc::new(backend.record(&held.stream).ok()?);
        held.fences[1] = held.fences[0].replace((Arc::clone(&fence), returns));
        Some(fence)
    }

    /// Whether a fence on `owner` follows every use of a free block returned at `freed` and has
    /// completed (never blocks, records nothing).
    fn covered_done(&self, backend: &B, owner: StreamKey, freed: u64) -> bool {
        let held = self.streams.get(&owner).expect("a stream the arena knows has a handle");
        held.fences.iter().flatten().any(|(fence, at)| *at >= freed && backend.is_done(fence))
    }

    /// Bytes of the smallest free block of this shard that [`Core::lend`] could cut `class`
    /// from for `on`, whatever its fences.
    pub fn smallest_lendable(
        &self,
        config: &Config,
        totals: &Totals,
        on: StreamKey,
        class: SizeClass,
    ) -> Option<usize> {
        self.lendable(config, totals, on, class).next().map(|(size, _, _)| size)
    }

    /// The best fit of every stream of this shard but `on` that may be cut to `class` (a block of
    /// a growable segment, or one the pool's fit rules allow), smallest first: (size, id, owner).
    fn lendable<'a>(
        &'a self,
        config: &'a Config,
        totals: &Totals,
        on: StreamKey,
        class: SizeClass,
    ) -> impl Iterator<Item = (usize, BlockId, StreamKey)> + 'a {
        let (bytes, pool) = (class.bytes(), config.pool_of(class));
        let target = config.segment_target(pool, totals.pool_reserved(pool));
        self.arena
            .lendable(on, pool, bytes)
            .into_iter()
            .filter(move |&(size, id, _)| self.arena.is_growable(id) || config.may_cut(pool, target, size, bytes))
    }

    /// A free block of another stream of this shard for `on`, lent: cut to `class` from the best
    /// fit of a stream whose work on it is known to be complete (a fence on its owner recorded
    /// after its return, polled), else, when `wait` and the config allow, one that `on` now waits
    /// for on the device. The block stays this shard's: [`Core::return_lent`] takes it back,
    /// pending a fence on the stream it was freed on.
    pub fn lend(
        &mut self,
        backend: &B,
        config: &Config,
        totals: &Totals,
        on: &On<'_, B::Stream>,
        class: SizeClass,
        wait: bool,
    ) -> Option<BlockId> {
        self.poll_pending(backend);
        let candidates: Vec<_> = (self.lendable(config, totals, on.key, class))
            .map(|(_, id, owner)| (id, owner, self.arena.block(id).freed))
            .collect();
        let done = |core: &Self| {
            candidates.iter().find(|&&(_, owner, freed)| core.covered_done(backend, owner, freed)).copied()
        };
        let mut found = done(self);
        if found.is_none() && !candidates.is_empty() {
            // One new fence per owner whose newest does not cover its candidate.
            for &(_, owner, freed) in &candidates {
                self.owner_fence(backend, owner, freed);
            }
            found = done(self);
            if found.is_none() && wait && config.cross_stream_waits {
                found = candidates.iter().copied().find(|&(_, owner, freed)| {
                    let fence = self.owner_fence(backend, owner, freed);
                    fence.is_some_and(|f| backend.stream_wait(on.stream, &f).is_ok())
                });
                self.figures.stream_waits += u64::from(found.is_some());
            }
        }
        let (id, _, _) = found?;
        let bytes = class.bytes();
        let id = self.arena.cut(id, bytes);
        self.hold(on);
        self.arena.lend(id, on.key);
        self.lent.insert(id, on.key);
        self.figures.active.add(bytes);
        self.figures.core_hits += 1;
        self.figures.blocks_lent += 1;
        Some(id)
    }

    /// Whether `id` is a block of this shard out to `borrower` as lent at `ptr`.
    pub fn is_lent_to(&self, id: BlockId, ptr: NonNull<u8>, borrower: StreamKey) -> bool {
        self.arena.is_out_at(id, ptr) && self.lent.get(&id) == Some(&borrower)
    }

    /// Takes back a lent block, freed on `on` (its borrower's stream when `None`): free again
    /// once the work queued there so far completes. When no fence can be recorded the block
    /// stays out (and lent) for good, as in [`Core::free_pending`].
    pub fn return_lent(&mut self, backend: &B, id: BlockId, on: Option<On<'_, B::Stream>>) -> Result<(), B::Error> {
        let borrower = *self.lent.get(&id).expect("a lent block");
        let own = self.handle(borrower).clone();
        let on = on.unwrap_or(On { key: borrower, stream: &own });
        self.free_pending(backend, id, on)?;
        self.lent.remove(&id);
        self.arena.end_lend(borrower);
        self.forget_if_unused(borrower);
        Ok(())
    }

    /// A block of `class` from the stream's own free blocks, without growing.
    pub fn take_cached(
        &mut self,
        backend: &B,
        config: &Config,
        totals: &Totals,
        key: StreamKey,
        class: SizeClass,
    ) -> Option<BlockId> {
        self.poll_pending(backend);
        let bytes = class.bytes();
        let pool = config.pool_of(class);
        // A growable segment's free blocks serve any request: what a cut leaves is trimmed to
        // whole pages when memory is short, so it strands at most a page on each side.
        let target = config.segment_target(pool, totals.pool_reserved(pool));
        let fits = |size, growable| growable || config.may_cut(pool, target, size, bytes);
        let id = self.arena.take_fitting(key, pool, bytes, Self::fit(backend, config, pool, bytes), fits)?;
        self.figures.active.add(class.bytes());
        self.figures.core_hits += 1;
        Some(id)
    }

    /// How a request of `bytes` in `pool` chooses its free block: the lowest that fits where
    /// [`Config::lowest_for_whole_pages`] asks for it (the larger classes, a whole number of
    /// pages, over growable segments), else the best fit.
    fn fit(backend: &B, config: &Config, pool: Pool, bytes: usize) -> Fit {
        let whole_pages = || {
            config.expandable_segments && backend.pages().is_some_and(|pages| bytes.is_multiple_of(pages.page_bytes()))
        };
        if config.lowest_for_whole_pages && pool != Pool::Small && whole_pages() { Fit::Lowest } else { Fit::Best }
    }

    /// A block of `class` for the stream from this shard: its own free blocks, then an idle
    /// segment of another stream of the shard whose work is known to be complete (or, when
    /// `wait` and the config allow, waited for on the device).
    pub fn take_local(
        &mut self,
        backend: &B,
        config: &Config,
        totals: &Totals,
        on: &On<'_, B::Stream>,
        class: SizeClass,
        wait: bool,
    ) -> Option<BlockId> {
        if let Some(id) = self.take_cached(backend, config, totals, on.key, class) {
            return Some(id);
        }
        let pool = config.pool_of(class);
        let segment = self.adoptable(backend, config, totals, on, pool, class.bytes(), wait)?;
        self.hold(on);
        let from = self.arena.adopt(segment, on.key);
        self.figures.segments_adopted += 1;
        self.forget_if_unused(from);
        Some(self.take_new(on.key, pool, class, "an adopted segment fits"))
    }

    /// An idle segment of this shard that stream `on` (of another shard) may use at once, taken
    /// out of the shard: see [`Core::adoptable`].
    pub fn detach_adoptable(
        &mut self,
        backend: &B,
        config: &Config,
        totals: &Totals,
        on: &On<'_, B::Stream>,
        class: SizeClass,
        wait: bool,
    ) -> Option<Detached> {
        let pool = config.pool_of(class);
        let id = self.adoptable(backend, config, totals, on, pool, class.bytes(), wait)?;
        let segment = self.arena.remove_idle(id);
        self.figures.reserved -= segment.bytes;
        self.forget_if_unused(segment.owner);
        Some(Detached { base: segment.base, bytes: segment.bytes, pool: segment.pool })
    }

    /// Takes over a segment detached from another shard for stream `on`, and cuts `class` from it.
    pub fn attach(&mut self, detached: Detached, on: &On<'_, B::Stream>, class: SizeClass) -> BlockId {
        self.hold(on);
        self.arena.add_segment(detached.base, detached.bytes, on.key, detached.pool);
        self.figures.reserved += detached.bytes;
        self.figures.segments_adopted += 1;
        self.take_new(on.key, detached.pool, class, "an adopted segment fits")
    }

    /// A new segment of `bytes` (sized by [`Core::segment_bytes`] before any release) for
    /// `class`, owned by `on`, and the block cut from it.
    pub fn grow(
        &mut self,
        backend: &B,
        config: &Config,
        totals: &Totals,
        on: &On<'_, B::Stream>,
        class: SizeClass,
        bytes: usize,
    ) -> Result<BlockId, B::Error> {
        let pool = config.pool_of(class);
        let base = backend.allocate(bytes)?;
        self.hold(on);
        self.arena.add_segment(base, bytes, on.key, pool);
        self.figures.reserved += bytes;
        totals.add(pool, bytes);
        self.figures.segment_allocations += 1;
        self.figures.misses += 1;
        let id = self.arena.take(on.key, pool, class.bytes()).expect("a new segment fits its request");
        self.figures.active.add(class.bytes());
        Ok(id)
    }

    /// Bytes of the segment a miss of `class` would allocate now.
    pub fn segment_bytes(config: &Config, totals: &Totals, class: SizeClass) -> Result<usize, B::Error> {
        let pool = config.pool_of(class);
        let target = config.segment_target(pool, totals.pool_reserved(pool));
        config.segment_bytes(class, target).ok_or_else(|| super::size_overflow(class.bytes()))
    }

    fn take_new(&mut self, key: StreamKey, pool: Pool, class: SizeClass, why: &str) -> BlockId {
        let id = self.arena.take(key, pool, class.bytes()).expect(why);
        self.figures.active.add(class.bytes());
        self.figures.core_hits += 1;
        id
    }

    /// An idle segment of another stream that the stream `on` may use at once: its fence
    /// (recorded on the owner while idle, so after every use of it) has completed, or, when
    /// `wait` and the config allow, `on` now waits for it on the device.
    #[allow(clippy::too_many_arguments)] // the shard's context (backend, config, totals) and the request
    fn adoptable(
        &mut self,
        backend: &B,
        config: &Config,
        totals: &Totals,
        on: &On<'_, B::Stream>,
        pool: Pool,
        bytes: usize,
        wait: bool,
    ) -> Option<SegmentId> {
        let target = config.segment_target(pool, totals.pool_reserved(pool));
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
        if !(wait && config.cross_stream_waits) {
            return None;
        }
        let segment = candidates.into_iter().find(|&s| {
            let fence = self.arena.segment(s).idle_fence.as_deref();
            fence.is_some_and(|f| backend.stream_wait(on.stream, f).is_ok())
        })?;
        self.figures.stream_waits += 1;
        Some(segment)
    }

    /// Bytes of pages a miss of `class` on `key` would map now, and the free block the mapping
    /// would extend (trimming it would only make the miss map more).
    pub fn pages_to_map(
        &self,
        config: &Config,
        pages: &dyn Pages<Error = B::Error>,
        key: StreamKey,
        class: SizeClass,
    ) -> (usize, Option<BlockId>) {
        match self.arena.run_to_map(key, config.pool_of(class), class.bytes()) {
            Some(run) => (run.bytes, self.arena.free_before(run.block)),
            None => (class.bytes().next_multiple_of(pages.page_bytes()), None),
        }
    }

    /// Claims the pages a miss of `class` on `on` maps next, in its growable segment of the pool
    /// (reserved on the stream's first miss there), for a [`Pages::map`] made without the
    /// shard's lock: see [`MapClaim`]. The claim spans what the miss needs, up to `ahead` bytes
    /// more where the unmapped run has them ([`Config::map_ahead_bytes`]), and room for the one
    /// kept mapping the map may choose instead (never larger than the largest new one).
    pub fn claim_pages(
        &mut self,
        pages: &dyn Pages<Error = B::Error>,
        config: &Config,
        on: &On<'_, B::Stream>,
        class: SizeClass,
        ahead: usize,
    ) -> Result<MapClaim, B::Error> {
        let pool = config.pool_of(class);
        let page = pages.page_bytes();
        let run = match self.arena.run_to_map(on.key, pool, class.bytes()) {
            Some(run) => run,
            None => {
                let range = pages.range_bytes().max(class.bytes()).next_multiple_of(page);
                let base = pages.reserve(range)?;
                self.hold(on);
                self.arena.add_growable(base, range, page, on.key, pool);
                self.arena.run_to_map(on.key, pool, class.bytes()).expect("a new range fits its request")
            }
        };
        let run = Run { bytes: run.bytes.saturating_add(ahead).min(self.arena.room(run)) / page * page, ..run };
        let max_new = config.largest_new_mapping(run.bytes);
        let largest = max_new.max(config.max_mapping_bytes).max(page);
        let room = self.arena.room(run).min(run.bytes.saturating_add(largest)) / page * page;
        self.arena.claim_unmapped(run, room);
        Ok(MapClaim { at: self.arena.at(run.segment, run.offset), run, room, max_new })
    }

    /// Ends `claim` with what its [`Pages::map`] did: on success the mapped pages join the
    /// stream's free memory and a block of `class` is taken for `on` from it, if one fits (a
    /// free block the mapping extended may have been taken meanwhile: `None`, and the caller
    /// maps again); on failure the claim is unmapped again and the error returned.
    pub fn finish_map(
        &mut self,
        config: &Config,
        totals: &Totals,
        on: &On<'_, B::Stream>,
        class: SizeClass,
        claim: MapClaim,
        mapped: std::result::Result<Mapped, B::Error>,
    ) -> Result<Option<BlockId>, B::Error> {
        let mapped = match mapped {
            Ok(mapped) => mapped,
            Err(err) => {
                self.arena.abandon_map(claim.run);
                return Err(err.into());
            }
        };
        assert!(
            mapped.bytes >= claim.run.bytes
                && mapped.bytes <= claim.room
                && mapped.mappings.iter().sum::<usize>() == mapped.bytes,
            "Pages::map mapped what it was asked for"
        );
        let pool = self.arena.segment(claim.run.segment).pool;
        self.arena.finish_map(claim.run, &mapped.mappings);
        self.figures.reserved += mapped.bytes;
        totals.mapped(pool, mapped.bytes, mapped.from_kept);
        self.figures.segment_allocations += 1;
        self.figures.misses += 1;
        let id = self.arena.take(on.key, config.pool_of(class), class.bytes());
        if id.is_some() {
            self.figures.active.add(class.bytes());
        }
        Ok(id)
    }

    /// Bytes of the largest run of whole pages inside a free block of this shard.
    pub fn largest_trimmable(&self) -> usize {
        self.arena.trimmable().first().map_or(0, |run| run.bytes)
    }

    /// Claims whole mappings inside free blocks (but `keep`) for unmapping, largest runs first
    /// and each run from its end, until at least `enough` bytes are claimed, each after its
    /// owner's work on it: a fence on the owner recorded after the block's return that has
    /// completed, or, when `wait`, that the calling thread waits for. Without `wait` a run whose
    /// fence is not done stays mapped (a fence is recorded for later calls), so a miss never
    /// blocks on another stream's work. The claimed runs leave the shard's figures now; the
    /// caller unmaps them (without the lock, if it likes) and ends the claims with
    /// [`Core::finish_trim`]. Only what is needed goes: the rest of a run stays mapped for its
    /// owner, whose next miss would otherwise map it back (the driver's cost is per mapping).
    pub fn claim_trim(&mut self, backend: &B, enough: usize, keep: Option<BlockId>, wait: bool) -> Vec<UnmapClaim> {
        let runs: Vec<_> = self.arena.trimmable().into_iter().filter(|run| Some(run.block) != keep).collect();
        let (mut claimed, mut bytes) = (Vec::new(), 0);
        for run in runs {
            if bytes >= enough {
                break;
            }
            let owner = self.arena.segment(run.segment).owner;
            let freed = self.arena.block(run.block).freed;
            if !self.covered_done(backend, owner, freed) {
                let Some(fence) = self.owner_fence(backend, owner, freed) else { continue };
                if !(backend.is_done(&fence) || (wait && backend.wait(&fence).is_ok())) {
                    continue;
                }
            }
            let run = self.arena.tail_of(run, enough - bytes);
            let at = self.arena.at(run.segment, run.offset);
            let pool = self.arena.segment(run.segment).pool;
            let block = self.arena.claim_mapped(run);
            self.figures.reserved -= run.bytes;
            self.figures.unmapping += run.bytes;
            self.figures.segment_releases += 1;
            bytes += run.bytes;
            claimed.push(UnmapClaim { block, at, bytes: run.bytes, pool });
        }
        claimed
    }

    /// Ends the claims of [`Core::claim_trim`], now unmapped ([`Pages::unmap`]): their pages are
    /// kept by the backend. Returns the bytes.
    pub fn finish_trim(&mut self, totals: &Totals, claimed: &[UnmapClaim]) -> usize {
        for claim in claimed {
            self.arena.finish_unmap(claim.block);
            self.figures.unmapping -= claim.bytes;
            totals.unmapped(claim.pool, claim.bytes);
        }
        claimed.iter().map(|claim| claim.bytes).sum()
    }

    /// [`Core::claim_trim`], the unmaps and [`Core::finish_trim`] under the shard's lock: see
    /// the first. Returns the bytes unmapped.
    pub fn trim(
        &mut self,
        backend: &B,
        pages: &dyn Pages<Error = B::Error>,
        totals: &Totals,
        enough: usize,
        wait: bool,
    ) -> usize {
        let claimed = self.claim_trim(backend, enough, None, wait);
        // SAFETY: see `UnmapClaim`.
        unsafe { unmap_claimed(pages, &claimed) };
        self.finish_trim(totals, &claimed)
    }

    /// Gives back the address ranges of growable segments with nothing mapped.
    fn free_unmapped_ranges(&mut self, pages: &dyn Pages<Error = B::Error>) {
        for id in self.arena.unmapped_segments() {
            let segment = self.arena.remove_unmapped(id);
            // SAFETY: a range from `reserve` with nothing mapped, out of the arena now (freed once).
            unsafe { pages.free(segment.base, segment.bytes) };
            self.forget_if_unused(segment.owner);
        }
    }

    /// Returns a block that was out to its owner's free list.
    pub fn give_back(&mut self, id: BlockId) {
        let size = self.arena.give_back(id);
        self.figures.active.sub(size);
    }

    /// Keeps an out block from reuse until the work queued on the stream `on` so far completes.
    /// When no fence can be recorded the block stays out for good: leaked rather than reused
    /// under work.
    pub fn free_pending(&mut self, backend: &B, id: BlockId, on: On<'_, B::Stream>) -> Result<(), B::Error> {
        let fence = backend.record(on.stream)?;
        self.hold(&on);
        self.arena.set_pending(id, on.key);
        self.figures.pending_bytes += self.arena.block(id).size;
        self.pending.push(PendingFree { block: id, stream: on.key, fence: Arc::new(fence) });
        Ok(())
    }

    /// Takes back a lent block its borrower freed on its own stream; when no fence can be
    /// recorded there now, the block waits as pending (out) and the fence is tried again at
    /// every poll, so that a passing failure loses nothing.
    pub fn return_lent_or_retry(&mut self, backend: &B, id: BlockId) {
        if self.return_lent(backend, id, None).is_err() {
            self.unfenced.push(id);
            self.figures.pending_bytes += self.arena.block(id).size;
        }
    }

    /// Frees the pending blocks whose fences have completed (or all of them, waiting, when
    /// `wait`); a fence that cannot be waited for keeps its block pending.
    fn settle_pending(&mut self, backend: &B, wait: bool) {
        for id in std::mem::take(&mut self.unfenced) {
            self.figures.pending_bytes -= self.arena.block(id).size;
            self.return_lent_or_retry(backend, id);
        }
        if self.pending.is_empty() {
            return;
        }
        let mut settled = Vec::new();
        // Fences on one stream complete in the order they were recorded, which is the list's:
        // after one that has not, the stream's later ones are not queried.
        let mut running: Vec<StreamKey> = Vec::new();
        self.pending.retain(|p| {
            if !wait && running.contains(&p.stream) {
                return true;
            }
            let done = backend.is_done(&p.fence) || (wait && backend.wait(&p.fence).is_ok());
            if done {
                settled.push((p.block, p.stream));
            } else {
                running.push(p.stream);
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

    /// Returns the pending blocks whose fences have completed (queried, never waited for).
    pub fn poll_pending(&mut self, backend: &B) {
        self.settle_pending(backend, false);
    }

    /// Releases every idle segment to the backend and unmaps every free page (kept by the
    /// backend until the caller releases them), after waiting for the pending blocks and for
    /// the work of each owner (a segment or run whose owner's fence fails stays). Blocks the
    /// calling thread while that work runs. Returns the bytes of segments released.
    pub fn release_cached(&mut self, backend: &B, totals: &Totals) -> usize {
        self.settle_pending(backend, true);
        let released = self.release_idle(backend, totals, usize::MAX, (Pool::Small, 0));
        if let Some(pages) = backend.pages() {
            self.trim(backend, pages, totals, usize::MAX, true);
            self.free_unmapped_ranges(pages);
        }
        released
    }

    /// (pool, bytes) of every idle segment, in no particular order.
    pub fn idle_keys(&self) -> Vec<(Pool, usize)> {
        self.arena
            .idle_segments()
            .into_iter()
            .map(|id| (self.arena.segment(id).pool, self.arena.segment(id).bytes))
            .collect()
    }

    /// Releases idle segments from `from` (pool, bytes) up, after their owners' work on them
    /// (waited for), large pool first and largest first, until at least `enough` bytes are
    /// released; a segment whose fence cannot be recorded or waited for stays cached. A fence
    /// recorded for a segment stays with it, for later calls and adoption.
    pub fn release_idle(&mut self, backend: &B, totals: &Totals, enough: usize, from: (Pool, usize)) -> usize {
        let mut fresh: FxHashMap<StreamKey, Option<Arc<B::Fence>>> = FxHashMap::default();
        let mut released = 0;
        for id in self.arena.idle_segments().into_iter().rev() {
            let segment = self.arena.segment(id);
            if released >= enough || (segment.pool, segment.bytes) < from {
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
            self.figures.reserved -= segment.bytes;
            totals.sub(segment.pool, segment.bytes);
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
    #[cfg(any(test, feature = "fake"))]
    pub fn check(&self) {
        self.arena.check();
        let (_, free, _) = self.arena.free_figures();
        assert_eq!(free + self.figures.active.current, self.figures.reserved, "free + active = reserved");
        let pending: usize = self
            .pending
            .iter()
            .map(|p| p.block)
            .chain(self.unfenced.iter().copied())
            .map(|b| self.arena.block(b).size)
            .sum();
        assert_eq!(pending, self.figures.pending_bytes);
        assert!(self.unfenced.iter().all(|b| self.lent.contains_key(b)), "unfenced blocks are lent");
        assert!(self.pending.iter().all(|p| self.arena.block(p.block).state == BlockState::Pending));
        assert_eq!(self.held_streams(), self.arena.streams(), "a handle for every stream known, no other");
        assert!(self.lent.iter().all(|(&id, _)| self.arena.block(id).state == BlockState::Out), "lent blocks are out");
        for key in self.arena.streams() {
            assert_eq!(self.lent.values().filter(|&&b| b == key).count(), self.arena.lent_to(key), "lent to {key:?}");
        }
    }
}
