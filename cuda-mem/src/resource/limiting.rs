//! `LimitingResource`: a byte cap that refuses with the typed out-of-memory error; also a fault
//! injector for tests of out-of-memory handling.

use super::{MemoryResource, StreamRef};
use crate::error::{CudaError, ErrorKind, OomReport, Result};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Refuses allocations that would take its bytes in use above `limit`.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::resource::{DeviceResource, LimitingResource, ResourceBuffer};
/// use cuda_mem::{Device, Stream};
/// use std::sync::Arc;
/// let capped = Arc::new(LimitingResource::new(DeviceResource::new(Device::current()?), 1 << 30));
/// let stream = Stream::new()?;
/// let err = ResourceBuffer::<u8>::zeroed(capped, &stream, 2 << 30).unwrap_err();
/// assert!(err.is_out_of_memory()); // "... the limit of 1073741824 bytes would be exceeded ..."
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LimitingResource<R> {
    inner: R,
    limit: usize,
    in_use: AtomicUsize,
}

impl<R: MemoryResource> LimitingResource<R> {
    /// Wraps `inner` with a cap of `limit` bytes.
    pub fn new(inner: R, limit: usize) -> Self {
        Self { inner, limit, in_use: AtomicUsize::new(0) }
    }

    /// Bytes allocated through this adaptor and not yet freed.
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// The cap.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The wrapped resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

// SAFETY: see the contract on `MemoryResource`: forwards to `inner`, which upholds it.
unsafe impl<R: MemoryResource> MemoryResource for LimitingResource<R> {
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        // Reserve first, so concurrent allocations can never overshoot the cap together.
        let reserved = self.in_use.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            used.checked_add(bytes).filter(|&total| total <= self.limit)
        });
        if let Err(used) = reserved {
            let report = OomReport {
                limit: Some((self.limit, used)),
                pool: self.inner.pool_stats(),
                ..OomReport::requested(bytes)
            };
            let kind = ErrorKind::OutOfMemory { code: None, report: Box::new(report) };
            return Err(CudaError::new(kind, format!("allocating {bytes} bytes under a limit of {}", self.limit)));
        }
        self.inner.allocate(bytes, stream).inspect_err(|_| {
            self.in_use.fetch_sub(bytes, Ordering::Relaxed);
        })
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.deallocate(ptr, bytes, stream) }
    }

    forward_metadata!();
}

#[cfg(test)]
mod tests {
    use super::super::statistics::StatisticsResource;
    use super::super::testing::HostResource;
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_cap_refuses_with_a_typed_error_and_frees_make_room() {
        let r = LimitingResource::new(HostResource::default(), 1000);
        let s = StreamRef::LEGACY;
        let a = r.allocate(600, s).unwrap();
        let err = r.allocate(500, s).unwrap_err();
        assert!(err.is_out_of_memory());
        assert_eq!(err.code(), None);
        match err.kind() {
            ErrorKind::OutOfMemory { report, .. } => {
                assert_eq!((report.requested, report.limit), (500, Some((1000, 600))));
            }
            other => panic!("{other:?}"),
        }
        let message = err.to_string();
        assert!(message.contains("limit of 1000 bytes would be exceeded (600 bytes in use"), "{message}");
        assert!(message.contains("raise the limit"), "{message}");
        // SAFETY: from this resource, freed once.
        unsafe { r.deallocate(a, 600, s) };
        let b = r.allocate(1000, s).unwrap();
        assert_eq!(r.in_use(), 1000);
        // SAFETY: as above.
        unsafe { r.deallocate(b, 1000, s) };
        assert_eq!(r.in_use(), 0);
    }

    #[test]
    fn limiting_and_statistics_compose_in_both_orders() {
        let s = StreamRef::LEGACY;
        let outer_limit = LimitingResource::new(StatisticsResource::new(HostResource::default()), 256);
        let inner_limit = StatisticsResource::new(LimitingResource::new(HostResource::default(), 256));
        for sizes in [[100usize, 100, 100], [256, 1, 1]] {
            let mut got_a = Vec::new();
            let mut got_b = Vec::new();
            for bytes in sizes {
                got_a.push(outer_limit.allocate(bytes, s).map(|p| (p, bytes)));
                got_b.push(inner_limit.allocate(bytes, s).map(|p| (p, bytes)));
            }
            // Same decisions, same figures: refused requests are never counted.
            let oks = |v: &Vec<Result<(NonNull<u8>, usize)>>| v.iter().map(Result::is_ok).collect::<Vec<_>>();
            assert_eq!(oks(&got_a), oks(&got_b));
            assert_eq!(outer_limit.inner().stats(), inner_limit.stats());
            assert_eq!(outer_limit.in_use(), inner_limit.inner().in_use());
            for (p, bytes) in got_a.into_iter().flatten() {
                // SAFETY: from `outer_limit`, freed once.
                unsafe { outer_limit.deallocate(p, bytes, s) };
            }
            for (p, bytes) in got_b.into_iter().flatten() {
                // SAFETY: from `inner_limit`, freed once.
                unsafe { inner_limit.deallocate(p, bytes, s) };
            }
        }
        let stats = inner_limit.stats();
        assert_eq!((stats.current_bytes, stats.peak_bytes, stats.total_count), (0, 256, 3));
    }

    #[test]
    fn concurrent_allocations_never_exceed_the_cap() {
        let r = Arc::new(StatisticsResource::new(LimitingResource::new(HostResource::default(), 10_000)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let r = Arc::clone(&r);
                std::thread::spawn(move || {
                    for _ in 0..if cfg!(miri) { 20 } else { 2000 } {
                        if let Ok(p) = r.allocate(700, StreamRef::LEGACY) {
                            // SAFETY: allocated above, freed once.
                            unsafe { r.deallocate(p, 700, StreamRef::LEGACY) };
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(r.stats().peak_bytes <= 10_000);
        assert_eq!(r.stats().current_bytes, 0);
    }
}
