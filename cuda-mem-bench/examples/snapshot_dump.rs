//! Times the pickling of a memory snapshot with a trace of 100k entries (the format of
//! `torch.cuda.memory._snapshot()`), and writes it. No GPU needed.
//!
//! `cargo run --release -p cuda-mem-bench --example snapshot_dump [ENTRIES] [OUT.pickle]`

use cuda_mem_snapshot::{Block, BlockState, Frame, Frames, MemorySnapshot, Segment, TraceAction, TraceEntry};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let entries: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let out = args.next();
    let frames: Frames = Arc::from([
        Frame { filename: "train.py".into(), line: 41, name: "step".into() },
        Frame { filename: "model.py".into(), line: 12, name: "forward".into() },
    ]);
    let trace: Vec<TraceEntry> = (0..entries)
        .map(|i| TraceEntry {
            action: [TraceAction::Alloc, TraceAction::FreeRequested, TraceAction::FreeCompleted][i % 3],
            addr: 0x7f00_0000_0000 + (i / 3 % 4096) * 4096,
            size: 4096 + i % 7 * 512,
            stream: 0,
            time_us: 1_700_000_000_000_000 + i as u64,
            device_free: None,
            frames: if i % 10 == 0 { frames.clone() } else { Arc::from([]) },
        })
        .collect();
    let segments: Vec<Segment> = (0..1000)
        .map(|i| {
            let address = 0x7f10_0000_0000 + i * (2 << 20);
            let block = |offset, state| Block {
                address: address + offset,
                size: 1 << 20,
                requested_size: 1_000_000,
                state,
                frames: frames.clone(),
            };
            Segment {
                device: 0,
                address,
                total_size: 2 << 20,
                stream: 0,
                blocks: vec![block(0, BlockState::ActiveAllocated), block(1 << 20, BlockState::Inactive)],
            }
        })
        .collect();
    let snapshot = MemorySnapshot { segments, device_traces: vec![trace] };
    let mut best = f64::INFINITY;
    let mut bytes = Vec::new();
    for _ in 0..10 {
        let start = Instant::now();
        bytes = snapshot.to_pickle();
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!(
        "pickled {entries} trace entries and 1000 segments: {} bytes in {:.3} ms (best of 10; target <= 10 ms)",
        bytes.len(),
        best * 1e3
    );
    if let Some(out) = out {
        std::fs::write(&out, &bytes).expect("write the snapshot");
        println!("written to {out}");
    }
}
