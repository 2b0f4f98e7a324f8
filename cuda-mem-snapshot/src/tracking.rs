//! Snapshots of a [`TrackingResource`]: its outstanding allocations as blocks, and the trace of
//! its events when recorded. The resource reports its events through its observer, so the
//! resource layer needs none of this.

use super::{Block, BlockState, Frames, MemorySnapshot, Segment, TraceRecorder, frames_from_backtrace};
use cuda_mem::resource::{AllocationRecord, MemoryResource, TrackingObserver, TrackingResource};
use std::any::Any;
use std::backtrace::Backtrace;
use std::path::PathBuf;

/// What a tracking resource records for its snapshots.
#[derive(Debug)]
struct SnapshotObserver {
    /// The device ordinal the snapshot files the allocations under.
    device: i32,
    /// The last events, when a trace is recorded.
    recorder: Option<TraceRecorder>,
    /// Where to write a snapshot when an allocation fails for lack of memory.
    dump_on_oom: Option<PathBuf>,
}

impl TrackingObserver for SnapshotObserver {
    fn allocated(&self, address: usize, bytes: usize, stream: usize, backtrace: Option<&Backtrace>) {
        if let Some(recorder) = &self.recorder {
            let frames = backtrace.map_or_else(|| Frames::from([]), frames_from_backtrace);
            recorder.alloc(address, bytes, stream, frames);
        }
    }

    fn freed(&self, address: usize, bytes: usize, stream: usize) {
        if let Some(recorder) = &self.recorder {
            recorder.free(address, bytes, stream);
        }
    }

    fn out_of_memory(
        &self,
        bytes: usize,
        stream: usize,
        device_free: usize,
        outstanding: &dyn Fn() -> Vec<AllocationRecord>,
    ) {
        if let Some(recorder) = &self.recorder {
            recorder.oom(bytes, stream, device_free);
        }
        if let Some(path) = &self.dump_on_oom
            && let Err(io) = snapshot(self.device, outstanding(), self.recorder.as_ref()).write(path)
        {
            eprintln!("cuda-mem: writing the out-of-memory snapshot to {}: {io}", path.display());
        }
    }
}

/// One segment of one block per outstanding allocation, and the recorded trace in the device's slot.
fn snapshot(device: i32, outstanding: Vec<AllocationRecord>, recorder: Option<&TraceRecorder>) -> MemorySnapshot {
    let segments = outstanding
        .into_iter()
        .map(|r| {
            let frames: Frames = r.backtrace.as_deref().map_or_else(|| Frames::from([]), frames_from_backtrace);
            let block = Block {
                address: r.ptr,
                size: r.bytes,
                requested_size: r.bytes,
                state: BlockState::ActiveAllocated,
                frames,
            };
            Segment { device, address: r.ptr, total_size: r.bytes, stream: 0, blocks: vec![block] }
        })
        .collect();
    let slot = usize::try_from(device).unwrap_or(0);
    let mut device_traces = vec![Vec::new(); slot + 1];
    if let Some(recorder) = recorder {
        device_traces[slot] = recorder.snapshot().1;
    }
    MemorySnapshot { segments, device_traces }
}

/// The snapshot methods of cuda-mem's tracking adaptor, in PyTorch's format: `use
/// cuda_mem_snapshot::TrackingSnapshots` and call them on a `TrackingResource`. They install this
/// crate's observer ([`TrackingResource::observed_by`]) in place of any other.
pub trait TrackingSnapshots: Sized {
    /// Records a trace of the last `capacity` allocations and frees (with frames when
    /// backtraces are captured) for [`TrackingSnapshots::memory_snapshot`]. One lock per event.
    fn record_trace(self, capacity: usize) -> Self;

    /// Writes [`TrackingSnapshots::memory_snapshot`] to `path` whenever an allocation fails for
    /// lack of memory (a failed write is reported on stderr).
    fn dump_snapshot_on_oom(self, path: impl Into<PathBuf>) -> Self;

    /// The outstanding allocations (one segment of one block each) and the recorded trace, in
    /// the format of PyTorch's `torch.cuda.memory._snapshot()`: write it with
    /// [`MemorySnapshot::write`] and open it with
    /// `python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o snapshot.html`.
    fn memory_snapshot(&self) -> MemorySnapshot;
}

impl<R: MemoryResource> TrackingSnapshots for TrackingResource<R> {
    fn record_trace(self, capacity: usize) -> Self {
        with_observer(self, |observer| observer.recorder = Some(TraceRecorder::new(observer.device, capacity)))
    }

    fn dump_snapshot_on_oom(self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        with_observer(self, |observer| observer.dump_on_oom = Some(path))
    }

    fn memory_snapshot(&self) -> MemorySnapshot {
        let observer = self.observer().and_then(|o| (o as &dyn Any).downcast_ref::<SnapshotObserver>());
        snapshot(device_of(self), self.outstanding(), observer.and_then(|o| o.recorder.as_ref()))
    }
}

/// The resource with its snapshot observer (one made now, if it had another or none) changed by
/// `change`.
fn with_observer<R: MemoryResource>(
    mut tracking: TrackingResource<R>,
    change: impl FnOnce(&mut SnapshotObserver),
) -> TrackingResource<R> {
    let device = device_of(&tracking);
    let mut observer = tracking
        .take_observer()
        .and_then(|o| (o as Box<dyn Any>).downcast::<SnapshotObserver>().ok())
        .unwrap_or_else(|| Box::new(SnapshotObserver { device, recorder: None, dump_on_oom: None }));
    change(&mut observer);
    tracking.observed_by(observer)
}

/// The device ordinal of the tracked resource's memory (0 for host memory).
fn device_of<R: MemoryResource>(tracking: &TrackingResource<R>) -> i32 {
    tracking.inner().device().map_or(0, |d| d.ordinal() as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_mem::resource::{LimitingResource, StreamRef};
    use cuda_mem::testing::HostResource;

    #[test]
    fn snapshots_show_live_blocks_the_trace_and_dump_on_out_of_memory() {
        let path = std::env::temp_dir().join(format!("cuda-mem-oom-{}.pickle", std::process::id()));
        let r = TrackingResource::new(LimitingResource::new(HostResource::default(), 1000), true)
            .record_trace(16)
            .dump_snapshot_on_oom(&path);
        let s = StreamRef::LEGACY;
        let a = r.allocate(600, s).unwrap();
        let b = r.allocate(300, s).unwrap();
        // SAFETY: from this resource, freed once.
        unsafe { r.deallocate(b, 300, s) };
        assert!(r.allocate(700, s).unwrap_err().is_out_of_memory());
        let snapshot = r.memory_snapshot();
        assert_eq!(snapshot.segments.len(), 1);
        let segment = &snapshot.segments[0];
        assert_eq!((segment.address, segment.total_size), (a.as_ptr() as usize, 600));
        let frames = &segment.blocks[0].frames;
        // Release builds inline this test's frame (the GPU bundle's are release builds).
        if cfg!(debug_assertions) {
            assert!(frames.iter().any(|f| f.name.contains("snapshots_show_live_blocks")), "{frames:?}");
        }
        let actions: Vec<&str> = snapshot.device_traces[0].iter().map(|e| e.action.name()).collect();
        assert_eq!(actions, ["alloc", "alloc", "free_requested", "free_completed", "oom"]);
        let dumped = std::fs::read(&path).expect("the snapshot was dumped on out of memory");
        assert_eq!(dumped, snapshot.to_pickle());
        std::fs::remove_file(&path).unwrap();
        // SAFETY: as above.
        unsafe { r.deallocate(a, 600, s) };
    }
}
