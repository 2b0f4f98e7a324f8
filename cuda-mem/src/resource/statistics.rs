//! `StatisticsResource`: current, peak and total bytes and counts of any resource.

use super::threads::this_thread;
use super::{MemoryResource, StreamRef};
use crate::error::Result;
use portable_atomic::AtomicU128;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Threads with a process-wide index below this keep the resource's totals in counters of their
/// own; later threads share one pair.
const OWN_TOTALS: usize = 64;

/// Bytes and count ever allocated, for one thread or shared; a cache line pair of its own so
/// that threads do not contend.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Totals {
    bytes: AtomicU64,
    count: AtomicU64,
}

/// One allocation in the packed counters: bytes in the low 64 bits, a count of 1 in the high.
fn packed(bytes: usize) -> u128 {
    (1u128 << 64) | bytes as u128
}

/// (bytes, count) of a packed counter.
fn unpacked(value: u128) -> (u64, u64) {
    (value as u64, (value >> 64) as u64)
}

/// Figures of a [`StatisticsResource`]: successful allocations only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceStats {
    /// Bytes allocated and not yet freed.
    pub current_bytes: usize,
    /// Highest `current_bytes`.
    pub peak_bytes: usize,
    /// Bytes ever allocated.
    pub total_bytes: u64,
    /// Live allocations.
    pub current_count: usize,
    /// Highest `current_count`.
    pub peak_count: usize,
    /// Allocations ever made.
    pub total_count: u64,
}

/// Counts what flows through the resource it wraps. Exact across threads:
/// - live bytes and count move together in one 128-bit atomic, so each allocation knows the
///   exact figures it produced and raises the peaks from them (peaks are only written when they
///   rise);
/// - totals are counted per thread: each of the first 64 allocating threads of the process owns
///   a counter pair that only it writes (a plain load and store, no read-modify-write), later
///   threads share one atomic pair; reading sums them.
///
/// That is one atomic read-modify-write per allocation and one per free, which keeps the adaptor
/// within a few percent of a pool allocation (the benchmark report has the ratios).
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::resource::{DeviceResource, ResourceBuffer, StatisticsResource};
/// use cuda_mem::{Device, Stream};
/// use std::sync::Arc;
/// let counted = Arc::new(StatisticsResource::new(DeviceResource::new(Device::current()?)));
/// let stream = Stream::new()?;
/// drop(ResourceBuffer::<u8>::zeroed(counted.clone(), &stream, 1000)?);
/// let stats = counted.stats();
/// assert_eq!((stats.current_bytes, stats.peak_bytes, stats.total_count), (0, 1000, 1));
/// # Ok(()) }
/// ```
pub struct StatisticsResource<R> {
    inner: R,
    /// Live bytes and count, packed.
    live: AtomicU128,
    /// Totals of the threads with an index below `OWN_TOTALS`, by index.
    own_totals: Box<[Totals]>,
    /// Totals of every later thread.
    shared_totals: Totals,
    peak_bytes: AtomicUsize,
    peak_count: AtomicUsize,
}

impl<R: std::fmt::Debug> std::fmt::Debug for StatisticsResource<R> {
    // The figures, not the 64 per-thread counter pairs behind them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatisticsResource").field("inner", &self.inner).field("stats", &self.stats()).finish()
    }
}

impl<R> StatisticsResource<R> {
    /// Wraps `inner` with zeroed counters.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            live: AtomicU128::new(0),
            own_totals: (0..OWN_TOTALS).map(|_| Totals::default()).collect(),
            shared_totals: Totals::default(),
            peak_bytes: AtomicUsize::new(0),
            peak_count: AtomicUsize::new(0),
        }
    }

    /// The counters now (exact when no allocation or free runs at the same time; the live
    /// figures are always one consistent pair).
    pub fn stats(&self) -> ResourceStats {
        let (live_bytes, live_count) = unpacked(self.live.load(Ordering::Relaxed));
        let (mut total_bytes, mut total_count) = (0u64, 0u64);
        for totals in self.own_totals.iter().chain([&self.shared_totals]) {
            total_bytes = total_bytes.wrapping_add(totals.bytes.load(Ordering::Relaxed));
            total_count = total_count.wrapping_add(totals.count.load(Ordering::Relaxed));
        }
        ResourceStats {
            current_bytes: live_bytes as usize,
            peak_bytes: self.peak_bytes.load(Ordering::Relaxed),
            total_bytes,
            current_count: live_count as usize,
            peak_count: self.peak_count.load(Ordering::Relaxed),
            total_count,
        }
    }

    /// Sets the peaks to the current values (like `torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peaks(&self) {
        let (bytes, count) = unpacked(self.live.load(Ordering::Relaxed));
        self.peak_bytes.store(bytes as usize, Ordering::Relaxed);
        self.peak_count.store(count as usize, Ordering::Relaxed);
    }

    /// The wrapped resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

// SAFETY: see the contract on `MemoryResource`: forwards to `inner`, which upholds it.
unsafe impl<R: MemoryResource> MemoryResource for StatisticsResource<R> {
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        let ptr = self.inner.allocate(bytes, stream)?;
        let (now_bytes, now_count) =
            unpacked(self.live.fetch_add(packed(bytes), Ordering::Relaxed).wrapping_add(packed(bytes)));
        raise(&self.peak_bytes, now_bytes as usize);
        raise(&self.peak_count, now_count as usize);
        match self.own_totals.get(this_thread() as usize) {
            Some(own) => {
                // Only this thread ever writes `own` (thread indices are never reused), so a load
                // and a store cannot lose an update.
                own.bytes.store(own.bytes.load(Ordering::Relaxed).wrapping_add(bytes as u64), Ordering::Relaxed);
                own.count.store(own.count.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            }
            None => {
                self.shared_totals.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                self.shared_totals.count.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
        self.live.fetch_sub(packed(bytes), Ordering::Relaxed);
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.deallocate(ptr, bytes, stream) }
    }

    forward_metadata!();
}

/// Raises `peak` to `now`; a plain load when it does not rise (the common case).
fn raise(peak: &AtomicUsize, now: usize) {
    if now > peak.load(Ordering::Relaxed) {
        peak.fetch_max(now, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::HostResource;
    use super::*;
    use std::sync::Arc;

    #[test]
    fn scripted_sequence_gives_exact_figures() {
        let r = StatisticsResource::new(HostResource::default());
        let s = StreamRef::LEGACY;
        let a = r.allocate(100, s).unwrap();
        let b = r.allocate(300, s).unwrap();
        // SAFETY: from this resource with these sizes, freed once.
        unsafe { r.deallocate(a, 100, s) };
        let c = r.allocate(50, s).unwrap();
        assert_eq!(
            r.stats(),
            ResourceStats {
                current_bytes: 350,
                peak_bytes: 400,
                total_bytes: 450,
                current_count: 2,
                peak_count: 2,
                total_count: 3
            }
        );
        r.reset_peaks();
        assert_eq!((r.stats().peak_bytes, r.stats().peak_count), (350, 2));
        let debug = format!("{r:?}");
        assert!(debug.contains("current_bytes: 350") && debug.len() < 400, "Debug shows the figures: {debug}");
        // SAFETY: as above.
        unsafe {
            r.deallocate(b, 300, s);
            r.deallocate(c, 50, s);
        }
        assert_eq!(r.stats().current_bytes, 0);
        assert_eq!(r.inner().live_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn totals_stay_exact_past_the_threads_with_counters_of_their_own() {
        // More threads than own counter pairs (some test threads may already hold indices): the
        // later ones share the atomic pair.
        let threads = if cfg!(miri) { OWN_TOTALS + 4 } else { 2 * OWN_TOTALS };
        let r = Arc::new(StatisticsResource::new(HostResource::default()));
        for t in 0..threads {
            let r = Arc::clone(&r);
            std::thread::spawn(move || {
                let p = r.allocate(t + 1, StreamRef::LEGACY).unwrap();
                // SAFETY: allocated above, freed once.
                unsafe { r.deallocate(p, t + 1, StreamRef::LEGACY) };
            })
            .join()
            .unwrap();
        }
        let stats = r.stats();
        assert_eq!(stats.total_count, threads as u64);
        assert_eq!(stats.total_bytes, (1..=threads as u64).sum::<u64>());
        assert_eq!((stats.current_bytes, stats.current_count, stats.peak_count), (0, 0, 1));
        // Thread indices are dense and never reused: of more than OWN_TOTALS new threads, some
        // got an index past the own counters and used the shared pair.
        assert!(r.shared_totals.count.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn figures_are_exact_across_threads() {
        const N: usize = if cfg!(miri) { 30 } else { 1000 };
        let r = Arc::new(StatisticsResource::new(HostResource::default()));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let r = Arc::clone(&r);
                std::thread::spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..N {
                        let bytes = 1 + (t * 7 + i) % 64;
                        live.push((r.allocate(bytes, StreamRef::LEGACY).unwrap(), bytes));
                        if i % 3 == 0 {
                            let (p, b) = live.swap_remove(0);
                            // SAFETY: allocated above, freed once.
                            unsafe { r.deallocate(p, b, StreamRef::LEGACY) };
                        }
                    }
                    for (p, b) in live {
                        // SAFETY: as above.
                        unsafe { r.deallocate(p, b, StreamRef::LEGACY) };
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let stats = r.stats();
        let expected_total: u64 = (0..8usize).flat_map(|t| (0..N).map(move |i| (1 + (t * 7 + i) % 64) as u64)).sum();
        assert_eq!(stats.total_bytes, expected_total);
        assert_eq!(stats.total_count, 8 * N as u64);
        assert_eq!((stats.current_bytes, stats.current_count), (0, 0));
        // Each thread ends holding N - ceil(N/3) buffers before its final frees.
        let held = N - N.div_ceil(3);
        assert!(stats.peak_count <= 8 * held && stats.peak_count >= held);
    }
}
