#![no_main]
//! Log parsing never panics on any text, and a log written by the logging adaptor parses back to
//! events with the recorded peak.

use arbitrary::Arbitrary;
use cuda_mem::resource::{LogFormat, LoggingResource, MemoryResource, StatisticsResource, StreamRef};
use cuda_mem::testing::HostResource;
use cuda_mem_workloads::log::{ReplayEvent, parse_log, peak_live};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);
impl std::io::Write for Sink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    text: String,
    json: bool,
    ops: Vec<(bool, u16, u8)>,
}

fuzz_target!(|input: Input| {
    let _ = parse_log(&input.text);
    let sink = Sink::default();
    let format = if input.json { LogFormat::JsonLines } else { LogFormat::Csv };
    let logged = LoggingResource::new(StatisticsResource::new(HostResource::default()), sink.clone(), format);
    let s = StreamRef::LEGACY;
    let mut live = Vec::new();
    for (alloc, size, index) in input.ops {
        if alloc || live.is_empty() {
            let bytes = usize::from(size).max(1);
            live.push((logged.allocate(bytes, s).unwrap(), bytes));
        } else {
            let (ptr, bytes) = live.swap_remove(usize::from(index) % live.len());
            // SAFETY: allocated above, freed once.
            unsafe { logged.deallocate(ptr, bytes, s) };
        }
    }
    for (ptr, bytes) in live {
        // SAFETY: as above.
        unsafe { logged.deallocate(ptr, bytes, s) };
    }
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    let events = parse_log(&text).unwrap();
    assert_eq!(peak_live(&events), logged.inner().stats().peak_bytes);
    let allocations = events.iter().filter(|e| matches!(e, ReplayEvent::Allocate { .. })).count();
    assert_eq!(allocations * 2, events.len(), "every allocation logged is freed once");
});
