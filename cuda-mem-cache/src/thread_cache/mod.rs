//! Per-thread caches of shared allocators (the device caching allocator's front caches and the
//! pinned pool's), so that an allocation after a free of its size on the same thread takes no lock
//! shared with other threads.
//!
//! Each thread finds its cache of an allocator in a thread-local list keyed by the allocator's
//! id ([`with_cache`]); each kind of cache has its own list (a `thread_local!` of [`Entries`]).
//! The allocator keeps every thread's cache in its [`Registry`], behind its own lock, so that
//! other threads can flush the caches (trim, growth, drop) or read their counters; a cache's own
//! state sits behind a [`SpinLock`] that only its thread takes on the hot path. At thread exit the
//! list's destructor hands each cache to its allocator ([`ThreadExit`]), if the allocator still
//! lives: a dropped allocator has flushed every registered cache already.

mod spin;

pub(crate) use spin::SpinLock;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::LocalKey;

/// A new allocator id. Ids key the threads' caches and are never reused, so a dropped
/// allocator's entries cannot be mistaken for a new one's.
pub(crate) fn next_owner_id() -> u64 {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// What a thread's exit does with its cache `C` of an allocator (implemented by the allocator).
pub(crate) trait ThreadExit<C>: Send + Sync {
    fn thread_exit(&self, cache: &Arc<C>);
}

/// What the registry does with a thread's cache.
pub(crate) trait FrontCache {
    /// A free block kept in the cache.
    type Parked;
    /// Figures the allocator keeps of exited threads.
    type Totals;
    /// Moves every parked block to `out`.
    fn drain(&self, out: &mut Vec<Self::Parked>);
    /// Moves every parked block to `out` and the thread's figures to `totals`.
    fn retire(&self, out: &mut Vec<Self::Parked>, totals: &mut Self::Totals);
}

/// What registering a thread's cache gives the thread: the cache, shared with the allocator's
/// registry, and the allocator, not kept alive by the thread.
pub(crate) type Registered<C> = (Arc<C>, Weak<dyn ThreadExit<C>>);

/// This thread's cache of one allocator.
pub(crate) struct Entry<C: 'static> {
    owner_id: u64,
    cache: Arc<C>,
    owner: Weak<dyn ThreadExit<C>>,
}

impl<C: 'static> Drop for Entry<C> {
    fn drop(&mut self) {
        // Only at thread exit is the owner still alive here (dead entries are the only ones
        // pruned); a dropped owner has flushed the cache itself.
        if let Some(owner) = self.owner.upgrade() {
            owner.thread_exit(&self.cache);
        }
    }
}

/// One thread's caches of one kind, one per allocator it used.
pub(crate) type Entries<C> = RefCell<Vec<Entry<C>>>;

/// The caches of every thread of an allocator, and the figures `T` of threads that exited.
pub(crate) struct Registry<C, T> {
    pub caches: Vec<Arc<C>>,
    pub retired: T,
}

impl<C, T: Default> Default for Registry<C, T> {
    fn default() -> Self {
        Self { caches: Vec::new(), retired: T::default() }
    }
}

impl<C: FrontCache> Registry<C, C::Totals> {
    /// Every thread's parked blocks. The caller returns them to the shared state before it
    /// unlocks the registry, so a flush sees every block a finished thread parked (its exit is
    /// either done, blocks returned, or not begun, cache in the registry).
    pub fn drain_all(&self) -> Vec<C::Parked> {
        let mut parked = Vec::new();
        for cache in &self.caches {
            cache.drain(&mut parked);
        }
        parked
    }

    /// Forgets an exiting thread's cache: keeps its figures and returns its parked blocks (to be
    /// returned under the registry's lock, as in [`Registry::drain_all`]).
    pub fn retire(&mut self, cache: &Arc<C>) -> Vec<C::Parked> {
        self.caches.retain(|c| !Arc::ptr_eq(c, cache));
        let mut parked = Vec::new();
        cache.retire(&mut parked, &mut self.retired);
        parked
    }
}

/// A new cache for the calling thread, added to `owner`'s `registry`.
pub(crate) fn register<C: 'static, T, O: ThreadExit<C> + 'static>(
    owner: &Arc<O>,
    registry: &Mutex<Registry<C, T>>,
    cache: C,
) -> Registered<C> {
    let cache = Arc::new(cache);
    // A poisoned registry is still consistent: its updates are single Vec operations.
    registry.lock().unwrap_or_else(PoisonError::into_inner).caches.push(Arc::clone(&cache));
    let owner: Weak<O> = Arc::downgrade(owner);
    (cache, owner)
}

/// Runs `f` on this thread's cache of allocator `owner_id`, registering one made by `register` on
/// first use. `None` when this thread's storage is being torn down (thread exit) or is in use
/// further up the stack; the caller then goes to the shared state directly.
#[inline]
pub(crate) fn with_cache<C: 'static, R>(
    entries: &'static LocalKey<Entries<C>>,
    owner_id: u64,
    register: impl FnOnce() -> Registered<C>,
    f: impl FnOnce(&C) -> R,
) -> Option<R> {
    // `f` runs after the lookup, not inside `try_with`'s closure: that closure then captures two
    // words, which the compiler passes without copying a larger closure through memory.
    let cache = entries.try_with(|entries| find_or_register(entries, owner_id, register)).ok().flatten()?;
    // SAFETY: the cache is the heap allocation of an `Arc` that this thread's entry of
    // `owner_id` holds. An entry goes only when this thread exits (its thread-locals are torn
    // down after this call returns, not during it) or when `register_here` prunes entries of
    // dropped allocators, and the caller's allocator is alive; so the cache outlives `f`.
    Some(f(unsafe { &*cache }))
}

/// This thread's cache of allocator `owner_id` (see [`with_cache`]).
#[inline]
fn find_or_register<C: 'static>(
    entries: &Entries<C>,
    owner_id: u64,
    register: impl FnOnce() -> Registered<C>,
) -> Option<*const C> {
    {
        let entries = entries.try_borrow().ok()?;
        if let Some(entry) = entries.iter().find(|e| e.owner_id == owner_id) {
            return Some(Arc::as_ptr(&entry.cache));
        }
    }
    register_here(entries, owner_id, register).map(|cache| Arc::as_ptr(&cache))
}

#[cold]
#[inline(never)]
fn register_here<C: 'static>(
    entries: &Entries<C>,
    owner_id: u64,
    register: impl FnOnce() -> Registered<C>,
) -> Option<Arc<C>> {
    let mut entries = entries.try_borrow_mut().ok()?;
    // Entries of dropped allocators: their caches were flushed when the allocator dropped.
    entries.retain(|e| e.owner.strong_count() > 0);
    let (cache, owner) = register();
    entries.push(Entry { owner_id, cache: Arc::clone(&cache), owner });
    Some(cache)
}

/// Runs `f` on this thread's cache of allocator `owner_id`, if it has one.
pub(crate) fn with_existing<C: 'static, R>(
    entries: &'static LocalKey<Entries<C>>,
    owner_id: u64,
    f: impl FnOnce(&C) -> R,
) -> Option<R> {
    entries
        .try_with(|entries| {
            let entries = entries.try_borrow().ok()?;
            entries.iter().find(|e| e.owner_id == owner_id).map(|e| f(&e.cache))
        })
        .ok()
        .flatten()
}
