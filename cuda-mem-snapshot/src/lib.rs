//! Memory snapshots in the format of PyTorch's `torch.cuda.memory._snapshot()`: a pickle with
//! `segments` (each with its `blocks`) and `device_traces` (per device, a list of
//! `{'action', 'addr', 'size', 'stream', 'time_us', 'frames'}` entries), which
//! `python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o snapshot.html` and
//! <https://pytorch.org/memory_viz> open.
//!
//! [`TraceRecorder`] keeps the last entries in a ring and the live allocations;
//! [`TrackingSnapshots::record_trace`] (cuda-mem's `TrackingResource`, through its
//! [`TrackingObserver`](cuda_mem::resource::TrackingObserver)) and the PyTorch allocator of
//! cuda-mem's workspace record into one.
//!
//! ```no_run
//! # fn main() -> cuda_mem::Result<()> {
//! use cuda_mem::resource::{DeviceResource, MemoryResource, TrackingResource};
//! use cuda_mem::{Device, Stream};
//! use cuda_mem_snapshot::TrackingSnapshots;
//! let tracked = TrackingResource::new(DeviceResource::new(Device::current()?), true)
//!     .record_trace(10_000)
//!     .dump_snapshot_on_oom("oom.pickle");
//! let stream = Stream::non_blocking()?;
//! let block = tracked.allocate(1 << 20, stream.as_stream_ref())?;
//! tracked.memory_snapshot().write("snapshot.pickle").expect("written");
//! // SAFETY: from `tracked`, freed once, unused by any work.
//! unsafe { tracked.deallocate(block, 1 << 20, stream.as_stream_ref()) };
//! # Ok(()) }
//! ```

mod pickle;
mod tracking;

pub use tracking::TrackingSnapshots;

use pickle::Pickler;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// The fixed words of a snapshot (keys and values), memoized once each by the pickler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Word {
    Segments,
    DeviceTraces,
    AllocatorSettings,
    Filename,
    Line,
    Name,
    Action,
    Addr,
    Size,
    Stream,
    TimeUs,
    DeviceFree,
    Frames,
    Device,
    Address,
    TotalSize,
    AllocatedSize,
    ActiveSize,
    RequestedSize,
    SegmentType,
    SegmentPoolId,
    IsExpandable,
    Blocks,
    State,
    Small,
    Large,
}

/// A fixed word of the snapshot format: written once by the pickler, then fetched from its memo.
pub(crate) trait FixedWord: Copy {
    /// The word's slot in the pickler's memo table (below [`FIXED_WORDS`]).
    fn slot(self) -> usize;
    /// PyTorch's spelling.
    fn text(self) -> &'static str;
}

/// Slots of the fixed words: the plain words, then the actions, then the block states.
pub(crate) const FIXED_WORDS: usize = Word::COUNT + TraceAction::COUNT + BlockState::COUNT;

impl FixedWord for Word {
    fn slot(self) -> usize {
        self as usize
    }

    fn text(self) -> &'static str {
        self.spelling()
    }
}

impl FixedWord for TraceAction {
    fn slot(self) -> usize {
        Word::COUNT + self as usize
    }

    fn text(self) -> &'static str {
        self.name()
    }
}

impl FixedWord for BlockState {
    fn slot(self) -> usize {
        Word::COUNT + TraceAction::COUNT + self as usize
    }

    fn text(self) -> &'static str {
        self.name()
    }
}

impl Word {
    const COUNT: usize = 26;

    fn spelling(self) -> &'static str {
        match self {
            Self::Segments => "segments",
            Self::DeviceTraces => "device_traces",
            Self::AllocatorSettings => "allocator_settings",
            Self::Filename => "filename",
            Self::Line => "line",
            Self::Name => "name",
            Self::Action => "action",
            Self::Addr => "addr",
            Self::Size => "size",
            Self::Stream => "stream",
            Self::TimeUs => "time_us",
            Self::DeviceFree => "device_free",
            Self::Frames => "frames",
            Self::Device => "device",
            Self::Address => "address",
            Self::TotalSize => "total_size",
            Self::AllocatedSize => "allocated_size",
            Self::ActiveSize => "active_size",
            Self::RequestedSize => "requested_size",
            Self::SegmentType => "segment_type",
            Self::SegmentPoolId => "segment_pool_id",
            Self::IsExpandable => "is_expandable",
            Self::Blocks => "blocks",
            Self::State => "state",
            Self::Small => "small",
            Self::Large => "large",
        }
    }
}

/// One stack frame of an allocation's origin.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Source file.
    pub filename: String,
    /// Line in it.
    pub line: u32,
    /// Function.
    pub name: String,
}

/// Frames, innermost first, shared by the trace entry and the live block of one allocation.
pub type Frames = Arc<[Frame]>;

/// What a trace entry records (PyTorch's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// An allocation was handed out.
    Alloc,
    /// Its owner freed it (for stream-ordered memory: the free was queued).
    FreeRequested,
    /// The memory can be reused.
    FreeCompleted,
    /// The allocator took memory from the driver.
    SegmentAlloc,
    /// The allocator gave memory back to the driver.
    SegmentFree,
    /// An allocation was refused for lack of memory.
    Oom,
    /// A snapshot was taken.
    Snapshot,
}

impl TraceAction {
    /// PyTorch's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::FreeRequested => "free_requested",
            Self::FreeCompleted => "free_completed",
            Self::SegmentAlloc => "segment_alloc",
            Self::SegmentFree => "segment_free",
            Self::Oom => "oom",
            Self::Snapshot => "snapshot",
        }
    }

    const COUNT: usize = 7;
}

/// One entry of a device trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// The address (0 for `Oom`).
    pub addr: usize,
    /// Bytes.
    pub size: usize,
    /// The stream handle, as an integer.
    pub stream: usize,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// Free device bytes, for `Oom` entries.
    pub device_free: Option<usize>,
    /// Where it happened, innermost first (empty when not captured).
    pub frames: Frames,
}

/// The state of a block in a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// In use.
    ActiveAllocated,
    /// Freed, with the free pending in stream order.
    ActiveAwaitingFree,
    /// Free.
    Inactive,
}

impl BlockState {
    /// PyTorch's spelling.
    fn name(self) -> &'static str {
        match self {
            Self::ActiveAllocated => "active_allocated",
            Self::ActiveAwaitingFree => "active_awaiting_free",
            Self::Inactive => "inactive",
        }
    }

    const COUNT: usize = 3;
}

/// A block of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Address.
    pub address: usize,
    /// Bytes the block spans.
    pub size: usize,
    /// Bytes asked for.
    pub requested_size: usize,
    /// In use or not.
    pub state: BlockState,
    /// Where it was allocated.
    pub frames: Frames,
}

/// Memory the allocator holds, cut into blocks that tile it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Device ordinal.
    pub device: i32,
    /// Address.
    pub address: usize,
    /// Bytes.
    pub total_size: usize,
    /// The stream it belongs to, as an integer.
    pub stream: usize,
    /// Its blocks, in address order; their sizes add up to `total_size`.
    pub blocks: Vec<Block>,
}

/// A snapshot: segments and the devices' traces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemorySnapshot {
    /// Memory held now.
    pub segments: Vec<Segment>,
    /// Per device ordinal, its trace, oldest first.
    pub device_traces: Vec<Vec<TraceEntry>>,
}

/// Sizes of PyTorch's "small" segments and below.
const SMALL_SEGMENT: usize = 1 << 20;

impl MemorySnapshot {
    /// The pickle `torch.cuda.memory._snapshot()` would give for this state (protocol 4).
    pub fn to_pickle(&self) -> Vec<u8> {
        let entries: usize = self.device_traces.iter().map(Vec::len).sum();
        let mut p = Pickler::new(64 + 48 * entries + 160 * self.segments.len());
        p.dict(|p| {
            p.key(Word::Segments);
            p.list(&self.segments, write_segment);
            p.key(Word::DeviceTraces);
            p.list(&self.device_traces, |p, trace| p.list(trace, write_entry));
            p.key(Word::AllocatorSettings);
            p.dict(|_| {});
        });
        p.finish()
    }

    /// Writes [`MemorySnapshot::to_pickle`] to `path`.
    pub fn write(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_pickle())
    }
}

fn write_frames<'a>(p: &mut Pickler<'a>, frames: &'a Frames) {
    p.shared_list(frames, |p, frame| {
        p.dict(|p| {
            p.key(Word::Filename);
            p.shared_str(&frame.filename);
            p.uint_field(Word::Line, u64::from(frame.line));
            p.key(Word::Name);
            p.shared_str(&frame.name);
        })
    });
}

fn write_entry<'a>(p: &mut Pickler<'a>, e: &'a TraceEntry) {
    p.dict(|p| {
        p.key(Word::Action);
        p.key(e.action);
        p.uint_field(Word::Addr, e.addr as u64);
        p.uint_field(Word::Size, e.size as u64);
        p.uint_field(Word::Stream, e.stream as u64);
        p.uint_field(Word::TimeUs, e.time_us);
        if let Some(free) = e.device_free {
            p.uint_field(Word::DeviceFree, free as u64);
        }
        p.key(Word::Frames);
        write_frames(p, &e.frames);
    });
}

fn write_segment<'a>(p: &mut Pickler<'a>, s: &'a Segment) {
    let allocated: usize = s.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum();
    let active: usize = s.blocks.iter().filter(|b| b.state != BlockState::Inactive).map(|b| b.size).sum();
    let requested: usize =
        s.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.requested_size).sum();
    p.dict(|p| {
        p.key(Word::Device);
        p.int(i128::from(s.device));
        p.uint_field(Word::Address, s.address as u64);
        p.uint_field(Word::TotalSize, s.total_size as u64);
        p.uint_field(Word::AllocatedSize, allocated as u64);
        p.uint_field(Word::ActiveSize, active as u64);
        p.uint_field(Word::RequestedSize, requested as u64);
        p.uint_field(Word::Stream, s.stream as u64);
        p.key(Word::SegmentType);
        p.key(if s.total_size <= SMALL_SEGMENT { Word::Small } else { Word::Large });
        p.key(Word::SegmentPoolId);
        p.tuple2(0, 0);
        p.key(Word::IsExpandable);
        p.bool(false);
        p.key(Word::Frames);
        p.list::<Frame>(&[], |_, _| {});
        p.key(Word::Blocks);
        p.list(&s.blocks, |p, b| {
            p.dict(|p| {
                p.uint_field(Word::Address, b.address as u64);
                p.uint_field(Word::Size, b.size as u64);
                p.uint_field(Word::RequestedSize, b.requested_size as u64);
                p.key(Word::State);
                p.key(b.state);
                p.key(Word::Frames);
                write_frames(p, &b.frames);
            })
        });
    });
}

/// A live allocation, as the recorder keeps it.
#[derive(Debug, Clone)]
struct Live {
    size: usize,
    stream: usize,
    frames: Frames,
}

#[derive(Debug, Default)]
struct Recorded {
    trace: VecDeque<TraceEntry>,
    live: HashMap<usize, Live>,
}

/// Records the trace of one device (the last `capacity` entries) and its live allocations.
/// One lock per event: meant for diagnosis runs, not for the fast path of production.
#[derive(Debug)]
pub struct TraceRecorder {
    device: i32,
    capacity: usize,
    recorded: Mutex<Recorded>,
}

/// Microseconds since the Unix epoch (what PyTorch's `time_us` holds).
fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

impl TraceRecorder {
    /// A recorder for device `device` keeping the last `capacity` entries.
    pub fn new(device: i32, capacity: usize) -> Self {
        Self { device, capacity, recorded: Mutex::default() }
    }

    fn push(&self, recorded: &mut Recorded, entry: TraceEntry) {
        if self.capacity == 0 {
            return;
        }
        if recorded.trace.len() == self.capacity {
            recorded.trace.pop_front();
        }
        recorded.trace.push_back(entry);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An allocation of `size` bytes at `addr` on `stream`.
    pub fn alloc(&self, addr: usize, size: usize, stream: usize, frames: Frames) {
        let mut recorded = self.lock();
        let entry = TraceEntry {
            action: TraceAction::Alloc,
            addr,
            size,
            stream,
            time_us: now_us(),
            device_free: None,
            frames: frames.clone(),
        };
        self.push(&mut recorded, entry);
        recorded.live.insert(addr, Live { size, stream, frames });
    }

    /// The free of `addr` (queued in stream order: both `free_requested` and `free_completed`
    /// are recorded now, as the completion is not observed).
    pub fn free(&self, addr: usize, size: usize, stream: usize) {
        let mut recorded = self.lock();
        let frames = recorded.live.remove(&addr).map(|live| live.frames).unwrap_or_else(|| Arc::from([]));
        let time_us = now_us();
        for action in [TraceAction::FreeRequested, TraceAction::FreeCompleted] {
            let entry = TraceEntry { action, addr, size, stream, time_us, device_free: None, frames: frames.clone() };
            self.push(&mut recorded, entry);
        }
    }

    /// A refused request of `size` bytes with `device_free` bytes free on the device.
    pub fn oom(&self, size: usize, stream: usize, device_free: usize) {
        let mut recorded = self.lock();
        let entry = TraceEntry {
            action: TraceAction::Oom,
            addr: 0,
            size,
            stream,
            time_us: now_us(),
            device_free: Some(device_free),
            frames: Arc::from([]),
        };
        self.push(&mut recorded, entry);
    }

    /// The device ordinal.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// The trace so far and one segment per live allocation (a pool's internal segments are not
    /// visible to its users; each allocation is shown as a segment of one block).
    pub fn snapshot(&self) -> (Vec<Segment>, Vec<TraceEntry>) {
        let recorded = self.lock();
        let mut segments: Vec<Segment> = recorded
            .live
            .iter()
            .map(|(&address, live)| Segment {
                device: self.device,
                address,
                total_size: live.size,
                stream: live.stream,
                blocks: vec![Block {
                    address,
                    size: live.size,
                    requested_size: live.size,
                    state: BlockState::ActiveAllocated,
                    frames: live.frames.clone(),
                }],
            })
            .collect();
        segments.sort_by_key(|s| s.address);
        (segments, recorded.trace.iter().cloned().collect())
    }
}

/// A snapshot of several devices' recorders (each trace goes to its device's slot).
pub fn snapshot_of<'a>(recorders: impl IntoIterator<Item = &'a TraceRecorder>) -> MemorySnapshot {
    let mut snapshot = MemorySnapshot::default();
    for recorder in recorders {
        let (segments, trace) = recorder.snapshot();
        let slot = usize::try_from(recorder.device()).unwrap_or(0);
        if snapshot.device_traces.len() <= slot {
            snapshot.device_traces.resize(slot + 1, Vec::new());
        }
        snapshot.segments.extend(segments);
        snapshot.device_traces[slot].extend(trace);
    }
    snapshot
}

/// Frames parsed from a captured `std::backtrace::Backtrace` (its display form), innermost
/// first; frames without a source location keep the function name with an empty file.
pub fn frames_from_backtrace(backtrace: &std::backtrace::Backtrace) -> Frames {
    let text = backtrace.to_string();
    let mut frames: Vec<Frame> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(at) = line.strip_prefix("at ") {
            if let Some(frame) = frames.last_mut() {
                let mut parts = at.rsplitn(3, ':');
                let (_column, line_no, file) = (parts.next(), parts.next(), parts.next());
                if let (Some(file), Some(line_no)) = (file, line_no.and_then(|l| l.parse().ok())) {
                    frame.filename = file.to_string();
                    frame.line = line_no;
                }
            }
        } else if let Some((index, name)) = line.split_once(": ")
            && index.chars().all(|c| c.is_ascii_digit())
            && !index.is_empty()
        {
            frames.push(Frame { filename: String::new(), line: 0, name: name.to_string() });
        }
    }
    frames.into()
}

#[cfg(test)]
mod tests;
