//! `TrackingResource`: every outstanding allocation, with an optional backtrace, and a leak report.

use super::outstanding::{Entry, OutstandingTable};
use super::threads::{registered_thread, this_thread};
use super::{MemoryResource, StreamRef};
use crate::error::{CudaError, ErrorKind, Result};
use rustc_hash::FxHashMap;
use std::any::Any;
use std::backtrace::Backtrace;
use std::fmt::{self, Write as _};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// When (since the resource was created) and where an allocation was made.
type Origin = (Duration, Arc<Backtrace>);

/// What watches a [`TrackingResource`]'s events beside its table, installed with
/// [`TrackingResource::observed_by`]: the memory snapshots of the `cuda-mem-snapshot` crate
/// (PyTorch's format) are one, and reach the resource through this trait only. `Any` lets an
/// observer find itself again ([`TrackingResource::observer`]).
///
/// The resource calls it on the allocating or freeing thread, with no lock of its own held, so an
/// observer may call the resource back. A panic in `allocated` leaks that allocation (the
/// resource has not recorded it yet), one in `freed` the freed memory (the inner resource has not
/// freed it yet): neither hands memory out twice.
pub trait TrackingObserver: Any + Send + Sync + fmt::Debug {
    /// An allocation of `bytes` at `address` on the stream whose raw handle is `stream`, with its
    /// backtrace where backtraces are captured.
    fn allocated(&self, address: usize, bytes: usize, stream: usize, backtrace: Option<&Backtrace>);
    /// The free of the allocation at `address`, before the inner resource frees it.
    fn freed(&self, address: usize, bytes: usize, stream: usize);
    /// A refusal for lack of memory with `device_free` bytes free; `outstanding` lists what is
    /// live (as [`TrackingResource::outstanding`]).
    fn out_of_memory(
        &self,
        bytes: usize,
        stream: usize,
        device_free: usize,
        outstanding: &dyn Fn() -> Vec<AllocationRecord>,
    );
}

/// One outstanding allocation.
#[derive(Debug, Clone)]
pub struct AllocationRecord {
    /// Address.
    pub ptr: usize,
    /// Size in bytes.
    pub bytes: usize,
    /// Order of allocation (0 for the first one through this resource).
    pub sequence: u64,
    /// The allocating thread; [`AllocationRecord::thread_name`] gives its name.
    pub thread: ThreadId,
    /// When it was allocated, since the resource was created (recorded with backtraces).
    pub at: Option<Duration>,
    /// Where it was allocated, when backtraces are enabled.
    pub backtrace: Option<Arc<Backtrace>>,
    thread_name: Option<String>,
}

impl AllocationRecord {
    /// The allocating thread's name, if it had one.
    pub fn thread_name(&self) -> Option<String> {
        self.thread_name.clone()
    }
}

/// Slots of [`TrackingResource::new`]'s table: allocations beyond it still get tracked, through
/// a slower locked map.
pub const DEFAULT_TRACKING_SLOTS: usize = 8192;

/// The largest table [`TrackingResource::with_slots`] accepts (32 bytes a slot: 512 MiB).
pub const MAX_TRACKING_SLOTS: usize = 1 << 24;

/// Records every allocation until it is freed: address, size, order and thread. The table takes
/// no lock on the allocation and free paths (one compare-and-swap and one counter increment per
/// allocation, one store per free), so tracking stays within a few percent of a pool
/// allocation. Backtraces (and timestamps) cost microseconds per allocation, so they are opt-in.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::resource::{DeviceResource, ResourceBuffer, TrackingResource};
/// use cuda_mem::{Device, Stream};
/// use std::sync::Arc;
/// let tracked = Arc::new(TrackingResource::new(DeviceResource::new(Device::current()?), true));
/// let stream = Stream::new()?;
/// let kept = ResourceBuffer::<u8>::zeroed(tracked.clone(), &stream, 4096)?;
/// std::mem::forget(kept); // a leak
/// eprintln!("{}", tracked.leak_report()); // one allocation of 4096 bytes, with its backtrace
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TrackingResource<R> {
    inner: R,
    table: OutstandingTable,
    next_sequence: AtomicU64,
    /// Time and backtrace of each outstanding allocation, when enabled.
    origins: Option<Mutex<FxHashMap<usize, Origin>>>,
    unknown_frees: AtomicU64,
    created: Instant,
    /// What watches the events beside the table ([`TrackingResource::observed_by`]).
    observer: Option<Box<dyn TrackingObserver>>,
}

impl<R: MemoryResource> TrackingResource<R> {
    /// Wraps `inner`; with `capture_backtraces`, each allocation records where it came from.
    pub fn new(inner: R, capture_backtraces: bool) -> Self {
        Self::build(inner, capture_backtraces, DEFAULT_TRACKING_SLOTS)
    }

    /// As [`TrackingResource::new`], with a lock-free table of `slots` entries (rounded up to a
    /// power of two; 32 bytes each). Size it to the live allocations you expect; more than
    /// [`MAX_TRACKING_SLOTS`] is refused with [`ErrorKind::InvalidArgument`].
    pub fn with_slots(inner: R, capture_backtraces: bool, slots: usize) -> Result<Self> {
        if slots > MAX_TRACKING_SLOTS {
            let kind = ErrorKind::InvalidArgument("more tracking slots than MAX_TRACKING_SLOTS");
            return Err(CudaError::new(
                kind,
                format!("TrackingResource::with_slots({slots}): at most {MAX_TRACKING_SLOTS} slots"),
            ));
        }
        Ok(Self::build(inner, capture_backtraces, slots))
    }

    fn build(inner: R, capture_backtraces: bool, slots: usize) -> Self {
        Self {
            inner,
            table: OutstandingTable::new(slots),
            next_sequence: AtomicU64::new(0),
            origins: capture_backtraces.then(Mutex::default),
            unknown_frees: AtomicU64::new(0),
            created: Instant::now(),
            observer: None,
        }
    }

    /// The resource with `observer` told of every allocation, free and refusal for lack of memory
    /// from now on, in place of any observer before it. A builder step, before the resource is
    /// shared.
    pub fn observed_by(mut self, observer: Box<dyn TrackingObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The observer, if one was installed; downcast it (`as &dyn Any`) to reach its own type.
    pub fn observer(&self) -> Option<&dyn TrackingObserver> {
        self.observer.as_deref()
    }

    /// Takes the observer out (the resource then has none), for a builder that changes it.
    pub fn take_observer(&mut self) -> Option<Box<dyn TrackingObserver>> {
        self.observer.take()
    }

    /// Outstanding allocations, oldest first.
    pub fn outstanding(&self) -> Vec<AllocationRecord> {
        let mut entries = self.table.snapshot();
        entries.sort_by_key(|(_, entry)| entry.sequence);
        let origins = self.origins.as_ref().map(|o| o.lock().unwrap_or_else(PoisonError::into_inner));
        entries
            .into_iter()
            .map(|(ptr, Entry { bytes, sequence, thread })| {
                let (thread, thread_name) = registered_thread(thread);
                let origin = origins.as_ref().and_then(|o| o.get(&ptr));
                AllocationRecord {
                    ptr,
                    bytes,
                    sequence,
                    thread,
                    at: origin.map(|(at, _)| *at),
                    backtrace: origin.map(|(_, backtrace)| Arc::clone(backtrace)),
                    thread_name,
                }
            })
            .collect()
    }

    /// Bytes in outstanding allocations.
    pub fn outstanding_bytes(&self) -> usize {
        self.table.snapshot().iter().map(|(_, entry)| entry.bytes).sum()
    }

    /// Frees of addresses this resource did not hand out (a bug in the caller).
    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees.load(Ordering::Relaxed)
    }

    /// A readable report of outstanding allocations: "no leaks" when there are none.
    pub fn leak_report(&self) -> String {
        let records = self.outstanding();
        if records.is_empty() {
            return "no leaks: every allocation was freed".into();
        }
        let total: usize = records.iter().map(|r| r.bytes).sum();
        let mut report = format!("{} allocation(s) not freed, {total} bytes:\n", records.len());
        for r in &records {
            let thread = r.thread_name().unwrap_or_else(|| format!("{:?}", r.thread));
            let at = r.at.map(|at| format!(", {:.3} s after start", at.as_secs_f64())).unwrap_or_default();
            let _ = writeln!(report, "  #{} {} bytes at {:#x}, thread {thread}{at}", r.sequence, r.bytes, r.ptr);
            if let Some(backtrace) = &r.backtrace {
                let _ = writeln!(report, "{backtrace}");
            }
        }
        report
    }

    /// The wrapped resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

// SAFETY: see the contract on `MemoryResource`: forwards to `inner`, which upholds it.
unsafe impl<R: MemoryResource> MemoryResource for TrackingResource<R> {
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        let ptr = match self.inner.allocate(bytes, stream) {
            Ok(ptr) => ptr,
            Err(err) => return Err(self.refused(err, bytes, stream)),
        };
        let address = ptr.as_ptr() as usize;
        let backtrace = self.origins.as_ref().map(|origins| {
            let backtrace = Arc::new(Backtrace::force_capture());
            let origin = (self.created.elapsed(), Arc::clone(&backtrace));
            origins.lock().unwrap_or_else(PoisonError::into_inner).insert(address, origin);
            backtrace
        });
        if let Some(observer) = &self.observer {
            observer.allocated(address, bytes, stream.as_raw() as usize, backtrace.as_deref());
        }
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        let thread = this_thread();
        self.table.insert(address, Entry { bytes, sequence, thread });
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
        let address = ptr.as_ptr() as usize;
        // Forget the address before the inner free: once freed, the inner resource may hand it
        // out again to another thread, whose insert must not meet this entry.
        if !self.table.remove(address) {
            self.unknown_frees.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(origins) = &self.origins {
            origins.lock().unwrap_or_else(PoisonError::into_inner).remove(&address);
        }
        if let Some(observer) = &self.observer {
            observer.freed(address, bytes, stream.as_raw() as usize);
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.deallocate(ptr, bytes, stream) }
    }

    forward_metadata!();
}

impl<R: MemoryResource> TrackingResource<R> {
    /// Tells the observer of a refusal for lack of memory.
    #[cold]
    fn refused(&self, err: CudaError, bytes: usize, stream: StreamRef<'_>) -> CudaError {
        if let ErrorKind::OutOfMemory { report, .. } = err.kind()
            && let Some(observer) = &self.observer
        {
            observer.out_of_memory(bytes, stream.as_raw() as usize, report.free.unwrap_or(0), &|| self.outstanding());
        }
        err
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::HostResource;
    use super::*;

    #[test]
    fn table_sizes_beyond_the_limit_are_refused_with_a_typed_error() {
        for slots in [MAX_TRACKING_SLOTS + 1, 1 << 60, usize::MAX] {
            let err = TrackingResource::with_slots(HostResource::default(), false, slots).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{slots}: {err}");
        }
        assert!(TrackingResource::with_slots(HostResource::default(), false, 0).is_ok());
    }

    #[test]
    fn outstanding_allocations_and_leak_report_with_backtrace() {
        let r = TrackingResource::new(HostResource::default(), true);
        let s = StreamRef::LEGACY;
        let a = r.allocate(64, s).unwrap();
        let b = r.allocate(128, s).unwrap();
        assert_eq!(r.outstanding().len(), 2);
        assert_eq!(r.outstanding_bytes(), 192);
        // SAFETY: from this resource, freed once.
        unsafe { r.deallocate(a, 64, s) };
        let leaks = r.outstanding();
        assert_eq!(leaks.len(), 1);
        assert_eq!((leaks[0].bytes, leaks[0].sequence, leaks[0].ptr), (128, 1, b.as_ptr() as usize));
        let report = r.leak_report();
        assert!(report.starts_with("1 allocation(s) not freed, 128 bytes"), "{report}");
        assert!(
            report.contains("outstanding_allocations_and_leak_report_with_backtrace"),
            "backtrace names the test: {report}"
        );
        // SAFETY: as above.
        unsafe { r.deallocate(b, 128, s) };
        assert_eq!(r.leak_report(), "no leaks: every allocation was freed");
        assert_eq!(r.unknown_frees(), 0);
        // Debug shows a summary of the table, not its thousands of slots.
        let debug = format!("{r:?}");
        assert!(debug.contains("OutstandingTable { slots: 8192, outstanding: 0 }") && debug.len() < 600, "{debug}");
    }

    #[test]
    fn tracking_is_exact_across_threads() {
        // The default table, and one of 4 slots so most entries spill to the overflow map.
        for slots in [DEFAULT_TRACKING_SLOTS, 4] {
            tracking_is_exact_across_threads_with(slots);
        }
    }

    fn tracking_is_exact_across_threads_with(slots: usize) {
        const N: usize = if cfg!(miri) { 200 } else { 500 };
        let r = Arc::new(TrackingResource::with_slots(HostResource::default(), false, slots).unwrap());
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let r = Arc::clone(&r);
                std::thread::Builder::new()
                    .name(format!("worker-{t}"))
                    .spawn(move || {
                        let mut kept = Vec::new();
                        for i in 0..N {
                            let p = r.allocate(16 + i % 5, StreamRef::LEGACY).unwrap();
                            if i % 100 == 0 {
                                kept.push(p.as_ptr() as usize);
                            } else {
                                // SAFETY: allocated just above, freed once.
                                unsafe { r.deallocate(p, 16 + i % 5, StreamRef::LEGACY) };
                            }
                        }
                        kept
                    })
                    .unwrap()
            })
            .collect();
        let kept: Vec<usize> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let outstanding = r.outstanding();
        assert_eq!(outstanding.len(), 6 * N.div_ceil(100));
        assert!(
            outstanding
                .iter()
                .all(|rec| kept.contains(&rec.ptr) && rec.thread_name().is_some_and(|n| n.starts_with("worker-")))
        );
        assert!(outstanding.iter().all(|rec| rec.backtrace.is_none()));
        for rec in outstanding {
            // SAFETY: outstanding allocations of this resource, each freed once.
            unsafe { r.deallocate(NonNull::new(rec.ptr as *mut u8).unwrap(), rec.bytes, StreamRef::LEGACY) };
        }
        assert_eq!(r.outstanding_bytes(), 0);
    }

    /// An observer written by a user: told of each allocation, free and refusal, free to call the
    /// resource back (the resource holds none of its locks across the calls), found again by
    /// downcasting, and replaced by the next `observed_by`.
    #[derive(Debug, Default)]
    struct Counting {
        events: Mutex<Vec<(&'static str, usize)>>,
    }

    impl TrackingObserver for Counting {
        fn allocated(&self, _address: usize, bytes: usize, _stream: usize, _backtrace: Option<&Backtrace>) {
            self.events.lock().unwrap().push(("allocated", bytes));
        }
        fn freed(&self, _address: usize, bytes: usize, _stream: usize) {
            self.events.lock().unwrap().push(("freed", bytes));
        }
        fn out_of_memory(
            &self,
            bytes: usize,
            _stream: usize,
            _device_free: usize,
            outstanding: &dyn Fn() -> Vec<AllocationRecord>,
        ) {
            let live: usize = outstanding().iter().map(|r| r.bytes).sum();
            self.events.lock().unwrap().push(("out_of_memory", bytes + live));
        }
    }

    #[test]
    fn an_observer_of_the_users_sees_every_event_and_is_found_again() {
        use super::super::LimitingResource;
        let s = StreamRef::LEGACY;
        let mut r = TrackingResource::new(LimitingResource::new(HostResource::default(), 1000), false)
            .observed_by(Box::new(Counting::default()));
        let a = r.allocate(600, s).unwrap();
        assert!(r.allocate(700, s).unwrap_err().is_out_of_memory());
        // SAFETY: from this resource, freed once.
        unsafe { r.deallocate(a, 600, s) };
        let counting = (r.observer().unwrap() as &dyn Any).downcast_ref::<Counting>().unwrap();
        let events = counting.events.lock().unwrap().clone();
        assert_eq!(events, [("allocated", 600), ("out_of_memory", 1300), ("freed", 600)]);
        assert!(r.take_observer().is_some() && r.observer().is_none());
        let b = r.allocate(10, s).unwrap();
        // SAFETY: as above.
        unsafe { r.deallocate(b, 10, s) };
        assert_eq!(r.outstanding_bytes(), 0);
    }

    /// An observer that panics: at the allocation of 13 bytes (after noting the address), and at
    /// the free of 17.
    #[derive(Debug, Default)]
    struct Panicking {
        seen: Mutex<Option<usize>>,
    }

    impl TrackingObserver for Panicking {
        fn allocated(&self, address: usize, bytes: usize, _stream: usize, _backtrace: Option<&Backtrace>) {
            *self.seen.lock().unwrap() = Some(address);
            assert_ne!(bytes, 13, "the observer refuses 13 bytes");
        }
        fn freed(&self, _address: usize, bytes: usize, _stream: usize) {
            assert_ne!(bytes, 17, "the observer refuses to see 17 bytes go");
        }
        fn out_of_memory(&self, _: usize, _: usize, _: usize, _: &dyn Fn() -> Vec<AllocationRecord>) {}
    }

    /// A panic in the observer leaks what was being allocated or freed, as documented: the
    /// tracker never records the allocation it could not hand out, nor frees twice.
    #[test]
    fn a_panicking_observer_leaks_and_never_frees_twice() {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        let s = StreamRef::LEGACY;
        let r = TrackingResource::new(HostResource::default(), false).observed_by(Box::new(Panicking::default()));
        let live = || r.inner().live_bytes.load(Ordering::Relaxed);
        assert!(catch_unwind(AssertUnwindSafe(|| r.allocate(13, s))).is_err());
        let seen = (r.observer().unwrap() as &dyn Any).downcast_ref::<Panicking>().unwrap().seen.lock().unwrap().take();
        let lost = NonNull::new(seen.unwrap() as *mut u8).unwrap();
        assert_eq!((r.outstanding_bytes(), live()), (0, 13), "not recorded, not freed");
        // SAFETY: the inner resource's allocation the panic lost, freed once, here.
        unsafe { r.inner().deallocate(lost, 13, s) };
        let b = r.allocate(17, s).unwrap();
        // SAFETY: from this resource, freed once.
        assert!(catch_unwind(AssertUnwindSafe(|| unsafe { r.deallocate(b, 17, s) })).is_err());
        assert_eq!((r.outstanding_bytes(), live()), (0, 17), "forgotten by the tracker, not freed");
        // SAFETY: the inner allocation the panicking free left, freed once, here.
        unsafe { r.inner().deallocate(b, 17, s) };
        let c = r.allocate(64, s).unwrap();
        // SAFETY: from this resource, freed once.
        unsafe { r.deallocate(c, 64, s) };
        assert_eq!((r.outstanding_bytes(), live(), r.unknown_frees()), (0, 0, 0));
    }
}
