//! `TrackingResource`: every outstanding allocation, with an optional backtrace, and a leak report.

use super::{MemoryResource, StreamRef};
use crate::error::Result;
use rustc_hash::FxHashMap;
use std::backtrace::Backtrace;
use std::fmt::Write as _;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::thread::ThreadId;
use std::time::Instant;

/// Names of threads that allocated through any tracking resource, for leak reports. Filled once
/// per thread (its first tracked allocation), so the allocation path only reads a thread-local.
static THREAD_NAMES: LazyLock<Mutex<rustc_hash::FxHashMap<ThreadId, String>>> = LazyLock::new(Default::default);

thread_local! {
    static THIS_THREAD: ThreadId = {
        let thread = std::thread::current();
        if let Some(name) = thread.name() {
            THREAD_NAMES.lock().unwrap_or_else(PoisonError::into_inner).insert(thread.id(), name.to_owned());
        }
        thread.id()
    };
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
    pub at: Option<std::time::Duration>,
    /// Where it was allocated, when backtraces are enabled.
    pub backtrace: Option<Arc<Backtrace>>,
}

impl AllocationRecord {
    /// The allocating thread's name, if it had one.
    pub fn thread_name(&self) -> Option<String> {
        THREAD_NAMES.lock().unwrap_or_else(PoisonError::into_inner).get(&self.thread).cloned()
    }
}

/// The table of outstanding allocations and the next sequence number, under one lock.
#[derive(Debug, Default)]
struct Table {
    records: FxHashMap<usize, AllocationRecord>,
    next_sequence: u64,
}

/// Records every allocation until it is freed: address, size, order and thread, under one
/// uncontended lock per allocation and per free. Backtraces (and timestamps) cost microseconds
/// per allocation, so they are opt-in.
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
    capture_backtraces: bool,
    table: Mutex<Table>,
    unknown_frees: AtomicU64,
    created: Instant,
}

impl<R: MemoryResource> TrackingResource<R> {
    /// Wraps `inner`; with `capture_backtraces`, each allocation records where it came from.
    pub fn new(inner: R, capture_backtraces: bool) -> Self {
        Self {
            inner,
            capture_backtraces,
            table: Mutex::new(Table::default()),
            unknown_frees: AtomicU64::new(0),
            created: Instant::now(),
        }
    }

    /// Outstanding allocations, oldest first.
    pub fn outstanding(&self) -> Vec<AllocationRecord> {
        let mut records: Vec<_> = self.table().records.values().cloned().collect();
        records.sort_by_key(|r| r.sequence);
        records
    }

    /// Bytes in outstanding allocations.
    pub fn outstanding_bytes(&self) -> usize {
        self.table().records.values().map(|r| r.bytes).sum()
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

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // The table stays consistent even if a thread panicked while holding the lock.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The wrapped resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

impl<R: MemoryResource> MemoryResource for TrackingResource<R> {
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        let ptr = self.inner.allocate(bytes, stream)?;
        // Thread id from a thread-local and the sequence under the table's lock: the plain path
        // costs the lock and one hash insert, no reference counts and no clock read.
        let thread = THIS_THREAD.with(|id| *id);
        let (at, backtrace) = if self.capture_backtraces {
            (Some(self.created.elapsed()), Some(Arc::new(Backtrace::force_capture())))
        } else {
            (None, None)
        };
        let mut table = self.table();
        let sequence = table.next_sequence;
        table.next_sequence += 1;
        let address = ptr.as_ptr() as usize;
        table.records.insert(address, AllocationRecord { ptr: address, bytes, sequence, thread, at, backtrace });
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
        if self.table().records.remove(&(ptr.as_ptr() as usize)).is_none() {
            self.unknown_frees.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.deallocate(ptr, bytes, stream) }
    }

    forward_metadata!();
}

#[cfg(test)]
mod tests {
    use super::super::testing::HostResource;
    use super::*;

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
    }

    #[test]
    fn tracking_is_exact_across_threads() {
        const N: usize = if cfg!(miri) { 200 } else { 500 };
        let r = Arc::new(TrackingResource::new(HostResource::default(), false));
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
}
