//! Per-thread front caches: each thread keeps a few freed blocks per (stream, class) for each
//! allocator it uses, so that an allocation after a free of the same class on the same stream
//! takes no lock shared with other threads. How threads find, flush and retire their caches is
//! [`crate::thread_cache`]'s; other threads take a cache's lock only to flush the cache
//! (`empty_cache`, growth, allocator drop) or read its counters.

use super::arena::BlockId;
use super::backend::StreamKey;
use super::stats::{ClassCounts, ThreadCounters};
use crate::thread_cache::{Entries, FrontCache, SpinLock};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::ptr::NonNull;

/// A block parked in a front cache: out of the core, held by no user.
#[derive(Debug)]
pub(super) struct Parked {
    pub ptr: NonNull<u8>,
    pub id: BlockId,
    /// The block's stream: its segment's owner, unless lent.
    pub stream: StreamKey,
    /// For a block lent by another stream, the shard of the lender (see [`Parked::shard`]).
    pub lent: Option<u8>,
}

impl Parked {
    /// The core's shard that holds the block's segment: its stream's, or its lender's.
    #[inline]
    pub fn shard(&self) -> usize {
        self.lent.map_or_else(|| super::allocator::shard_of(self.stream), usize::from)
    }
}

// SAFETY: the address of device memory the cache owns, never dereferenced by the cache; the thread
// that receives it may hand the block out or return it to the core.
unsafe impl Send for Parked {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct BinKey {
    pub stream: StreamKey,
    pub class: u16,
}

/// Blocks freed on one stream in one class, newest last; capacity fixed when created.
struct Bin {
    parked: Vec<Parked>,
    counts: ClassCounts,
}

/// How much a front cache may hold.
#[derive(Debug, Clone, Copy)]
pub(super) struct FrontLimits {
    pub depth: usize,
    pub max_bytes: usize,
    /// Larger blocks go back to the core, but for the last one freed when `large_slot`.
    pub max_block: usize,
    pub large_slot: bool,
}

#[derive(Default)]
struct Front {
    bins: FxHashMap<BinKey, Bin>,
    parked_bytes: usize,
    /// The one parked block above [`FrontLimits::max_block`] (its bin, bytes), kept out of the
    /// bins and returned to the core on this thread's next miss.
    large: Option<(BinKey, usize, Parked)>,
    counters: ThreadCounters,
    /// Counts of bins removed by flushes.
    classes: FxHashMap<u16, ClassCounts>,
}

impl Front {
    fn take_large(&mut self, key: BinKey, bytes: usize, requested: usize) -> Option<Parked> {
        if self.large.as_ref().is_none_or(|(parked_key, _, _)| *parked_key != key) {
            return None;
        }
        let (_, _, parked) = self.large.take()?;
        let bin = self.bins.get_mut(&key).expect("a parked block's bin counts its free");
        bin.counts.allocations += 1;
        bin.counts.front_hits += 1;
        self.parked_bytes -= bytes;
        self.counters.alloc(bytes, requested);
        Some(parked)
    }

    fn bin(&mut self, key: BinKey, depth: usize) -> &mut Bin {
        self.bins
            .entry(key)
            .or_insert_with(|| Bin { parked: Vec::with_capacity(depth), counts: ClassCounts::default() })
    }

    /// Moves every parked block to `out` and forgets the bins (their counts kept per class), so
    /// bins of streams no longer used do not accumulate.
    fn drain(&mut self, out: &mut Vec<Parked>) {
        for (key, bin) in self.bins.drain() {
            out.extend(bin.parked);
            self.classes.entry(key.class).or_default().absorb(bin.counts);
        }
        out.extend(self.large.take().map(|(_, _, parked)| parked));
        self.parked_bytes = 0;
    }
}

/// One thread's front cache for one allocator, with that thread's counters.
pub(super) struct ThreadCache {
    front: SpinLock<Front>,
}

/// What a thread's caches add up to, for statistics.
#[derive(Default)]
pub(super) struct ThreadTotals {
    pub counters: ThreadCounters,
    pub parked_bytes: usize,
    pub front_hits: u64,
    pub classes: FxHashMap<u16, ClassCounts>,
}

impl ThreadTotals {
    pub(super) fn absorb_classes(&mut self, classes: &FxHashMap<u16, ClassCounts>) {
        for (&class, &counts) in classes {
            self.front_hits += counts.front_hits;
            self.classes.entry(class).or_default().absorb(counts);
        }
    }
}

impl ThreadCache {
    pub fn new() -> Self {
        Self { front: SpinLock::new(Front::default()) }
    }

    /// A parked block of `key` for a request of `requested` bytes (`bytes` being the class's).
    #[inline]
    pub fn take(&self, key: BinKey, bytes: usize, requested: usize, limits: FrontLimits) -> Option<Parked> {
        let mut front = self.front.lock();
        let front = &mut *front;
        if bytes > limits.max_block {
            return front.take_large(key, bytes, requested);
        }
        let bin = front.bins.get_mut(&key)?;
        let parked = bin.parked.pop()?;
        bin.counts.allocations += 1;
        bin.counts.front_hits += 1;
        front.parked_bytes -= bytes;
        front.counters.alloc(bytes, requested);
        Some(parked)
    }

    /// Counts a free and parks the block if the limits allow; otherwise hands it back for the core.
    #[inline]
    pub fn put(
        &self,
        key: BinKey,
        parked: Parked,
        bytes: usize,
        requested: usize,
        limits: FrontLimits,
    ) -> Option<Parked> {
        let mut front = self.front.lock();
        let front = &mut *front;
        front.counters.free(bytes, requested);
        let fits = front.parked_bytes + bytes <= limits.max_bytes;
        let bin = front.bin(key, limits.depth);
        bin.counts.frees += 1;
        if bytes > limits.max_block {
            if !(fits && limits.large_slot && front.large.is_none()) {
                return Some(parked);
            }
            front.large = Some((key, bytes, parked));
            front.parked_bytes += bytes;
            None
        } else if fits && bin.parked.len() < limits.depth {
            bin.parked.push(parked);
            front.parked_bytes += bytes;
            None
        } else {
            Some(parked)
        }
    }

    /// The parked large block, for the core (this thread missed: merged with its neighbours
    /// there it may serve the miss, and it parks for one miss at most).
    pub fn take_large_for_core(&self) -> Option<Parked> {
        let mut front = self.front.lock();
        let (_, bytes, parked) = front.large.take()?;
        front.parked_bytes -= bytes;
        Some(parked)
    }

    /// Counts an allocation the core served.
    pub fn note_alloc(&self, key: BinKey, bytes: usize, requested: usize, limits: FrontLimits) {
        let mut front = self.front.lock();
        front.counters.alloc(bytes, requested);
        front.bin(key, limits.depth).counts.allocations += 1;
    }

    /// Counts a free that bypasses the front cache (a free on a foreign stream).
    pub fn note_free(&self, key: BinKey, bytes: usize, requested: usize, limits: FrontLimits) {
        let mut front = self.front.lock();
        front.counters.free(bytes, requested);
        front.bin(key, limits.depth).counts.frees += 1;
    }

    /// Restarts this thread's peaks from its current figures.
    pub fn reset_peaks(&self) {
        self.front.lock().counters.reset_peaks();
    }

    /// Adds this cache's figures to `totals`.
    pub fn read(&self, totals: &mut ThreadTotals) {
        let front = self.front.lock();
        totals.counters.absorb(front.counters);
        totals.parked_bytes += front.parked_bytes;
        totals.absorb_classes(&front.classes);
        for (key, bin) in &front.bins {
            totals.front_hits += bin.counts.front_hits;
            totals.classes.entry(key.class).or_default().absorb(bin.counts);
        }
    }
}

impl FrontCache for ThreadCache {
    type Parked = Parked;
    type Totals = ThreadTotals;

    fn drain(&self, out: &mut Vec<Parked>) {
        self.front.lock().drain(out);
    }

    /// Also adds the counters to `totals`.
    fn retire(&self, out: &mut Vec<Parked>, totals: &mut ThreadTotals) {
        let mut front = self.front.lock();
        front.drain(out);
        totals.counters.absorb(front.counters);
        front.counters = ThreadCounters::default();
        for (class, counts) in front.classes.drain() {
            totals.classes.entry(class).or_default().absorb(counts);
        }
    }
}

thread_local! {
    /// This thread's front caches, one per allocator it used.
    pub(super) static ENTRIES: Entries<ThreadCache> = const { RefCell::new(Vec::new()) };
}
