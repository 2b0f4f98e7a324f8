//! Per-thread front caches of the pinned pool: each thread keeps up to [`FRONT_DEPTH`] freed
//! blocks per size class of every pool without a cap that it uses, so that an allocation after a
//! free of its class on the same thread takes no lock another thread takes on its hot path, and
//! touches only that thread's counters. How threads find, flush and retire their caches is
//! [`crate::thread_cache`]'s.
//!
//! Only blocks without fences park here, so a front hit hands its block out with no check; a
//! block whose recorded work may still be running goes to the shared lists, which check it.
//!
//! **Leases.** A buffer keeps the pool's state alive with a strong reference (a lease, see
//! [`super::cache::Lease`]). Cloning and dropping one are atomic read-modify-writes on a counter
//! every thread of the pool shares, as costly as the rest of a hit pair together, so a freed
//! buffer's lease is kept here beside its block ([`LEASE_STOCK`] at most) and the next hit on
//! this thread hands it out again. The pool empties every thread's stock when its last handle
//! drops, since stocked leases would otherwise keep it alive.

use super::size_class::SizeClass;
use crate::thread_cache::{Entries, FrontCache, SpinLock};
use std::any::Any;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::Arc;

/// Blocks a thread keeps per size class; a free beyond it goes to the shared lists. The blocks
/// would be cached anyway, and a miss returns every thread's parked blocks to the shared lists
/// before it allocates, so the depth costs no memory.
pub(super) const FRONT_DEPTH: usize = 8;

/// Leases a thread keeps per pool: as many as it can have blocks parked.
pub(super) const LEASE_STOCK: usize = 4 * FRONT_DEPTH;

/// A lease, its pool's type erased (the thread-local caches serve pools of every backend).
pub(super) type AnyLease = Arc<dyn Any + Send + Sync>;

/// A block in a front cache: free, with no work pending on it, held by no user.
#[derive(Debug)]
pub(super) struct Parked {
    pub ptr: NonNull<u8>,
    pub class: SizeClass,
}

// SAFETY: the address of pinned memory the pool owns, never dereferenced by the cache; the thread
// that receives it may hand the block out, cache it or release it.
unsafe impl Send for Parked {}

/// Counts kept by one thread (or by the pool, for calls no front cache counted): allocations
/// served by the cache and by the system, and the bytes handed out net of those taken back
/// (negative in a thread that returns other threads' blocks), with the highest net reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub hits: u64,
    pub misses: u64,
    pub in_use: isize,
    pub peak_in_use: isize,
}

impl Counts {
    #[inline]
    pub fn hand_out(&mut self, bytes: usize, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        self.in_use += bytes as isize;
        self.peak_in_use = self.peak_in_use.max(self.in_use);
    }

    #[inline]
    pub fn take_back(&mut self, bytes: usize) {
        self.in_use -= bytes as isize;
    }

    /// Adds another thread's counts; the sum of peaks bounds the peak of the sum.
    pub fn absorb(&mut self, other: Counts) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.in_use += other.in_use;
        self.peak_in_use += other.peak_in_use;
    }
}

#[derive(Default)]
struct Front {
    /// Parked blocks by class index, newest last.
    bins: Vec<Vec<Parked>>,
    parked_bytes: usize,
    counts: Counts,
    /// Leases of the pool freed on this thread, for its next hits.
    leases: Vec<AnyLease>,
    /// The pool has closed: nothing parks or stocks here any more.
    closed: bool,
}

impl Front {
    fn drain(&mut self, out: &mut Vec<Parked>) {
        out.extend(self.bins.iter_mut().flat_map(|bin| bin.drain(..)));
        self.parked_bytes = 0;
    }
}

/// One thread's front cache of one pool, with that thread's counts.
pub(super) struct ThreadCache {
    front: SpinLock<Front>,
}

impl ThreadCache {
    pub fn new() -> Self {
        Self { front: SpinLock::new(Front::default()) }
    }

    /// The newest parked block of `class`, counted as a hit, with a stocked lease if there is
    /// one.
    #[inline]
    pub fn take(&self, class: SizeClass) -> Option<(NonNull<u8>, Option<AnyLease>)> {
        let mut front = self.front.lock();
        let front = &mut *front;
        let parked = front.bins.get_mut(class.index)?.pop()?;
        front.parked_bytes -= class.bytes;
        front.counts.hand_out(class.bytes, true);
        Some((parked.ptr, front.leases.pop()))
    }

    /// Counts a block's return and parks it, with its buffer's `lease` in the stock, if its class
    /// has room and the pool is open; otherwise hands the block back, for the shared lists, with
    /// the lease (a lease parks only with its block: whoever gets the block back still needs the
    /// pool). A lease that finds the stock full is handed back alone. Handed-back leases are
    /// dropped by the caller once it holds no lock: one may be the pool's last reference.
    #[inline]
    pub fn put(&self, parked: Parked, lease: AnyLease) -> (Option<Parked>, Option<AnyLease>) {
        let mut front = self.front.lock();
        let front = &mut *front;
        let (index, bytes) = (parked.class.index, parked.class.bytes);
        front.counts.take_back(bytes);
        if front.closed {
            return (Some(parked), Some(lease));
        }
        if front.bins.len() <= index {
            front.bins.resize_with(index + 1, Vec::new);
        }
        let bin = &mut front.bins[index];
        if bin.len() >= FRONT_DEPTH {
            return (Some(parked), Some(lease));
        }
        bin.push(parked);
        front.parked_bytes += bytes;
        if front.leases.len() >= LEASE_STOCK {
            return (None, Some(lease));
        }
        front.leases.push(lease);
        (None, None)
    }

    /// Marks the pool closed here and empties the stock of leases, for the caller to drop once
    /// it holds no lock. Also what a thread's exit does with its stock.
    pub fn close(&self) -> Vec<AnyLease> {
        let mut front = self.front.lock();
        front.closed = true;
        std::mem::take(&mut front.leases)
    }

    /// Applies `f` to this thread's counts (for calls served by the shared lists or the system).
    pub fn count(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.front.lock().counts);
    }

    /// Adds this thread's counts to `counts`; returns the bytes parked here.
    pub fn read(&self, counts: &mut Counts) -> usize {
        let front = self.front.lock();
        counts.absorb(front.counts);
        front.parked_bytes
    }
}

impl FrontCache for ThreadCache {
    type Parked = Parked;
    type Totals = Counts;

    fn drain(&self, out: &mut Vec<Parked>) {
        self.front.lock().drain(out);
    }

    /// Also moves the counts to `retired`.
    fn retire(&self, out: &mut Vec<Parked>, retired: &mut Counts) {
        let mut front = self.front.lock();
        front.drain(out);
        retired.absorb(std::mem::take(&mut front.counts));
    }
}

thread_local! {
    /// This thread's front caches, one per pool it used.
    pub(super) static ENTRIES: Entries<ThreadCache> = const { RefCell::new(Vec::new()) };
}
