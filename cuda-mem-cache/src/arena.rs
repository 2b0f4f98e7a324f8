//! Segments carved into blocks: best fit per stream and pool, splitting on the way out and
//! coalescing with free neighbours on the way back. Pure bookkeeping under the core's lock: no
//! backend calls; fences are only stored here.
//!
//! Every segment belongs to one stream (its owner), and so do all its free blocks: a free block
//! is reusable at once by its owner only. Another stream gets a free block only lent (cut from
//! the owner's list, out, and back to it through a fence on the borrower), or a whole segment
//! while it is idle (one free block covering all of it); the core decides both with fences. A
//! free block carries the owner's count of returns when it last came back (`freed`), so that a
//! fence recorded on the owner after that count shows which free blocks it covers.

use super::backend::StreamKey;
use super::config::{POOLS, Pool};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::ptr::NonNull;
use std::sync::Arc;

pub(super) type BlockId = u32;
pub(super) type SegmentId = u32;

/// How a request chooses among the free blocks large enough for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fit {
    /// The smallest (the fewest bytes left over).
    Best,
    /// The one at the lowest address ([`Config::lowest_for_whole_pages`](super::Config::lowest_for_whole_pages)).
    Lowest,
}

/// Where a block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BlockState {
    /// In its owner's free list.
    Free,
    /// Handed out: held by a user or parked in a thread's front cache.
    Out,
    /// Freed on another stream; reusable once that stream's fence completes.
    Pending,
    /// Addresses of a growable segment with no memory behind them: whole pages, never next to
    /// another unmapped block.
    Unmapped,
    /// Whole pages of a growable segment that a thread maps or unmaps without the shard's lock:
    /// in no list and merged with nothing until that thread finishes ([`Arena::claim_unmapped`],
    /// [`Arena::claim_mapped`]).
    Changing,
}

pub(super) struct Block {
    pub offset: usize,
    pub size: usize,
    pub segment: SegmentId,
    pub state: BlockState,
    /// The owner's [`StreamLists::returns`] when the block last became free (the latest of its
    /// merged parts): a fence recorded on the owner at that count or later follows every use.
    pub freed: u64,
    /// Neighbours in address order within the segment.
    pub(super) prev: Option<BlockId>,
    pub(super) next: Option<BlockId>,
}

pub(super) struct Segment<F> {
    pub base: NonNull<u8>,
    pub bytes: usize,
    pub owner: StreamKey,
    pub pool: Pool,
    /// A fence recorded on `owner` while the segment was idle: it covers every use of the
    /// segment's memory. Cleared when a block is taken from it.
    pub idle_fence: Option<Arc<F>>,
    /// Page bytes of a growable segment (a reserved address range mapped page by page, see
    /// `pages`); `None` for a segment allocated whole.
    pub pages: Option<usize>,
    /// Bytes in free blocks; `bytes` when idle.
    pub(super) free: usize,
    /// Bytes of unmapped blocks (growable segments only).
    pub(super) unmapped: usize,
    /// Bytes of changing blocks: while any, the segment's range stays reserved.
    pub(super) changing: usize,
    /// The mappings of a growable segment: offset -> bytes. They tile what is not unmapped, and
    /// go back only whole.
    pub(super) mappings: BTreeMap<usize, usize>,
    pub(super) first: BlockId,
}

impl<F> Segment<F> {
    /// All of it one free block: a segment allocated whole that may move or be released.
    fn is_idle(&self) -> bool {
        self.pages.is_none() && self.free == self.bytes
    }
}

// SAFETY: `base` is the address of device memory the cache owns; the bookkeeping never
// dereferences it, so another thread may hold and update a segment's record (under the core's
// lock). The fence is shared through `Arc`, hence Send + Sync.
unsafe impl<F: Send + Sync> Send for Segment<F> {}

/// A stream's free blocks, per pool, by (size, id): the first at or above a size is the best fit.
#[derive(Default)]
pub(super) struct StreamLists {
    pub(super) free: [BTreeSet<(usize, BlockId)>; POOLS],
    /// Unmapped blocks of the stream's growable segments, per pool, by (size, id).
    pub(super) unmapped: [BTreeSet<(usize, BlockId)>; POOLS],
    pub(super) segments: usize,
    /// Blocks freed on this stream whose fences are pending.
    pending: usize,
    /// Blocks of other streams' segments lent to this stream and out.
    lent: usize,
    /// Blocks returned to this stream's free lists so far.
    returns: u64,
}

/// Slots reused after removal, so ids stay small and stable while an entry lives.
pub(super) struct Slab<T> {
    slots: Vec<Option<T>>,
    vacant: Vec<u32>,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Self { slots: Vec::new(), vacant: Vec::new() }
    }

    pub(super) fn insert(&mut self, value: T) -> u32 {
        if let Some(id) = self.vacant.pop() {
            self.slots[id as usize] = Some(value);
            id
        } else {
            self.slots.push(Some(value));
            u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 blocks")
        }
    }

    pub(super) fn remove(&mut self, id: u32) -> T {
        let value = self.slots[id as usize].take().expect("a live slot");
        self.vacant.push(id);
        value
    }

    fn get(&self, id: u32) -> Option<&T> {
        self.slots.get(id as usize)?.as_ref()
    }

    pub(super) fn at(&self, id: u32) -> &T {
        self.get(id).expect("a live slot")
    }

    pub(super) fn at_mut(&mut self, id: u32) -> &mut T {
        self.slots[id as usize].as_mut().expect("a live slot")
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots.iter().enumerate().filter_map(|(id, slot)| Some((id as u32, slot.as_ref()?)))
    }
}

pub(super) struct Arena<F> {
    pub(super) blocks: Slab<Block>,
    pub(super) segments: Slab<Segment<F>>,
    pub(super) streams: FxHashMap<StreamKey, StreamLists>,
    /// Idle segments by pool and size, for adoption by other streams and for release.
    idle: BTreeSet<(Pool, usize, SegmentId)>,
}

impl<F> Arena<F> {
    pub fn new() -> Self {
        Self { blocks: Slab::new(), segments: Slab::new(), streams: FxHashMap::default(), idle: BTreeSet::new() }
    }

    pub fn block(&self, id: BlockId) -> &Block {
        self.blocks.at(id)
    }

    /// The block `id` if it is live and out at `ptr`: a check that a returned block is one
    /// this arena handed out.
    pub fn is_out_at(&self, id: BlockId, ptr: NonNull<u8>) -> bool {
        self.blocks.get(id).is_some_and(|b| b.state == BlockState::Out && self.ptr(id) == ptr)
    }

    pub fn segment(&self, id: SegmentId) -> &Segment<F> {
        self.segments.at(id)
    }

    pub fn segment_mut(&mut self, id: SegmentId) -> &mut Segment<F> {
        self.segments.at_mut(id)
    }

    /// The address `offset` bytes into segment `id`.
    pub fn at(&self, id: SegmentId, offset: usize) -> NonNull<u8> {
        let base = self.segments.at(id).base;
        // Wrapping: as in `ptr`.
        NonNull::new(base.as_ptr().wrapping_add(offset)).expect("a segment does not wrap around")
    }

    /// The address of block `id`.
    pub fn ptr(&self, id: BlockId) -> NonNull<u8> {
        let block = self.blocks.at(id);
        let base = self.segments.at(block.segment).base;
        // Wrapping: device addresses are not Rust allocations, so in-bounds arithmetic does not
        // apply; the offset lies within the segment, which does not wrap around.
        NonNull::new(base.as_ptr().wrapping_add(block.offset)).expect("a segment does not wrap around")
    }

    /// Adds a new segment owned by `owner`, as one free block.
    pub fn add_segment(&mut self, base: NonNull<u8>, bytes: usize, owner: StreamKey, pool: Pool) -> SegmentId {
        self.insert_segment(base, bytes, owner, pool, None)
    }

    /// Adds a segment of `bytes` at `base` for `owner`'s `pool` as one block: free memory, or,
    /// for a growable segment (`pages`), unmapped addresses.
    pub(super) fn insert_segment(
        &mut self,
        base: NonNull<u8>,
        bytes: usize,
        owner: StreamKey,
        pool: Pool,
        pages: Option<usize>,
    ) -> SegmentId {
        let (free, unmapped, state) =
            if pages.is_some() { (0, bytes, BlockState::Unmapped) } else { (bytes, 0, BlockState::Free) };
        let segment = self.segments.insert(Segment {
            base,
            bytes,
            owner,
            pool,
            idle_fence: None,
            pages,
            free,
            unmapped,
            changing: 0,
            mappings: BTreeMap::new(),
            first: BlockId::MAX,
        });
        let block =
            self.blocks.insert(Block { offset: 0, size: bytes, segment, state, freed: 0, prev: None, next: None });
        self.segments.at_mut(segment).first = block;
        let lists = self.streams.entry(owner).or_default();
        lists.segments += 1;
        if pages.is_some() {
            lists.unmapped[pool as usize].insert((bytes, block));
        } else {
            lists.free[pool as usize].insert((bytes, block));
            self.idle.insert((pool, bytes, segment));
            // Returned to `owner` now: only a fence recorded on it from here on follows the
            // segment's earlier uses (a segment that changed shard was waited for by `owner`).
            lists.returns += 1;
            self.blocks.at_mut(block).freed = lists.returns;
        }
        segment
    }

    /// The best-fitting free block of `stream` in `pool`, cut to `bytes` (a multiple of 512) and
    /// marked out.
    pub fn take(&mut self, stream: StreamKey, pool: Pool, bytes: usize) -> Option<BlockId> {
        self.take_fitting(stream, pool, bytes, Fit::Best, |_, _| true)
    }

    /// The free block of `stream` in `pool` that `fit` chooses, cut to `bytes` and marked out,
    /// if `fits(its size, whether its segment is growable)`. With [`Fit::Best`] every other free
    /// block is larger still.
    pub fn take_fitting(
        &mut self,
        stream: StreamKey,
        pool: Pool,
        bytes: usize,
        fit: Fit,
        fits: impl Fn(usize, bool) -> bool,
    ) -> Option<BlockId> {
        let (size, id) = match fit {
            Fit::Best => self.best_fit(stream, pool, bytes)?,
            Fit::Lowest => self.lowest_fit(stream, pool, bytes)?,
        };
        fits(size, self.is_growable(id)).then(|| self.cut(id, bytes))
    }

    /// The smallest free block of `stream` in `pool` with at least `bytes`: (size, id).
    pub fn best_fit(&self, stream: StreamKey, pool: Pool, bytes: usize) -> Option<(usize, BlockId)> {
        self.streams.get(&stream)?.free[pool as usize].range((bytes, 0)..).next().copied()
    }

    /// The free block of `stream` in `pool` with at least `bytes` at the lowest address: (size,
    /// id). Looks at every free block large enough.
    pub fn lowest_fit(&self, stream: StreamKey, pool: Pool, bytes: usize) -> Option<(usize, BlockId)> {
        let fitting = self.streams.get(&stream)?.free[pool as usize].range((bytes, 0)..);
        fitting.min_by_key(|&&(_, id)| self.ptr(id).as_ptr().addr()).copied()
    }

    /// Whether block `id` lies in a growable segment.
    pub fn is_growable(&self, id: BlockId) -> bool {
        self.segments.at(self.blocks.at(id).segment).pages.is_some()
    }

    /// Free block `id`, cut to its first `bytes` (a multiple of 512, at most its size) and
    /// marked out; the rest stays free in its owner's list.
    pub fn cut(&mut self, id: BlockId, bytes: usize) -> BlockId {
        let (size, segment_id) = (self.blocks.at(id).size, self.blocks.at(id).segment);
        debug_assert!(self.blocks.at(id).state == BlockState::Free && bytes <= size);
        let segment = self.segments.at_mut(segment_id);
        let (owner, pool) = (segment.owner, segment.pool);
        if segment.is_idle() {
            self.idle.remove(&(segment.pool, segment.bytes, segment_id));
            segment.idle_fence = None;
        }
        segment.free -= bytes;
        let lists = self.streams.get_mut(&owner).expect("a segment's owner has lists");
        lists.free[pool as usize].remove(&(size, id));
        if size > bytes {
            let block = self.blocks.at(id);
            let (next, freed) = (block.next, block.freed);
            let rest = self.blocks.insert(Block {
                offset: block.offset + bytes,
                size: size - bytes,
                segment: segment_id,
                state: BlockState::Free,
                freed,
                prev: Some(id),
                next,
            });
            if let Some(next) = next {
                self.blocks.at_mut(next).prev = Some(rest);
            }
            self.blocks.at_mut(id).next = Some(rest);
            lists.free[pool as usize].insert((size - bytes, rest));
        }
        let block = self.blocks.at_mut(id);
        block.size = bytes;
        block.state = BlockState::Out;
        id
    }

    /// The best fit of every stream but `borrower` in `pool` with at least `bytes`, smallest
    /// first: (size, id, owner).
    pub fn lendable(&self, borrower: StreamKey, pool: Pool, bytes: usize) -> Vec<(usize, BlockId, StreamKey)> {
        let mut found: Vec<_> = self
            .streams
            .iter()
            .filter(|&(&owner, _)| owner != borrower)
            .filter_map(|(&owner, lists)| {
                let &(size, id) = lists.free[pool as usize].range((bytes, 0)..).next()?;
                Some((size, id, owner))
            })
            .collect();
        found.sort_unstable();
        found
    }

    /// Notes that out block `id` (cut by [`Arena::cut`]) is lent to `borrower`, which this
    /// arena then knows until [`Arena::end_lend`].
    pub fn lend(&mut self, id: BlockId, borrower: StreamKey) {
        debug_assert_eq!(self.blocks.at(id).state, BlockState::Out);
        self.streams.entry(borrower).or_default().lent += 1;
    }

    /// A block lent to `borrower` is no longer out to it (it is pending its fence).
    pub fn end_lend(&mut self, borrower: StreamKey) {
        let lists = self.streams.get_mut(&borrower).expect("a borrower has lists");
        lists.lent -= 1;
    }

    /// Blocks returned to `stream`'s free lists so far: a fence recorded on it now covers every
    /// free block with [`Block::freed`] up to this.
    pub fn returns(&self, stream: StreamKey) -> u64 {
        self.streams.get(&stream).map_or(0, |lists| lists.returns)
    }

    /// Marks an out block as freed on `stream`, waiting for a fence there.
    pub fn set_pending(&mut self, id: BlockId, stream: StreamKey) {
        let block = self.blocks.at_mut(id);
        debug_assert_eq!(block.state, BlockState::Out);
        block.state = BlockState::Pending;
        self.streams.entry(stream).or_default().pending += 1;
    }

    /// A pending block whose fence on `stream` completed becomes free.
    pub fn end_pending(&mut self, id: BlockId, stream: StreamKey) {
        debug_assert_eq!(self.blocks.at(id).state, BlockState::Pending);
        if let Some(lists) = self.streams.get_mut(&stream) {
            lists.pending -= 1;
        }
        self.give_back(id);
    }

    /// Returns an out (or pending) block to its owner's free list, merged with free neighbours.
    /// Returns its size.
    pub fn give_back(&mut self, id: BlockId) -> usize {
        let block = self.blocks.at_mut(id);
        debug_assert_ne!(block.state, BlockState::Free);
        block.state = BlockState::Free;
        let (size, segment_id) = (block.size, block.segment);
        let segment = self.segments.at_mut(segment_id);
        segment.free += size;
        let (owner, pool) = (segment.owner, segment.pool);
        let lists = self.streams.get_mut(&owner).expect("a segment's owner has lists");
        lists.returns += 1;
        let freed = lists.returns;
        let list = &mut lists.free[pool as usize];

        let mut merged = id;
        if let Some(prev) = self.blocks.at(id).prev.filter(|&p| self.blocks.at(p).state == BlockState::Free) {
            list.remove(&(self.blocks.at(prev).size, prev));
            absorb_next(&mut self.blocks, prev);
            merged = prev;
        }
        if let Some(next) = self.blocks.at(merged).next.filter(|&n| self.blocks.at(n).state == BlockState::Free) {
            list.remove(&(self.blocks.at(next).size, next));
            absorb_next(&mut self.blocks, merged);
        }
        list.insert((self.blocks.at(merged).size, merged));
        self.blocks.at_mut(merged).freed = freed;
        let segment = self.segments.at(segment_id);
        if segment.is_idle() {
            self.idle.insert((pool, segment.bytes, segment_id));
        }
        size
    }

    /// Idle segments of `pool` with at least `bytes`, smallest first.
    pub fn idle_at_least(&self, pool: Pool, bytes: usize) -> impl Iterator<Item = SegmentId> + '_ {
        self.idle.range((pool, bytes, 0)..=(pool, usize::MAX, SegmentId::MAX)).map(|&(_, _, id)| id)
    }

    /// Every idle segment.
    pub fn idle_segments(&self) -> Vec<SegmentId> {
        self.idle.iter().map(|&(_, _, id)| id).collect()
    }

    /// Hands idle segment `id` to stream `to`. Returns the previous owner.
    pub fn adopt(&mut self, id: SegmentId, to: StreamKey) -> StreamKey {
        let segment = self.segments.at_mut(id);
        debug_assert_eq!(segment.free, segment.bytes, "only idle segments move");
        let (from, pool, block, bytes) = (segment.owner, segment.pool, segment.first, segment.bytes);
        segment.owner = to;
        segment.idle_fence = None;
        let old = self.streams.get_mut(&from).expect("a segment's owner has lists");
        old.free[pool as usize].remove(&(bytes, block));
        old.segments -= 1;
        let new = self.streams.entry(to).or_default();
        new.free[pool as usize].insert((bytes, block));
        new.segments += 1;
        // The block's count of returns was its old owner's: stamped as returned to `to` now, so
        // that only a fence recorded on `to` after it waited for the old owner (or after the old
        // owner's work completed) lends it on. An older fence of `to` follows none of the old
        // owner's work.
        new.returns += 1;
        self.blocks.at_mut(block).freed = new.returns;
        from
    }

    /// Removes idle segment `id`; returns it for release.
    pub fn remove_idle(&mut self, id: SegmentId) -> Segment<F> {
        let segment = self.segments.remove(id);
        debug_assert_eq!(segment.free, segment.bytes, "only idle segments are released");
        self.idle.remove(&(segment.pool, segment.bytes, id));
        self.blocks.remove(segment.first);
        let lists = self.streams.get_mut(&segment.owner).expect("a segment's owner has lists");
        lists.free[segment.pool as usize].remove(&(segment.bytes, segment.first));
        lists.segments -= 1;
        segment
    }

    /// Drops `stream`'s record when nothing of it is left; true if it did.
    pub fn drop_if_unused(&mut self, stream: StreamKey) -> bool {
        let unused = self.streams.get(&stream).is_some_and(|l| l.segments == 0 && l.pending == 0 && l.lent == 0);
        if unused {
            self.streams.remove(&stream);
        }
        unused
    }

    /// The streams with a record, in order (tests and fuzzing).
    #[cfg(any(test, feature = "fake"))]
    pub fn streams(&self) -> Vec<StreamKey> {
        let mut keys: Vec<_> = self.streams.keys().copied().collect();
        keys.sort();
        keys
    }

    /// Blocks lent to `stream` and out, as this arena counts them (tests and fuzzing).
    #[cfg(any(test, feature = "fake"))]
    pub fn lent_to(&self, stream: StreamKey) -> usize {
        self.streams.get(&stream).map_or(0, |lists| lists.lent)
    }

    /// Every segment's owner (tests and fuzzing).
    #[cfg(any(test, feature = "fake"))]
    pub fn segment_owners(&self) -> impl Iterator<Item = StreamKey> + '_ {
        self.segments.iter().map(|(_, s)| s.owner)
    }

    /// Every segment's address and size, in no particular order.
    pub fn segment_ranges(&self) -> Vec<(usize, usize)> {
        self.segments.iter().map(|(_, s)| (s.base.as_ptr() as usize, s.bytes)).collect()
    }

    /// Bytes of idle segments (all of it one free block).
    pub fn idle_bytes(&self) -> usize {
        self.idle.iter().map(|&(_, bytes, _)| bytes).sum()
    }

    /// Bytes in free blocks, and how many of them fill whole pages of `page` bytes (segments
    /// start on a page).
    #[cfg(test)]
    pub fn free_in_pages(&self, page: usize) -> (usize, usize) {
        let (mut free, mut whole) = (0, 0);
        for (_, block) in self.blocks.iter().filter(|(_, b)| b.state == BlockState::Free) {
            free += block.size;
            let (first, end) = (block.offset.div_ceil(page) * page, (block.offset + block.size) / page * page);
            whole += end.saturating_sub(first);
        }
        (free, whole)
    }

    /// (segments, bytes in free blocks, largest free block).
    pub fn free_figures(&self) -> (usize, usize, usize) {
        let (mut total, mut largest) = (0, 0);
        for lists in self.streams.values() {
            for list in &lists.free {
                total += list.iter().map(|&(size, _)| size).sum::<usize>();
                largest = largest.max(list.last().map_or(0, |&(size, _)| size));
            }
        }
        (self.segments.iter().count(), total, largest)
    }

    /// Panics if the bookkeeping is inconsistent: blocks tile their segments, no two free
    /// neighbours, free lists hold exactly the free blocks of their owner, idle means all free.
    #[cfg(any(test, feature = "fake"))]
    pub fn check(&self) {
        let (mut listed, mut unmapped_listed, mut unmapped_blocks) = (0, 0, 0);
        for (stream, lists) in &self.streams {
            for (pool, list) in lists.free.iter().enumerate() {
                for &(size, id) in list {
                    let block = self.blocks.at(id);
                    let segment = self.segments.at(block.segment);
                    assert_eq!((block.size, block.state), (size, BlockState::Free));
                    assert_eq!((segment.owner, segment.pool as usize), (*stream, pool));
                    listed += 1;
                }
            }
            for (pool, list) in lists.unmapped.iter().enumerate() {
                for &(size, id) in list {
                    let block = self.blocks.at(id);
                    let segment = self.segments.at(block.segment);
                    assert_eq!((block.size, block.state), (size, BlockState::Unmapped));
                    assert_eq!((segment.owner, segment.pool as usize), (*stream, pool));
                    unmapped_listed += 1;
                }
            }
            let owned = self.segments.iter().filter(|(_, s)| s.owner == *stream).count();
            assert_eq!(lists.segments, owned, "segment count of {stream:?}");
        }
        let mut free_blocks = 0;
        for (id, segment) in self.segments.iter() {
            let (mut offset, mut free, mut unmapped, mut changing) = (0, 0, 0, 0);
            let mut cursor = Some(segment.first);
            let mut prev: Option<(BlockId, BlockState)> = None;
            while let Some(b) = cursor {
                let block = self.blocks.at(b);
                assert_eq!((block.segment, block.offset, block.prev), (id, offset, prev.map(|p| p.0)));
                assert!(block.size > 0 && block.size.is_multiple_of(super::size_class::MIN_BLOCK));
                if block.state == BlockState::Free {
                    assert_ne!(prev.map(|p| p.1), Some(BlockState::Free), "two free neighbours");
                    free += block.size;
                    free_blocks += 1;
                }
                if block.state == BlockState::Unmapped {
                    let page = segment.pages.expect("unmapped blocks only in growable segments");
                    assert!(block.offset.is_multiple_of(page) && block.size.is_multiple_of(page), "whole pages");
                    assert_ne!(prev.map(|p| p.1), Some(BlockState::Unmapped), "two unmapped neighbours");
                    unmapped += block.size;
                    unmapped_blocks += 1;
                }
                if block.state == BlockState::Changing {
                    let page = segment.pages.expect("changing blocks only in growable segments");
                    assert!(block.offset.is_multiple_of(page) && block.size.is_multiple_of(page), "whole pages");
                    changing += block.size;
                }
                offset += block.size;
                prev = Some((b, block.state));
                cursor = block.next;
            }
            assert_eq!(
                (offset, free, unmapped, changing),
                (segment.bytes, segment.free, segment.unmapped, segment.changing)
            );
            if let Some(page) = segment.pages {
                let mut end = 0;
                for (&at, &bytes) in &segment.mappings {
                    assert!(at >= end && bytes > 0 && at.is_multiple_of(page) && bytes.is_multiple_of(page));
                    let holder = self.block_at(id, at);
                    let state = self.blocks.at(holder).state;
                    assert!(
                        !matches!(state, BlockState::Unmapped | BlockState::Changing),
                        "a mapping in a {state:?} block"
                    );
                    end = at + bytes;
                }
                let mapped: usize = segment.mappings.values().sum();
                assert_eq!(mapped, segment.bytes - segment.unmapped - segment.changing, "mappings tile what is mapped");
            }
            let idle = self.idle.contains(&(segment.pool, segment.bytes, id));
            assert_eq!(idle, segment.is_idle());
            assert!(segment.idle_fence.is_none() || idle, "a fence on a segment in use");
        }
        assert_eq!(listed, free_blocks, "free blocks missing from the lists");
        assert_eq!(unmapped_listed, unmapped_blocks, "unmapped blocks missing from the lists");
        assert_eq!(self.idle.len(), self.segments.iter().filter(|(_, s)| s.is_idle()).count());
        let blocks = self.blocks.iter().count();
        let tiled: usize = self
            .segments
            .iter()
            .map(|(_, s)| std::iter::successors(Some(s.first), |&b| self.blocks.at(b).next).count())
            .sum();
        assert_eq!(blocks, tiled, "blocks outside any segment");
    }
}

impl<F> Arena<F> {
    /// The block of segment `id` that holds offset `at` (tests and fuzzing).
    #[cfg(any(test, feature = "fake"))]
    fn block_at(&self, id: SegmentId, at: usize) -> BlockId {
        let mut cursor = self.segments.at(id).first;
        loop {
            let block = self.blocks.at(cursor);
            if at < block.offset + block.size {
                return cursor;
            }
            cursor = block.next.expect("an offset inside the segment");
        }
    }
}

/// Merges block `id`'s next neighbour into it.
pub(super) fn absorb_next(blocks: &mut Slab<Block>, id: BlockId) {
    let next_id = blocks.at(id).next.expect("a next block");
    let next = blocks.remove(next_id);
    let block = blocks.at_mut(id);
    block.size += next.size;
    block.next = next.next;
    if let Some(after) = next.next {
        blocks.at_mut(after).prev = Some(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: StreamKey = StreamKey(1);
    const T: StreamKey = StreamKey(2);

    fn arena_with_segment(bytes: usize) -> (Arena<()>, SegmentId) {
        let mut arena = Arena::new();
        let base = NonNull::new(std::ptr::without_provenance_mut::<u8>(1 << 20)).unwrap();
        let segment = arena.add_segment(base, bytes, S, Pool::Small);
        (arena, segment)
    }

    #[test]
    fn blocks_split_from_the_front_and_coalesce_in_any_order() {
        let (mut arena, segment) = arena_with_segment(8192);
        let a = arena.take(S, Pool::Small, 1024).unwrap();
        let b = arena.take(S, Pool::Small, 2048).unwrap();
        let c = arena.take(S, Pool::Small, 1024).unwrap();
        arena.check();
        assert_eq!([a, b, c].map(|id| arena.block(id).offset), [0, 1024, 3072]);
        assert_eq!(arena.ptr(b).addr().get(), (1 << 20) + 1024);
        assert_eq!(arena.free_figures(), (1, 4096, 4096));
        assert!(arena.idle_segments().is_empty());
        arena.give_back(b); // between two out blocks: alone
        arena.check();
        assert_eq!(arena.free_figures(), (1, 6144, 4096));
        arena.give_back(c); // merges with b and the tail
        arena.check();
        assert_eq!(arena.free_figures(), (1, 7168, 7168));
        arena.give_back(a); // merges with everything
        arena.check();
        assert_eq!(arena.free_figures(), (1, 8192, 8192));
        assert_eq!(arena.idle_segments(), [segment]);
    }

    #[test]
    fn best_fit_prefers_the_smallest_hole() {
        let (mut arena, _) = arena_with_segment(16384);
        let blocks: Vec<_> = [1024, 512, 2048, 512, 1536].map(|b| arena.take(S, Pool::Small, b).unwrap()).into();
        arena.give_back(blocks[0]); // hole of 1024 at 0
        arena.give_back(blocks[2]); // hole of 2048 at 1536
        let fit = arena.take(S, Pool::Small, 1024).unwrap();
        assert_eq!(arena.block(fit).offset, 0);
        let fit2 = arena.take(S, Pool::Small, 1536).unwrap();
        assert_eq!(arena.block(fit2).offset, 1536);
        arena.check();
        assert!(arena.take(T, Pool::Small, 512).is_none(), "another stream's blocks");
        assert!(arena.take(S, Pool::Large, 512).is_none(), "another pool's blocks");
    }

    #[test]
    fn idle_segments_move_between_streams_and_are_removed_whole() {
        let (mut arena, segment) = arena_with_segment(4096);
        let a = arena.take(S, Pool::Small, 4096).unwrap();
        assert_eq!(arena.idle_at_least(Pool::Small, 512).count(), 0);
        arena.set_pending(a, T);
        assert!(!arena.drop_if_unused(T), "a pending block keeps its stream known");
        arena.end_pending(a, T);
        assert_eq!(arena.idle_at_least(Pool::Small, 4096).collect::<Vec<_>>(), [segment]);
        assert_eq!(arena.idle_at_least(Pool::Small, 4097).count(), 0);
        assert_eq!(arena.adopt(segment, T), S);
        arena.check();
        assert!(arena.drop_if_unused(S));
        assert!(arena.take(S, Pool::Small, 512).is_none());
        let b = arena.take(T, Pool::Small, 512).unwrap();
        arena.give_back(b);
        let removed = arena.remove_idle(segment);
        assert_eq!((removed.bytes, removed.owner), (4096, T));
        arena.check();
        assert!(arena.drop_if_unused(T));
        assert_eq!(arena.free_figures(), (0, 0, 0));
    }
}
