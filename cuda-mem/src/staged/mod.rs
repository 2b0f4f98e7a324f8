//! Staged copies between pageable host memory and the device that beat the driver's own path.
//!
//! `cudaMemcpy` from pageable memory runs at a fraction of pinned DMA's bandwidth (figures in the
//! project's docs/staged-copies.md): the driver stages through a small pinned buffer with one CPU
//! thread. [`StagedCopier`] does the same with several persistent worker threads ("lanes"), each
//! owning a stream and two pinned staging slots from a [`PinnedPool`], so CPU copies into (or out
//! of) one slot overlap with the DMA of the other and the lanes run in parallel. The ceiling is
//! the host's memcpy bandwidth. Small copies take the plain path.

mod on;

use crate::device::Device;
use crate::error::{CudaError, ErrorKind, Result};
use crate::pinned_pool::{PinnedPool, PooledPinned};
use crate::raw;
use crate::raw::host_flags::HostAllocFlags;
use crate::raw::memory::Direction;
use crate::slice::{DeviceSliceMut, DeviceSource};
use crate::stream::Event;
use crate::stream::Stream;
use bytemuck::Pod;
use std::sync::{Arc, Mutex, PoisonError};

/// Tuning of a [`StagedCopier`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedConfig {
    /// Worker threads, each with its own stream and two staging slots.
    pub lanes: usize,
    /// Largest chunk a lane copies at once (smaller chunks are used so each lane gets several).
    pub chunk_bytes: usize,
    /// Copies smaller than this take the plain `cudaMemcpy` path.
    pub small_copy_bytes: usize,
}

/// The most lanes a copier takes: each lane is a thread and a stream, and lanes beyond the host's
/// cores and the device's copy engines only add contention.
pub const MAX_LANES: usize = 64;

impl Default for StagedConfig {
    /// Chosen by measurement on the H200 host (16 cores, PCIe Gen5; `examples/staged_tuning.rs`,
    /// figures in `docs/staged-copies.md`): one lane per core up to 16, 2 MiB chunks (the best
    /// balanced H2D/D2H pair of the sweep), and the plain path below 4 MiB,
    /// where the driver's own staging was faster.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(4, std::num::NonZeroUsize::get);
        Self { lanes: cores.clamp(2, 16), chunk_bytes: 2 << 20, small_copy_bytes: 4 << 20 }
    }
}

/// The smallest chunk worth a DMA of its own.
const MIN_CHUNK: usize = 1 << 20;
/// Chunks per lane the splitter aims for, so each lane overlaps copy and DMA.
const CHUNKS_PER_LANE: usize = 4;

/// Copies between pageable host slices and device memory through pinned staging buffers, in
/// parallel and overlapped with DMA. Every method blocks until the copy is complete, like
/// `cudaMemcpy`, so the borrows it takes are the whole story.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{DeviceBuffer, StagedCopier};
/// let copier = StagedCopier::new(Default::default())?;
/// let host = vec![1.5f32; 256 << 20]; // ordinary pageable memory, 1 GiB
/// let mut device = DeviceBuffer::<f32>::zeroed(host.len())?;
/// let mut view = device.as_mut_slice();
/// copier.copy_from_host(&mut view, &host)?;
/// let mut back = vec![0f32; host.len()];
/// copier.copy_to_host(&mut back, device.as_slice())?;
/// # Ok(()) }
/// ```
pub struct StagedCopier {
    inner: Arc<Lanes>,
}

/// The lanes and their threads, shared with the jobs of the stream-ordered forms (`on.rs`),
/// which run after the call that queued them has returned.
struct Lanes {
    config: StagedConfig,
    device: Device,
    workers: rayon::ThreadPool,
    lanes: Vec<Mutex<Lane>>,
    staging: PinnedPool,
}

impl std::fmt::Debug for StagedCopier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedCopier").field("config", &self.inner.config).field("device", &self.inner.device).finish()
    }
}

/// How a lane ends its share of a copy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LaneEnd {
    /// Waits for its stream (the blocking forms).
    Synchronize,
    /// Records an event after its last DMA and hands it back (the stream-ordered forms).
    Record,
}

/// One staged copy's sizes and the stream its device memory is ordered on.
struct Transfer<'a> {
    src_len: usize,
    dst_len: usize,
    bytes: usize,
    owner: Option<&'a Stream>,
}

struct Lane {
    stream: Stream,
    slots: Vec<PooledPinned<u8>>,
    /// The DMA last queued on each slot.
    in_flight: [Option<Event>; 2],
}

/// A host or device address handed to the worker threads of one copy.
#[derive(Clone, Copy)]
struct Addr(*mut u8);

// SAFETY: the address is only used while the copy that created it blocks its caller, which holds
// the borrows; the lanes use disjoint ranges of it.
unsafe impl Send for Addr {}
// SAFETY: as above; lanes only read the address itself.
unsafe impl Sync for Addr {}

impl Addr {
    fn at(self, offset: usize) -> *mut u8 {
        self.0.wrapping_add(offset)
    }
}

impl StagedCopier {
    /// A copier on the current device with `config`'s lanes (threads and streams start now;
    /// staging memory is taken from its pool at first use).
    pub fn new(config: StagedConfig) -> Result<Self> {
        if config.lanes == 0 || config.chunk_bytes == 0 {
            let kind = ErrorKind::InvalidArgument("lanes and chunk_bytes must be positive");
            return Err(CudaError::new(kind, format!("StagedCopier::new({config:?})")));
        }
        if config.lanes > MAX_LANES {
            let kind = ErrorKind::InvalidArgument("more lanes than StagedConfig::MAX_LANES");
            return Err(CudaError::new(kind, format!("StagedCopier::new({config:?}): at most {MAX_LANES} lanes")));
        }
        let device = Device::current()?;
        let lanes = (0..config.lanes)
            .map(|_| {
                Ok(Mutex::new(Lane { stream: Stream::on_device(device)?, slots: Vec::new(), in_flight: [None, None] }))
            })
            .collect::<Result<Vec<_>>>()?;
        let workers = rayon::ThreadPoolBuilder::new()
            .num_threads(config.lanes)
            .thread_name(|i| format!("cuda-mem-stage-{i}"))
            .build()
            .map_err(|_| CudaError::new(ErrorKind::Unsupported("spawning threads"), "StagedCopier::new"))?;
        let staging = PinnedPool::new(HostAllocFlags::PORTABLE);
        Ok(Self { inner: Arc::new(Lanes { config, device, workers, lanes, staging }) })
    }

    /// The configuration in use.
    pub fn config(&self) -> StagedConfig {
        self.inner.config
    }

    /// Copies `src` (pageable host memory) into `dst`; returns when the data is on the device.
    pub fn copy_from_host<T: Pod>(&self, dst: &mut DeviceSliceMut<'_, T>, src: &[T]) -> Result<()> {
        let host = Addr(src.as_ptr().cast::<u8>().cast_mut());
        let device = Addr(dst.as_device_ptr().cast());
        let plan = Transfer { src_len: src.len(), dst_len: dst.len(), bytes: size_of_val(src), owner: dst.owner() };
        self.transfer(
            plan,
            "staged copy host to device",
            || dst.copy_from_host(src),
            |lane, chunks| lane.upload(chunks, host, device),
        )
    }

    /// Copies `src` (device memory) into `dst` (pageable host memory); returns when done.
    pub fn copy_to_host<'s, T: Pod>(&self, dst: &mut [T], src: impl DeviceSource<'s, T>) -> Result<()> {
        let src = src.source();
        let host = Addr(dst.as_mut_ptr().cast());
        let device = Addr(src.as_device_ptr().cast::<u8>().cast_mut());
        let plan = Transfer { src_len: src.len(), dst_len: dst.len(), bytes: size_of_val(dst), owner: src.owner() };
        self.transfer(
            plan,
            "staged copy device to host",
            || src.copy_to_host(dst),
            |lane, chunks| lane.download(chunks, host, device),
        )
    }

    /// What both directions share: the length check, the blocking path for small copies, and
    /// ordering after the stream that stream-ordered memory is ordered on (the lanes' streams must
    /// not overtake its allocation or zeroing).
    fn transfer(
        &self,
        plan: Transfer<'_>,
        operation: &'static str,
        small: impl FnOnce() -> Result<()>,
        large: impl Fn(&mut Lane, &[(usize, usize)]) -> Result<()> + Sync,
    ) -> Result<()> {
        crate::raw::same_len(plan.src_len, plan.dst_len, operation)?;
        if plan.bytes < self.inner.config.small_copy_bytes {
            return small();
        }
        if let Some(owner) = plan.owner {
            owner.synchronize()?;
        }
        self.inner.run(plan.bytes, &[], LaneEnd::Synchronize, large).map(drop)
    }
}

impl Lanes {
    /// Splits `bytes` into chunks, deals them to the lanes round-robin, runs every lane on its own
    /// worker thread and waits for all of them. Each lane's stream first waits for `waits` (on the
    /// device); at its end the lane synchronizes its stream or records an event, as `end` says,
    /// and the recorded events come back. A lane that fails synchronizes its stream, so nothing of
    /// a failed copy is left in flight.
    fn run(
        &self,
        bytes: usize,
        waits: &[Event],
        end: LaneEnd,
        work: impl Fn(&mut Lane, &[(usize, usize)]) -> Result<()> + Sync,
    ) -> Result<Vec<Event>> {
        let chunk = chunk_size(bytes, self.config);
        let plan = deal(bytes, chunk, self.lanes.len());
        let outcomes = Mutex::new(Vec::new());
        self.workers.scope(|scope| {
            for (lane, chunks) in self.lanes.iter().zip(&plan).filter(|(_, c)| !c.is_empty()) {
                let (work, outcomes) = (&work, &outcomes);
                scope.spawn(move |_| {
                    let mut lane = lane.lock().unwrap_or_else(PoisonError::into_inner);
                    let result = self
                        .device
                        .set_current()
                        .and_then(|()| lane.ensure_slots(&self.staging, chunk))
                        .and_then(|()| waits.iter().try_for_each(|ready| lane.stream.wait_event(ready)))
                        .and_then(|()| work(&mut lane, chunks))
                        .and_then(|()| match end {
                            LaneEnd::Synchronize => lane.stream.synchronize().map(|()| None),
                            LaneEnd::Record => Event::fence(&lane.stream).map(Some),
                        });
                    if result.is_err() {
                        // Leave nothing in flight on the error path either.
                        raw::quiet(lane.stream.synchronize());
                    }
                    outcomes.lock().unwrap_or_else(PoisonError::into_inner).push(result);
                });
            }
        });
        let outcomes = outcomes.into_inner().unwrap_or_else(PoisonError::into_inner);
        outcomes.into_iter().filter_map(Result::transpose).collect()
    }
}

impl Lane {
    fn ensure_slots(&mut self, staging: &PinnedPool, chunk: usize) -> Result<()> {
        if self.slots.len() == 2 && self.slots.iter().all(|s| s.len() >= chunk) {
            return Ok(());
        }
        self.wait_all();
        self.slots = vec![staging.alloc::<u8>(chunk)?, staging.alloc::<u8>(chunk)?];
        Ok(())
    }

    fn wait_all(&mut self) {
        for event in self.in_flight.iter_mut().filter_map(Option::take) {
            raw::quiet(event.synchronize());
        }
    }

    fn wait_slot(&mut self, slot: usize) -> Result<()> {
        match self.in_flight[slot].take() {
            Some(event) => event.synchronize(),
            None => Ok(()),
        }
    }

    /// For each chunk: wait until its slot's previous DMA is done, copy host → slot, queue the DMA.
    fn upload(&mut self, chunks: &[(usize, usize)], host: Addr, device: Addr) -> Result<()> {
        for (k, &(offset, len)) in chunks.iter().enumerate() {
            let slot = k % 2;
            self.wait_slot(slot)?;
            // SAFETY: `host + offset .. + len` lies inside the source slice, which the caller
            // borrows until every lane has finished; lanes touch disjoint chunks.
            let src = unsafe { std::slice::from_raw_parts(host.at(offset), len) };
            self.slots[slot][..len].copy_from_slice(src);
            // SAFETY: the slot holds `len` bytes and stays untouched until the event completes;
            // the destination range lies inside the borrowed device slice.
            unsafe {
                self.queue_dma(
                    slot,
                    device.at(offset),
                    self.slots[slot].as_ptr().cast_mut(),
                    len,
                    Direction::HostToDevice,
                )?
            };
        }
        Ok(())
    }

    /// Queues a copy of `len` bytes on the lane's stream and records its completion for `slot`.
    ///
    /// # Safety
    /// Both ranges hold `len` bytes and stay allocated and untouched until the slot's event has
    /// completed.
    unsafe fn queue_dma(
        &mut self,
        slot: usize,
        dst: *mut u8,
        src: *mut u8,
        len: usize,
        direction: Direction,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; the lane's stream is a created stream it owns.
        unsafe { raw::memory::copy_async(dst.cast(), src.cast(), len, direction, self.stream.as_raw())? };
        self.in_flight[slot] = Some(Event::fence(&self.stream)?);
        Ok(())
    }

    /// Queues the DMA of chunk k+1 before copying chunk k out of its slot, so they overlap.
    fn download(&mut self, chunks: &[(usize, usize)], host: Addr, device: Addr) -> Result<()> {
        let queue = |lane: &mut Self, k: usize| -> Result<()> {
            let (offset, len) = chunks[k];
            let slot = k % 2;
            let slot_ptr = lane.slots[slot].as_mut_ptr();
            // SAFETY: the device range lies inside the borrowed slice; the slot is free (its last
            // chunk was copied out before this call) and holds `len` bytes.
            unsafe { lane.queue_dma(slot, slot_ptr, device.at(offset), len, Direction::DeviceToHost) }
        };
        queue(self, 0)?;
        for k in 0..chunks.len() {
            if k + 1 < chunks.len() {
                queue(self, k + 1)?;
            }
            let (offset, len) = chunks[k];
            self.wait_slot(k % 2)?;
            // SAFETY: `host + offset .. + len` lies inside the destination slice, borrowed
            // exclusively by the caller until every lane has finished; lanes write disjoint chunks.
            let dst = unsafe { std::slice::from_raw_parts_mut(host.at(offset), len) };
            dst.copy_from_slice(&self.slots[k % 2][..len]);
        }
        Ok(())
    }
}

/// Chunk size for a copy: the configured chunk, smaller when that gives each lane at least
/// `CHUNKS_PER_LANE` chunks (never under `MIN_CHUNK`).
pub fn chunk_size(bytes: usize, config: StagedConfig) -> usize {
    let target = bytes.div_ceil(config.lanes * CHUNKS_PER_LANE);
    target.clamp(MIN_CHUNK.min(config.chunk_bytes), config.chunk_bytes)
}

/// Deals `bytes` in chunks of `chunk` to `lanes` lanes round-robin: per lane, (offset, len) pairs.
pub fn deal(bytes: usize, chunk: usize, lanes: usize) -> Vec<Vec<(usize, usize)>> {
    let mut plan = vec![Vec::new(); lanes];
    for (i, offset) in (0..bytes).step_by(chunk).enumerate() {
        plan[i % lanes].push((offset, chunk.min(bytes - offset)));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_counts_beyond_the_limit_are_refused_before_any_cuda_call() {
        for lanes in [MAX_LANES + 1, 10_000, usize::MAX] {
            let config = StagedConfig { lanes, ..StagedConfig::default() };
            let err = StagedCopier::new(config).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{lanes}: {err}");
        }
    }

    #[test]
    fn dealing_covers_every_byte_once() {
        for (bytes, chunk, lanes) in [(1, 1 << 20, 8), ((1 << 30) + 7, 8 << 20, 8), (10 << 20, 3 << 20, 3)] {
            let plan = deal(bytes, chunk, lanes);
            let mut pieces: Vec<_> = plan.iter().flatten().copied().collect();
            pieces.sort();
            let mut next = 0;
            for (offset, len) in pieces {
                assert_eq!(offset, next);
                assert!(len > 0 && len <= chunk);
                next += len;
            }
            assert_eq!(next, bytes);
            let counts: Vec<_> = plan.iter().map(Vec::len).collect();
            assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn chunks_shrink_so_every_lane_pipelines() {
        let config = StagedConfig { lanes: 8, chunk_bytes: 8 << 20, small_copy_bytes: 4 << 20 };
        assert_eq!(chunk_size(1 << 30, config), 8 << 20);
        assert_eq!(chunk_size(64 << 20, config), 2 << 20);
        assert_eq!(chunk_size(5 << 20, config), 1 << 20);
        let tiny = StagedConfig { chunk_bytes: 4096, ..config };
        assert_eq!(chunk_size(1 << 30, tiny), 4096);
    }
}
