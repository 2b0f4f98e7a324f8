//! Growable segments in the arena: a range of addresses reserved whole and backed page by page
//! (see [`Pages`](super::backend::Pages)). Its blocks tile it like any segment's; the runs with no
//! memory behind them are `Unmapped` blocks, whole pages, in their stream's unmapped lists. A
//! miss maps pages at the start of an unmapped run (extending the free block before it, so the
//! stream's blocks stay contiguous and coalesce), and trimming unmaps whole mappings inside a
//! free block. Both claim their pages first (a changing block, in no list), so that the driver
//! call runs without the shard's lock, and finish after it. Pure bookkeeping, like the rest of
//! the arena: the core and the allocator make the backend calls.

use super::arena::{Arena, Block, BlockId, BlockState, Segment, SegmentId, StreamLists, absorb_next};
use super::backend::StreamKey;
use super::config::Pool;
use std::ptr::NonNull;

/// A run of whole pages of a growable segment to map or unmap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    pub segment: SegmentId,
    /// The unmapped block the run starts (mapping) or the free block it lies in (unmapping).
    pub block: BlockId,
    pub offset: usize,
    pub bytes: usize,
}

impl<F> Arena<F> {
    /// Adds a growable segment of `bytes` reserved addresses at `base` (both multiples of `page`)
    /// for `owner`'s `pool`, nothing mapped.
    pub fn add_growable(
        &mut self,
        base: NonNull<u8>,
        bytes: usize,
        page: usize,
        owner: StreamKey,
        pool: Pool,
    ) -> SegmentId {
        debug_assert!(bytes.is_multiple_of(page) && base.as_ptr().addr().is_multiple_of(page));
        self.insert_segment(base, bytes, owner, pool, Some(page))
    }

    /// The fewest pages whose mapping lets `stream`'s `pool` serve `bytes` from its growable
    /// segments: at the start of an unmapped run, counting the free block before it (ties: the
    /// lowest address, so the stream's memory stays packed). `None` when no run is large enough.
    pub fn run_to_map(&self, stream: StreamKey, pool: Pool, bytes: usize) -> Option<Run> {
        let lists = self.streams.get(&stream)?;
        lists.unmapped[pool as usize]
            .iter()
            .filter_map(|&(size, id)| {
                let block = self.blocks.at(id);
                let page = self.segments.at(block.segment).pages.expect("unmapped blocks are in growable segments");
                let before = block.prev.map(|p| self.blocks.at(p)).filter(|p| p.state == BlockState::Free);
                let needed = bytes.saturating_sub(before.map_or(0, |p| p.size)).next_multiple_of(page);
                let start = self.segments.at(block.segment).base.as_ptr().addr() + block.offset;
                (needed <= size).then_some((
                    needed,
                    start,
                    Run { segment: block.segment, block: id, offset: block.offset, bytes: needed },
                ))
            })
            .min_by_key(|&(needed, start, _)| (needed, start))
            .map(|(_, _, run)| run)
    }

    /// The free block just before block `id`, if there is one.
    pub fn free_before(&self, id: BlockId) -> Option<BlockId> {
        self.blocks.at(id).prev.filter(|&p| self.blocks.at(p).state == BlockState::Free)
    }

    /// The bytes of the unmapped block a run starts: what a map there may take.
    pub fn room(&self, run: Run) -> usize {
        self.blocks.at(run.block).size
    }

    /// Takes the first `claim` bytes (whole pages, at least `run.bytes`, at most [`Arena::room`])
    /// of the unmapped block that `run` (from [`Arena::run_to_map`]) starts out of every list,
    /// for a map made without the shard's lock: no other call maps, unmaps or frees them until
    /// [`Arena::finish_map`] or [`Arena::abandon_map`]. The rest stays unmapped.
    pub fn claim_unmapped(&mut self, run: Run, claim: usize) {
        let block = self.blocks.at(run.block);
        debug_assert_eq!((block.state, block.offset), (BlockState::Unmapped, run.offset));
        debug_assert!(claim >= run.bytes && claim <= block.size);
        let (size, pool) = (block.size, self.segments.at(run.segment).pool);
        self.lists_of(run.segment).unmapped[pool as usize].remove(&(size, run.block));
        if claim < size {
            let rest = self.split(run.block, claim);
            self.lists_of(run.segment).unmapped[pool as usize].insert((size - claim, rest));
        }
        self.blocks.at_mut(run.block).state = BlockState::Changing;
        let segment = self.segments.at_mut(run.segment);
        segment.unmapped -= claim;
        segment.changing += claim;
    }

    /// Ends a claim of [`Arena::claim_unmapped`] whose first bytes are now mapped as `mappings`
    /// (adding up to at most the claim): they become a free block, merged with its free
    /// neighbours; the rest of the claim is unmapped again.
    pub fn finish_map(&mut self, run: Run, mappings: &[usize]) {
        let bytes: usize = mappings.iter().sum();
        let block = self.blocks.at(run.block);
        debug_assert_eq!(block.state, BlockState::Changing);
        debug_assert!(bytes > 0 && bytes <= block.size);
        let claim = block.size;
        let segment = self.segments.at_mut(run.segment);
        segment.changing -= claim;
        let mut at = run.offset;
        for &size in mappings {
            segment.mappings.insert(at, size);
            at += size;
        }
        if bytes < claim {
            let rest = self.split(run.block, bytes);
            self.settle_unmapped(rest);
        }
        self.blocks.at_mut(run.block).state = BlockState::Out;
        self.give_back(run.block);
    }

    /// Ends a claim of [`Arena::claim_unmapped`] whose map failed: all of it unmapped again.
    pub fn abandon_map(&mut self, run: Run) {
        let block = self.blocks.at(run.block);
        debug_assert_eq!(block.state, BlockState::Changing);
        self.segments.at_mut(run.segment).changing -= block.size;
        self.settle_unmapped(run.block);
    }

    /// The whole mappings inside free block `id` of a growable segment, if it holds any: one run,
    /// as mappings tile what is mapped.
    pub fn interior(&self, id: BlockId) -> Option<Run> {
        let block = self.blocks.at(id);
        let segment = self.segments.at(block.segment);
        segment.pages?;
        let end = block.offset + block.size;
        let mut inside = segment.mappings.range(block.offset..end).take_while(|&(&at, &bytes)| at + bytes <= end);
        let (&start, &first) = inside.next()?;
        let last = inside.last().map_or(start + first, |(&at, &bytes)| at + bytes);
        (block.state == BlockState::Free).then(|| Run {
            segment: block.segment,
            block: id,
            offset: start,
            bytes: last - start,
        })
    }

    /// The last whole mappings of `run` (an [`Arena::interior`]) that add up to at least `bytes`,
    /// or all of it.
    pub fn tail_of(&self, run: Run, bytes: usize) -> Run {
        let end = run.offset + run.bytes;
        let mappings = &self.segments.at(run.segment).mappings;
        let mut start = end;
        for (&at, _) in mappings.range(run.offset..end).rev() {
            start = at;
            if end - start >= bytes {
                break;
            }
        }
        Run { offset: start, bytes: end - start, ..run }
    }

    /// Takes `run` (an [`Arena::interior`], or a [`Arena::tail_of`] one) out of its free block,
    /// for an unmap made without the shard's lock: the free block keeps what lies before and
    /// after it, and no other call hands out, maps or frees the run until
    /// [`Arena::finish_unmap`]. Its mappings leave the segment's record now. Returns the run's
    /// block.
    pub fn claim_mapped(&mut self, run: Run) -> BlockId {
        let block = self.blocks.at(run.block);
        debug_assert_eq!(block.state, BlockState::Free);
        let (offset, size, pool) = (block.offset, block.size, self.segments.at(run.segment).pool);
        let lists = self.lists_of(run.segment);
        lists.free[pool as usize].remove(&(size, run.block));
        let mut hole = run.block;
        if run.offset > offset {
            hole = self.split(run.block, run.offset - offset);
            let lists = self.lists_of(run.segment);
            lists.free[pool as usize].insert((run.offset - offset, run.block));
        }
        if run.offset + run.bytes < offset + size {
            let after = self.split(hole, run.bytes);
            let lists = self.lists_of(run.segment);
            lists.free[pool as usize].insert((offset + size - run.offset - run.bytes, after));
        }
        self.blocks.at_mut(hole).state = BlockState::Changing;
        let segment = self.segments.at_mut(run.segment);
        let gone: Vec<usize> = segment.mappings.range(run.offset..run.offset + run.bytes).map(|(&at, _)| at).collect();
        for at in gone {
            segment.mappings.remove(&at);
        }
        segment.free -= run.bytes;
        segment.changing += run.bytes;
        hole
    }

    /// Ends a claim of [`Arena::claim_mapped`] (block `id`), now unmapped: it merges with its
    /// unmapped neighbours.
    pub fn finish_unmap(&mut self, id: BlockId) {
        let block = self.blocks.at(id);
        debug_assert_eq!(block.state, BlockState::Changing);
        self.segments.at_mut(block.segment).changing -= block.size;
        self.settle_unmapped(id);
    }

    /// Makes block `id` (changing, in no list, not counted in its segment's figures) unmapped,
    /// merged with its unmapped neighbours, and lists it.
    fn settle_unmapped(&mut self, id: BlockId) {
        let (segment_id, size) = (self.blocks.at(id).segment, self.blocks.at(id).size);
        self.blocks.at_mut(id).state = BlockState::Unmapped;
        let segment = self.segments.at_mut(segment_id);
        segment.unmapped += size;
        let pool = segment.pool;
        let unmapped =
            |arena: &Self, id: Option<BlockId>| id.filter(|&b| arena.blocks.at(b).state == BlockState::Unmapped);
        let mut merged = id;
        if let Some(prev) = unmapped(self, self.blocks.at(id).prev) {
            let prev_size = self.blocks.at(prev).size;
            self.lists_of(segment_id).unmapped[pool as usize].remove(&(prev_size, prev));
            absorb_next(&mut self.blocks, prev);
            merged = prev;
        }
        if let Some(next) = unmapped(self, self.blocks.at(merged).next) {
            let next_size = self.blocks.at(next).size;
            self.lists_of(segment_id).unmapped[pool as usize].remove(&(next_size, next));
            absorb_next(&mut self.blocks, merged);
        }
        let merged_size = self.blocks.at(merged).size;
        self.lists_of(segment_id).unmapped[pool as usize].insert((merged_size, merged));
    }

    /// The whole pages inside free blocks of growable segments, every stream's, largest first.
    pub fn trimmable(&self) -> Vec<Run> {
        let mut runs: Vec<Run> = self
            .streams
            .values()
            .flat_map(|lists| lists.free.iter())
            .flat_map(|list| list.iter().map(|&(_, id)| id))
            .filter_map(|id| self.interior(id))
            .collect();
        runs.sort_unstable_by_key(|run| std::cmp::Reverse(run.bytes));
        runs
    }

    /// Bytes of the whole mappings inside free blocks of growable segments, every stream's:
    /// what trims could give back now (the rest of the free bytes share a mapping with a block
    /// that is not free).
    pub fn trimmable_bytes(&self) -> usize {
        self.trimmable().iter().map(|run| run.bytes).sum()
    }

    /// Growable segments with nothing mapped: they can be given back whole.
    pub fn unmapped_segments(&self) -> Vec<SegmentId> {
        self.segments.iter().filter(|(_, s)| s.pages.is_some() && s.unmapped == s.bytes).map(|(id, _)| id).collect()
    }

    /// Removes growable segment `id`, which has nothing mapped; returns it for the range's release.
    pub fn remove_unmapped(&mut self, id: SegmentId) -> Segment<F> {
        let segment = self.segments.remove(id);
        debug_assert_eq!(segment.unmapped, segment.bytes, "only unmapped ranges are freed");
        self.blocks.remove(segment.first);
        let lists = self.streams.get_mut(&segment.owner).expect("a segment's owner has lists");
        lists.unmapped[segment.pool as usize].remove(&(segment.bytes, segment.first));
        lists.segments -= 1;
        segment
    }

    /// Cuts block `id` after its first `at` bytes; the second part, in the same state and not in
    /// any list, is returned.
    fn split(&mut self, id: BlockId, at: usize) -> BlockId {
        let block = self.blocks.at(id);
        debug_assert!(at > 0 && at < block.size);
        let (next, rest) = (
            block.next,
            Block {
                offset: block.offset + at,
                size: block.size - at,
                segment: block.segment,
                state: block.state,
                freed: block.freed,
                prev: Some(id),
                next: block.next,
            },
        );
        let rest = self.blocks.insert(rest);
        if let Some(next) = next {
            self.blocks.at_mut(next).prev = Some(rest);
        }
        let block = self.blocks.at_mut(id);
        block.size = at;
        block.next = Some(rest);
        rest
    }

    fn lists_of(&mut self, segment: SegmentId) -> &mut StreamLists {
        let owner = self.segments.at(segment).owner;
        self.streams.get_mut(&owner).expect("a segment's owner has lists")
    }
}
