//! The raw C++ allocation, copy, read and graph-launch batches of `reference/` (the code `raw_reference` runs),
//! compiled by `build.rs` into this crate so that the `paired` benchmark can interleave raw CUDA
//! and cuda-mem in one process. Timing is done here, with the clock of every other row.

use std::ffi::{c_int, c_uint, c_void};
use std::time::{Duration, Instant};

// The C functions of reference/in_process.cu: each takes plain values (or an out-pointer) and
// only calls the CUDA runtime; they return a cudaError_t.
unsafe extern "C" {
    fn cm_raw_device(bytes: usize, k: c_int) -> c_int;
    fn cm_raw_malloc_host(bytes: usize, k: c_int) -> c_int;
    fn cm_raw_host_alloc(bytes: usize, flags: c_uint, k: c_int) -> c_int;
    fn cm_raw_managed(bytes: usize, k: c_int) -> c_int;
    fn cm_raw_stream_ordered(bytes: usize, pool: *mut c_void, stream: *mut c_void, sync_each: c_int, k: c_int)
    -> c_int;
    fn cm_raw_copy(dst: *mut c_void, src: *const c_void, bytes: usize, kind: c_int, sync: c_int, k: c_int) -> c_int;
    fn cm_raw_reads(
        data: *const c_void,
        bytes: usize,
        sink: *mut c_void,
        prefetch_device: c_int,
        stream: *mut c_void,
        k: c_int,
    ) -> c_int;
    fn cm_raw_graph_build(
        buffer: *mut c_void,
        bytes: usize,
        nodes: c_int,
        stream: *mut c_void,
        exec: *mut *mut c_void,
    ) -> c_int;
    fn cm_raw_graph_launches(exec: *mut c_void, stream: *mut c_void, k: c_int) -> c_int;
    fn cm_raw_graph_destroy(exec: *mut c_void) -> c_int;
}

/// Which raw C++ batch to run (the functions of `reference/alloc_batches.h`, `copy_batches.h`
/// and `read_batches.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawBatch {
    /// `cudaMalloc` + `cudaFree`.
    Device,
    /// `cudaMallocHost` + `cudaFreeHost`.
    MallocHost,
    /// `cudaHostAlloc(flags)` + `cudaFreeHost`.
    HostAlloc(u32),
    /// `cudaMallocManaged` + host memset + `cudaFree`.
    Managed,
    /// `cudaMallocAsync` (`cudaMallocFromPoolAsync` when `pool`, a `cudaMemPool_t`, is not null)
    /// + `cudaFreeAsync` on `stream`, synchronizing after each pair or once per batch.
    StreamOrdered { pool: *mut c_void, stream: *mut c_void, sync_each: bool },
    /// `cudaMemcpy(dst, src, bytes, kind)`, then `cudaStreamSynchronize(0)` when `sync_legacy`.
    Copy { dst: *mut c_void, src: *const c_void, kind: u32, sync_legacy: bool },
    /// The streaming-read kernel over `data` (zero the 4-byte `sink`, launch on `stream`,
    /// synchronize), after a `cudaMemPrefetchAsync` to `prefetch_device`.
    Reads { data: *const c_void, sink: *mut c_void, prefetch_device: Option<i32>, stream: *mut c_void },
    /// K `cudaGraphLaunch`es of a [`RawGraph`] on `stream`, then one `cudaStreamSynchronize`.
    GraphLaunches { exec: *mut c_void, stream: *mut c_void },
}

/// An executable graph built by the C++ reference (`graph_batches::build`): `nodes` memsets of
/// a device buffer, captured on a stream. Destroyed on drop.
#[derive(Debug)]
pub struct RawGraph {
    exec: *mut c_void,
}

impl RawGraph {
    /// Captures `nodes` memsets of the `bytes` at `buffer` on `stream` and instantiates them;
    /// `Err` holds the CUDA error code of the first failing call.
    ///
    /// # Safety
    /// `buffer` is device memory of at least `bytes`, and `stream` a created stream of its device;
    /// both stay live, and the buffer unused by anything else, while the graph can be launched.
    pub unsafe fn build(buffer: *mut c_void, bytes: usize, nodes: u32, stream: *mut c_void) -> Result<Self, i32> {
        let nodes = c_int::try_from(nodes).map_err(|_| -1)?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: plain values and an out-pointer valid for writes; the handles are the caller's.
        let code = unsafe { cm_raw_graph_build(buffer, bytes, nodes, stream, &mut exec) };
        match code {
            0 => Ok(Self { exec }),
            code => Err(code),
        }
    }

    /// The `cudaGraphExec_t`, for [`RawBatch::GraphLaunches`].
    pub fn as_raw(&self) -> *mut c_void {
        self.exec
    }
}

impl Drop for RawGraph {
    fn drop(&mut self) {
        // SAFETY: the handle came from `build` and is destroyed once; a launch still running
        // completes first (cudaGraphExecDestroy's contract).
        let _ = unsafe { cm_raw_graph_destroy(self.exec) };
    }
}

/// Runs one batch of `k` operations on `bytes` and returns how long it took; `Err` holds the
/// CUDA error code of the first failing call.
///
/// # Safety
/// The handles and pointers of `batch` must be live for the whole call: `pool` (when not null)
/// and `stream` of the current device, `dst`/`src` valid for `bytes` of the memory `kind` names,
/// `data` device-accessible for `bytes`, `sink` 4 bytes of device memory, `exec` a live
/// [`RawGraph`] of `stream`'s device; none of that memory may be in use by anything else during
/// the call.
pub unsafe fn time_batch(batch: RawBatch, bytes: usize, k: u32) -> Result<Duration, i32> {
    let k = c_int::try_from(k).map_err(|_| -1)?;
    let start = Instant::now();
    // SAFETY: the C functions take plain values; the handles are live (the caller's contract).
    let code = unsafe {
        match batch {
            RawBatch::Device => cm_raw_device(bytes, k),
            RawBatch::MallocHost => cm_raw_malloc_host(bytes, k),
            RawBatch::HostAlloc(flags) => cm_raw_host_alloc(bytes, flags, k),
            RawBatch::Managed => cm_raw_managed(bytes, k),
            RawBatch::StreamOrdered { pool, stream, sync_each } => {
                cm_raw_stream_ordered(bytes, pool, stream, c_int::from(sync_each), k)
            }
            RawBatch::Copy { dst, src, kind, sync_legacy } => {
                cm_raw_copy(dst, src, bytes, kind as c_int, c_int::from(sync_legacy), k)
            }
            RawBatch::Reads { data, sink, prefetch_device, stream } => {
                cm_raw_reads(data, bytes, sink, prefetch_device.unwrap_or(-1), stream, k)
            }
            RawBatch::GraphLaunches { exec, stream } => cm_raw_graph_launches(exec, stream, k),
        }
    };
    let elapsed = start.elapsed();
    if code == 0 { Ok(elapsed) } else { Err(code) }
}
