//! Replaying a recorded allocation log against any resource, reporting time and peak memory (like
//! RMM's replay benchmark). `cargo xtask replay` drives it from the command line.

use crate::error::Result;
use crate::resource::{CSV_HEADER, MemoryResource, StreamRef, json_line};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// One event of a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayEvent {
    /// An allocation of `bytes`, known afterwards by `id` (the address in the recorded run).
    Allocate {
        /// The recorded address.
        id: u64,
        /// Size in bytes.
        bytes: usize,
    },
    /// The free of the allocation `id`.
    Free {
        /// The recorded address.
        id: u64,
        /// Size in bytes.
        bytes: usize,
    },
}

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

/// Parses a log written by [`LoggingResource`](crate::resource::LoggingResource), CSV or JSON lines.
/// `allocate_failed` lines are skipped (nothing was allocated).
pub fn parse_log(text: &str) -> std::result::Result<Vec<ReplayEvent>, String> {
    let mut events = Vec::new();
    for (number, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
        if line.is_empty() || line == CSV_HEADER {
            continue;
        }
        let (action, ptr, bytes) = if line.starts_with('{') { json_fields(line) } else { csv_fields(line) }
            .ok_or_else(|| format!("line {number}: not a log line: {line}"))?;
        let id = parse_hex(ptr).ok_or_else(|| format!("line {number}: bad address {ptr:?}"))?;
        let bytes: usize = bytes.parse().map_err(|_| format!("line {number}: bad size {bytes:?}"))?;
        match action {
            "allocate" => events.push(ReplayEvent::Allocate { id, bytes }),
            "free" => events.push(ReplayEvent::Free { id, bytes }),
            "allocate_failed" => {}
            other => return Err(format!("line {number}: unknown action {other:?}")),
        }
    }
    Ok(events)
}

/// Writes `events` as a log in [`LoggingResource`](crate::resource::LoggingResource)'s JSON lines, which
/// [`parse_log`] reads back: ids as addresses, on thread `thread` and the legacy stream, with
/// `time_us` 0 (a written log has no times).
pub fn write_log(events: &[ReplayEvent], thread: &str, mut sink: impl std::io::Write) -> std::io::Result<()> {
    for event in events {
        let (action, id, bytes) = match *event {
            ReplayEvent::Allocate { id, bytes } => ("allocate", id, bytes),
            ReplayEvent::Free { id, bytes } => ("free", id, bytes),
        };
        // Ids that do not fit an address are written as the address's low bits: never on the
        // 64-bit targets this crate supports.
        writeln!(sink, "{}", json_line(0, thread, 0, action, id as usize, bytes))?;
    }
    sink.flush()
}

fn csv_fields(line: &str) -> Option<(&str, &str, &str)> {
    let fields: Vec<&str> = line.split(',').collect();
    match fields.as_slice() {
        [_time, _thread, _stream, action, ptr, bytes] => Some((action, ptr, bytes)),
        _ => None,
    }
}

/// Reads the three fields replay needs from one flat JSON object as written by the logger.
fn json_fields(line: &str) -> Option<(&str, &str, &str)> {
    fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
        let start = line.find(&format!("\"{key}\":"))? + key.len() + 3;
        let rest = &line[start..];
        if let Some(quoted) = rest.strip_prefix('"') {
            quoted.split('"').next()
        } else {
            rest.split([',', '}']).next().map(str::trim)
        }
    }
    Some((field(line, "action")?, field(line, "ptr")?, field(line, "bytes")?))
}

fn parse_hex(text: &str) -> Option<u64> {
    u64::from_str_radix(text.trim_start_matches("0x"), 16).ok()
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
    use crate::resource::testing::HostResource;
    use crate::resource::{LogFormat, LoggingResource, StatisticsResource};
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
            assert_eq!(other.stats().peak_bytes, recorded_peak);
            assert_eq!(
                (report.allocations, report.frees, report.unfreed_in_log, report.unmatched_frees),
                (41, 41, 0, 0)
            );
            assert_eq!(other.inner().live_bytes.load(std::sync::atomic::Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn a_written_log_parses_back_to_its_events() {
        let events = [
            ReplayEvent::Allocate { id: 1, bytes: 4096 },
            ReplayEvent::Allocate { id: 0xdead_beef, bytes: 1 << 40 },
            ReplayEvent::Free { id: 1, bytes: 4096 },
            ReplayEvent::Free { id: 0xdead_beef, bytes: 1 << 40 },
        ];
        let mut text = Vec::new();
        write_log(&events, "a \"quoted\" thread", &mut text).unwrap();
        assert_eq!(parse_log(std::str::from_utf8(&text).unwrap()).unwrap(), events);
    }

    #[test]
    fn malformed_lines_are_reported_with_their_number() {
        let err = parse_log("time_us,thread,stream,action,ptr,bytes\n1,t,0x0,allocate,0x10\n").unwrap_err();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(parse_log("1,t,0x0,teleport,0x10,5").unwrap_err().contains("unknown action"));
        let events = parse_log(
            "{\"time_us\":1,\"thread\":\"a,b\",\"stream\":\"0x0\",\"action\":\"free\",\"ptr\":\"0xff\",\"bytes\":7}",
        )
        .unwrap();
        assert_eq!(events, [ReplayEvent::Free { id: 255, bytes: 7 }]);
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
        assert_eq!(host.live_bytes.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
