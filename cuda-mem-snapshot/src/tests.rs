use super::*;
use std::io::Write;
use std::process::{Command, Stdio};

fn frame(name: &str, line: u32) -> Frame {
    Frame { filename: "model.py".into(), line, name: name.into() }
}

fn sample() -> MemorySnapshot {
    let frames: Frames = Arc::from([frame("forward", 12), frame("train", 40)]);
    let entry = |action, addr, size| TraceEntry {
        action,
        addr,
        size,
        stream: 0x7f00_0000_1000,
        time_us: 1_700_000_000_000_000,
        device_free: None,
        frames: frames.clone(),
    };
    MemorySnapshot {
        segments: vec![Segment {
            device: 0,
            address: 0x7f12_0000_0000,
            total_size: 3 << 20,
            stream: 0,
            blocks: vec![
                Block {
                    address: 0x7f12_0000_0000,
                    size: 2 << 20,
                    requested_size: 2_000_000,
                    state: BlockState::ActiveAllocated,
                    frames: frames.clone(),
                },
                Block {
                    address: 0x7f12_0020_0000,
                    size: 1 << 20,
                    requested_size: 0,
                    state: BlockState::Inactive,
                    frames: Arc::from([]),
                },
            ],
        }],
        device_traces: vec![vec![
            entry(TraceAction::SegmentAlloc, 0x7f12_0000_0000, 3 << 20),
            entry(TraceAction::Alloc, 0x7f12_0000_0000, 2 << 20),
            entry(TraceAction::FreeRequested, 0x7f12_0000_0000, 2 << 20),
            entry(TraceAction::FreeCompleted, 0x7f12_0000_0000, 2 << 20),
            TraceEntry { device_free: Some(1 << 30), ..entry(TraceAction::Oom, 0, 1 << 40) },
        ]],
    }
}

/// Runs `check` (Python) on the unpickled snapshot `data`; skipped where there is no python3.
fn python_check(pickle: &[u8], check: &str) {
    let script = format!("import pickle, sys\ndata = pickle.load(sys.stdin.buffer)\n{check}\nprint('checked')\n");
    let Ok(mut child) =
        Command::new("python3").arg("-c").arg(script).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()
    else {
        eprintln!("no python3: the pickle was not loaded");
        return;
    };
    child.stdin.take().unwrap().write_all(pickle).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("checked"), "python3 failed");
}

#[test]
#[cfg_attr(miri, ignore = "starts python3 to load the pickle, and Miri cannot start a process")]
fn python_reads_the_snapshot_with_pytorchs_keys() {
    python_check(
        &sample().to_pickle(),
        r#"
assert set(data) == {"segments", "device_traces", "allocator_settings"}, data.keys()
seg = data["segments"][0]
for key in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
            "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"):
    assert key in seg, key
assert (seg["address"], seg["total_size"], seg["allocated_size"], seg["active_size"]) == (0x7f1200000000, 3 << 20, 2 << 20, 2 << 20)
assert seg["segment_type"] == "large" and seg["segment_pool_id"] == (0, 0) and seg["is_expandable"] is False
assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
b = seg["blocks"][0]
assert (b["state"], b["requested_size"]) == ("active_allocated", 2000000)
assert b["frames"] == [{"filename": "model.py", "line": 12, "name": "forward"},
                       {"filename": "model.py", "line": 40, "name": "train"}]
assert seg["blocks"][1]["state"] == "inactive" and seg["blocks"][1]["frames"] == []
trace = data["device_traces"][0]
assert [e["action"] for e in trace] == ["segment_alloc", "alloc", "free_requested", "free_completed", "oom"]
assert all(set(e) >= {"action", "addr", "size", "stream", "time_us", "frames"} for e in trace)
assert trace[1]["stream"] == 0x7f0000001000 and trace[1]["time_us"] == 1700000000000000
assert trace[4]["device_free"] == 1 << 30 and trace[4]["size"] == 1 << 40
"#,
    );
}

#[test]
#[cfg_attr(miri, ignore = "starts python3 to load the pickle, and Miri cannot start a process")]
fn a_large_trace_is_batched_and_memoized() {
    let frames: Frames = Arc::from([]);
    let trace: Vec<TraceEntry> = (0..5000)
        .map(|i| TraceEntry {
            action: if i % 2 == 0 { TraceAction::Alloc } else { TraceAction::FreeCompleted },
            addr: 0x7f00_0000_0000 + (i / 2) * 512,
            size: 512,
            stream: 0,
            time_us: i as u64,
            device_free: None,
            frames: frames.clone(),
        })
        .collect();
    let pickle = MemorySnapshot { segments: vec![], device_traces: vec![vec![], trace] }.to_pickle();
    assert!(pickle.len() < 5000 * 48, "{} bytes: keys are memoized", pickle.len());
    python_check(
        &pickle,
        r#"
assert data["device_traces"][0] == []
t = data["device_traces"][1]
assert len(t) == 5000 and t[4999]["time_us"] == 4999 and t[4998]["addr"] == 0x7f0000000000 + 2499 * 512
assert t[1]["action"] == "free_completed"
"#,
    );
}

#[test]
fn the_recorder_keeps_the_last_entries_and_the_live_blocks() {
    let r = TraceRecorder::new(1, 4);
    let frames: Frames = Arc::from([frame("f", 1)]);
    r.alloc(0x1000, 256, 7, frames.clone());
    r.alloc(0x2000, 512, 7, Arc::from([]));
    r.free(0x1000, 256, 7);
    r.oom(1 << 30, 7, 4096);
    let (segments, trace) = r.snapshot();
    let actions: Vec<_> = trace.iter().map(|e| e.action).collect();
    assert_eq!(actions, [TraceAction::Alloc, TraceAction::FreeRequested, TraceAction::FreeCompleted, TraceAction::Oom]);
    assert_eq!(trace[1].frames, frames, "the free carries the allocation's frames");
    assert_eq!(trace[3].device_free, Some(4096));
    assert_eq!(segments.len(), 1);
    assert_eq!((segments[0].device, segments[0].address, segments[0].total_size), (1, 0x2000, 512));
    let snapshot = snapshot_of([&r]);
    assert_eq!((snapshot.device_traces.len(), snapshot.device_traces[1].len()), (2, 4));
    assert!(snapshot.device_traces[0].is_empty());
}

// A debug build only: release inlines the test's own frame, and the GPU bundle strips line tables.
#[cfg(debug_assertions)]
#[test]
fn backtraces_become_frames() {
    let frames = frames_from_backtrace(&std::backtrace::Backtrace::force_capture());
    assert!(frames.iter().any(|f| f.name.contains("backtraces_become_frames")), "{frames:?}");
    assert!(frames.iter().any(|f| f.line > 0 && f.filename.ends_with(".rs")), "{frames:?}");
}
