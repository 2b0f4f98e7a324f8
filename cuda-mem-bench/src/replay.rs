//! Replaying an allocation log ([`cuda_mem_workloads::log`]) against any resource, reporting
//! time and peak memory, like RMM's replay benchmark: the `replay` example (`cargo xtask replay
//! LOG [RESOURCE]`) drives it.

use cuda_mem::Result;
use cuda_mem::resource::{MemoryResource, StreamRef};
use cuda_mem_workloads::log::ReplayEvent;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplayReport {
    /// Allocations made.
    pub allocations: usize,
    /// Frees made.
    pub frees: usize,
    /// Highest number of bytes live at once during the replay.
    pub peak_bytes: usize,
    /// Wall time of the whole replay.
    pub elapsed: Duration,
    /// Allocations the log never freed (freed at the end of the replay).
    pub unfreed_in_log: usize,
    /// Frees of ids the log never allocated (skipped).
    pub unmatched_frees: usize,
}

/// Replays `events` against `resource` on `stream`, in order, on one thread.
pub fn replay(events: &[ReplayEvent], resource: &dyn MemoryResource, stream: StreamRef<'_>) -> Result<ReplayReport> {
    let started = Instant::now();
    let mut live: HashMap<u64, (NonNull<u8>, usize)> = HashMap::new();
    let mut report = ReplayReport::default();
    let mut live_bytes = 0usize;
    let result = (|| {
        for event in events {
            match *event {
                ReplayEvent::Allocate { id, bytes } => {
                    let ptr = resource.allocate(bytes, stream)?;
                    if let Some((old, old_bytes)) = live.insert(id, (ptr, bytes)) {
                        // The log reused an address without a free line: keep ours consistent.
                        // SAFETY: allocated by this replay from `resource`, freed once.
                        unsafe { resource.deallocate(old, old_bytes, stream) };
                        live_bytes -= old_bytes;
                    }
                    report.allocations += 1;
                    live_bytes += bytes;
                    report.peak_bytes = report.peak_bytes.max(live_bytes);
                }
                ReplayEvent::Free { id, .. } => match live.remove(&id) {
                    Some((ptr, bytes)) => {
                        // SAFETY: allocated by this replay from `resource`, freed once.
                        unsafe { resource.deallocate(ptr, bytes, stream) };
                        report.frees += 1;
                        live_bytes -= bytes;
                    }
                    None => report.unmatched_frees += 1,
                },
            }
        }
        Ok(())
    })();
    report.unfreed_in_log = live.len();
    for (_, (ptr, bytes)) in live {
        // SAFETY: allocated by this replay from `resource`, freed once.
        unsafe { resource.deallocate(ptr, bytes, stream) };
    }
    report.elapsed = started.elapsed();
    result.map(|()| report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_mem::resource::{LogFormat, LoggingResource, StatisticsResource};
    use cuda_mem::testing::HostResource;
    use cuda_mem_workloads::log::{parse_log, peak_live};
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};

    /// A `Write` whose bytes the test can read afterwards.
    #[derive(Clone, Default)]
    struct SharedBuf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for SharedBuf {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// An inference-like script: persistent weights, then steps of temporaries.
    fn workload(r: &dyn MemoryResource) {
        let s = StreamRef::LEGACY;
        let weights = r.allocate(10_000, s).unwrap();
        for step in 0..20 {
            let a = r.allocate(1000 + step * 10, s).unwrap();
            let b = r.allocate(3000, s).unwrap();
            // SAFETY: allocated just above, freed once.
            unsafe {
                r.deallocate(a, 1000 + step * 10, s);
                r.deallocate(b, 3000, s);
            }
        }
        let _ = r.allocate(usize::MAX / 2, s); // fails; logged as allocate_failed
        // SAFETY: as above.
        unsafe { r.deallocate(weights, 10_000, s) };
    }

    /// The logger's lines and the log reader agree (the two keep the format apart: cuda-mem
    /// writes it, cuda-mem-workloads reads it).
    #[test]
    fn a_recorded_log_replays_against_another_resource_with_the_same_peak() {
        for format in [LogFormat::Csv, LogFormat::JsonLines] {
            let buf = SharedBuf::default();
            let recorded = LoggingResource::new(StatisticsResource::new(HostResource::default()), buf.clone(), format);
            workload(&recorded);
            let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            let events = parse_log(&text).unwrap();
            assert_eq!(events.len(), 2 + 40 * 2, "{format:?}");
            let other = StatisticsResource::new(HostResource::default());
            let report = replay(&events, &other, StreamRef::LEGACY).unwrap();
            let recorded_peak = recorded.inner().stats().peak_bytes;
            assert_eq!(report.peak_bytes, recorded_peak);
            assert_eq!(peak_live(&events), recorded_peak);
            assert_eq!(other.stats().peak_bytes, recorded_peak);
            assert_eq!(
                (report.allocations, report.frees, report.unfreed_in_log, report.unmatched_frees),
                (41, 41, 0, 0)
            );
            assert_eq!(other.inner().live_bytes.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn unmatched_and_unfreed_entries_are_counted_and_cleaned_up() {
        let events = [
            ReplayEvent::Free { id: 1, bytes: 8 },
            ReplayEvent::Allocate { id: 2, bytes: 16 },
            ReplayEvent::Allocate { id: 3, bytes: 32 },
            ReplayEvent::Free { id: 3, bytes: 32 },
        ];
        let host = HostResource::default();
        let report = replay(&events, &host, StreamRef::LEGACY).unwrap();
        assert_eq!((report.unmatched_frees, report.unfreed_in_log, report.peak_bytes), (1, 1, 48));
        assert_eq!(peak_live(&events), 48);
        assert_eq!(host.live_bytes.load(Ordering::Relaxed), 0);
    }
}
