//! Allocation logs as cuda-mem's `LoggingResource` writes them (CSV with a header, or JSON
//! lines), read into events and written back: how a recorded program, or a workload of this
//! crate flattened to one thread ([`events_of`]), reaches a replay against any allocator
//! (`cuda-mem-bench`'s `replay`). The line formats are the logger's; the tests of
//! `cuda_mem_bench::replay` check that a log the logger writes reads back here.

/// The CSV log's header line.
pub const CSV_HEADER: &str = "time_us,thread,stream,action,ptr,bytes";

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

/// Parses a log, CSV or JSON lines. `allocate_failed` lines are skipped (nothing was allocated).
pub fn parse_log(text: &str) -> Result<Vec<ReplayEvent>, String> {
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

/// One JSON line of the log, as the logger writes it.
pub fn json_line(time_us: u128, thread: &str, stream: usize, action: &str, ptr: usize, bytes: usize) -> String {
    let thread = thread.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    format!(
        "{{\"time_us\":{time_us},\"thread\":\"{thread}\",\"stream\":\"{stream:#x}\",\
         \"action\":\"{action}\",\"ptr\":\"{ptr:#x}\",\"bytes\":{bytes}}}"
    )
}

/// Writes `events` as a log of JSON lines, which [`parse_log`] reads back: ids as addresses, on
/// thread `thread` and the legacy stream, with `time_us` 0 (a written log has no times).
pub fn write_log(events: &[ReplayEvent], thread: &str, mut sink: impl std::io::Write) -> std::io::Result<()> {
    for event in events {
        let (action, id, bytes) = match *event {
            ReplayEvent::Allocate { id, bytes } => ("allocate", id, bytes),
            ReplayEvent::Free { id, bytes } => ("free", id, bytes),
        };
        // Ids that do not fit an address are written as the address's low bits: never on the
        // 64-bit targets cuda-mem supports.
        writeln!(sink, "{}", json_line(0, thread, 0, action, id as usize, bytes))?;
    }
    sink.flush()
}

/// `workload`'s allocations and frees as one thread's log, in the order of
/// [`Workload::round_robin`](crate::Workload::round_robin): every allocation an id of its own (in
/// allocation order, from 1), a free on another lane's stream a plain free, and `empty_cache`
/// left out (a log has no such event). Its [`peak_live`] is the workload's
/// `peak_live_round_robin`.
pub fn events_of(workload: &crate::Workload) -> Vec<ReplayEvent> {
    let mut ids: Vec<std::collections::HashMap<u32, (u64, usize)>> = vec![Default::default(); workload.lanes.len()];
    let mut events = Vec::new();
    let mut next = 0u64;
    for (lane, op) in workload.round_robin() {
        match op {
            crate::Op::Alloc { id, bytes } => {
                next += 1;
                let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
                ids[lane].insert(id, (next, bytes));
                events.push(ReplayEvent::Allocate { id: next, bytes });
            }
            crate::Op::Free { id } | crate::Op::FreeOn { id, .. } => {
                if let Some((id, bytes)) = ids[lane].remove(&id) {
                    events.push(ReplayEvent::Free { id, bytes });
                }
            }
            crate::Op::EmptyCache => {}
        }
    }
    events
}

/// The most bytes live at once over `events`, as a replay that skips frees of ids not live
/// and lets a second allocation of a live id replace the first sees them.
pub fn peak_live(events: &[ReplayEvent]) -> usize {
    let mut live = std::collections::HashMap::new();
    let (mut now, mut peak) = (0usize, 0usize);
    for event in events {
        match *event {
            ReplayEvent::Allocate { id, bytes } => {
                now -= live.insert(id, bytes).unwrap_or(0);
                now += bytes;
                peak = peak.max(now);
            }
            ReplayEvent::Free { id, .. } => now -= live.remove(&id).unwrap_or(0),
        }
    }
    peak
}

fn csv_fields(line: &str) -> Option<(&str, &str, &str)> {
    let fields: Vec<&str> = line.split(',').collect();
    match fields.as_slice() {
        [_time, _thread, _stream, action, ptr, bytes] => Some((action, ptr, bytes)),
        _ => None,
    }
}

/// Reads the three fields a replay needs from one flat JSON object as written by the logger.
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_workload_flattens_to_a_log_with_its_round_robin_peak() {
        let serving = crate::serving::Serving { steps: 300, ..Default::default() }.workload();
        let events = events_of(&serving);
        let shape = serving.shape();
        let allocations = events.iter().filter(|e| matches!(e, ReplayEvent::Allocate { .. })).count();
        assert_eq!((allocations as u64, events.len() as u64), (shape.allocations, shape.allocations + shape.frees));
        assert_eq!(peak_live(&events) as u64, shape.peak_live_round_robin);
        let mut text = Vec::new();
        write_log(&events, "serving", &mut text).unwrap();
        assert_eq!(parse_log(std::str::from_utf8(&text).unwrap()).unwrap(), events);
    }

    #[test]
    fn the_live_peak_skips_unmatched_frees_and_replaces_reused_ids() {
        let events = [
            ReplayEvent::Free { id: 1, bytes: 8 },
            ReplayEvent::Allocate { id: 2, bytes: 16 },
            ReplayEvent::Allocate { id: 3, bytes: 32 },
            ReplayEvent::Allocate { id: 3, bytes: 4 },
            ReplayEvent::Free { id: 3, bytes: 4 },
            ReplayEvent::Allocate { id: 4, bytes: 40 },
        ];
        assert_eq!(peak_live(&events), 56);
    }
}
