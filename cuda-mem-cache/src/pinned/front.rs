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
//! this thread hands it out again. Every lease of a pool is the same reference, so the stock is a
//! count of references it owns ([`Stock`]), not a list. The pool empties every thread's stock
//! when its last handle drops, since stocked leases would otherwise keep it alive.

use super::size_class::PinnedClass;
use crate::thread_cache::{Entries, FrontCache, SpinLock};
use std::cell::RefCell;
use std::ptr::NonNull;

/// Blocks a thread keeps per size class; a free beyond it goes to the shared lists. The blocks
/// would be cached anyway, and a miss returns every thread's parked blocks to the shared lists
/// before it allocates, so the depth costs no memory.
pub(super) const FRONT_DEPTH: usize = 8;

/// Leases a thread keeps per pool: as many as it can have blocks parked.
pub(super) const LEASE_STOCK: usize = 4 * FRONT_DEPTH;

/// Strong references to one pool's state, owned by a front cache's stock or on their way out of
/// it: dropping a `Stock` drops them. The pool's type is erased (the thread-local caches serve
/// pools of every backend), so it carries the function that drops one.
pub(super) struct Stock {
    /// From `Arc::as_ptr` of the pool's state.
    state: *const (),
    /// Drops one strong reference to `state` (`Arc::decrement_strong_count` of its type).
    release: unsafe fn(*const ()),
    count: usize,
}

// SAFETY: strong references to a pool's state, which is `Send + Sync`; the thread that receives
// them may drop them.
unsafe impl Send for Stock {}

impl Stock {
    /// An empty stock of the state at `state`, whose references `release` drops.
    ///
    /// # Safety
    /// `state` came from `Arc::as_ptr` of an `Arc<S>`, and `release` is
    /// `Arc::<S>::decrement_strong_count` for that `S`.
    pub unsafe fn new(state: *const (), release: unsafe fn(*const ())) -> Self {
        Self { state, release, count: 0 }
    }

    /// Moves every reference out, into a stock of its own (to be dropped with no lock held).
    fn take_all(&mut self) -> Stock {
        Stock { count: std::mem::take(&mut self.count), ..*self }
    }
}

impl Drop for Stock {
    fn drop(&mut self) {
        for _ in 0..self.count {
            // SAFETY: the stock owns `count` strong references to `state` (see `new`); each is
            // dropped once. The state outlives all but the last of them.
            unsafe { (self.release)(self.state) };
        }
    }
}

/// What [`ThreadCache::put`] did with a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Put {
    /// Parked; the buffer's lease is now the stock's (the caller forgets its own), if `stocked`.
    Parked { stocked: bool },
    /// Not parked (its class is full here, or the pool closed): for the shared lists.
    Refused,
}

/// A block in a front cache: free, with no work pending on it, held by no user.
#[derive(Debug)]
pub(super) struct Parked {
    pub ptr: NonNull<u8>,
    pub class: PinnedClass,
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

struct Front {
    /// Parked blocks by class index, newest last.
    bins: Vec<Vec<Parked>>,
    parked_bytes: usize,
    counts: Counts,
    /// Leases of the pool freed on this thread, for its next hits.
    leases: Stock,
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
    /// A cache whose stock holds references to the state at `leases`.
    pub fn new(leases: Stock) -> Self {
        let front = Front { bins: Vec::new(), parked_bytes: 0, counts: Counts::default(), leases, closed: false };
        Self { front: SpinLock::new(front) }
    }

    /// The newest parked block of `class`, counted as a hit, and, if `leased` and the stock has
    /// one, a stocked lease, now the caller's (true).
    #[inline(always)]
    pub fn take(&self, class: PinnedClass, leased: bool) -> Option<(NonNull<u8>, bool)> {
        let mut front = self.front.lock();
        let front = &mut *front;
        let parked = front.bins.get_mut(class.index())?.pop()?;
        front.parked_bytes -= class.bytes();
        front.counts.hand_out(class.bytes(), true);
        let stocked = leased && front.leases.count > 0;
        front.leases.count -= usize::from(stocked);
        Some((parked.ptr, stocked))
    }

    /// Counts a block's return and parks it, if its class has room and the pool is open, with
    /// its buffer's lease in the stock if `leased` and the stock has room (a lease stocks only
    /// with its block: whoever gets a refused block back still needs the pool). A lease the
    /// stock takes is the stock's once this returns; a lease it does not take is the caller's to
    /// drop once it holds no lock (one may be the pool's last reference).
    #[inline(always)]
    pub fn put(&self, parked: Parked, leased: bool) -> Put {
        let mut front = self.front.lock();
        let front = &mut *front;
        let (index, bytes) = (parked.class.index(), parked.class.bytes());
        front.counts.take_back(bytes);
        if front.closed {
            return Put::Refused;
        }
        if index >= front.bins.len() {
            grow_bins(front, index + 1);
        }
        let bin = &mut front.bins[index];
        if bin.len() >= FRONT_DEPTH {
            return Put::Refused;
        }
        bin.push(parked);
        front.parked_bytes += bytes;
        let stocked = leased && front.leases.count < LEASE_STOCK;
        front.leases.count += usize::from(stocked);
        Put::Parked { stocked }
    }

    /// Marks the pool closed here and empties the stock of leases, for the caller to drop once
    /// it holds no lock. Also what a thread's exit does with its stock.
    pub fn close(&self) -> Stock {
        let mut front = self.front.lock();
        front.closed = true;
        front.leases.take_all()
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

/// Room for bins up to `len` classes: the first put of a class this thread has not put before.
#[cold]
fn grow_bins(front: &mut Front, len: usize) {
    front.bins.resize_with(len, Vec::new);
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
