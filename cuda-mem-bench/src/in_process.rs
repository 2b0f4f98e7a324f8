//! The raw C++ allocation, copy and kernel-read batches (`reference/alloc_batches.h`,
//! `copy_batches.h`, `read_batches.cuh`: the code `raw_reference` runs), compiled by `build.rs`
//! into this crate so that the `paired` benchmark can interleave raw CUDA and cuda-mem in one
//! process. Timing is done here, with the same clock as every other row.

use std::ffi::{c_int, c_uint, c_void};
use std::time::{Duration, Instant};

// SAFETY (for every function): plain C functions of reference/in_process.cpp and
// in_process_kernels.cu; each takes its arguments by value (or an out-pointer) and only calls the
// CUDA runtime.
unsafe extern "C" {
    fn cm_raw_device(bytes: usize, k: c_int) -> c_int;
    fn cm_raw_malloc_host(bytes: usize, k: c_int) -> c_int;
    fn cm_raw_host_alloc(bytes: usize, flags: c_uint, k: c_int) -> c_int;
    fn cm_raw_managed(bytes: usize, k: c_int) -> c_int;
    fn cm_raw_stream_ordered(bytes: usize, pool: *mut c_void, stream: *mut c_void, sync_each: c_int, k: c_int)
    -> c_int;
    fn cm_raw_copy(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: c_int,
        sync_legacy: c_int,
        k: c_int,
    ) -> c_int;
    fn cm_raw_resident_blocks(blocks: *mut c_uint) -> c_int;
    fn cm_raw_reads(
        data: *const c_void,
        bytes: usize,
        sink: *mut c_void,
        blocks: c_uint,
        prefetch_device: c_int,
        stream: *mut c_void,
        k: c_int,
    ) -> c_int;
}

/// Which raw C++ batch to run.
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
    /// `cudaMallocAsync` (or `cudaMallocFromPoolAsync` when `pool` is not null) + `cudaFreeAsync`
    /// on `stream`, synchronizing after each pair or once per batch.
    StreamOrdered {
        /// A `cudaMemPool_t`, or null for the device's current pool.
        pool: *mut c_void,
        /// A `cudaStream_t`.
        stream: *mut c_void,
        /// Synchronize after every pair (else once at the end of the batch).
        sync_each: bool,
    },
    /// `cudaMemcpy(dst, src, bytes, kind)` (`copy_batches.h`), then `cudaStreamSynchronize(0)`
    /// after each copy when `sync_legacy`.
    Copy {
        /// Destination: `bytes` writable (host or device).
        dst: *mut c_void,
        /// Source: `bytes` readable (host or device).
        src: *const c_void,
        /// A `cudaMemcpyKind` value.
        kind: u32,
        /// Wait for the legacy stream after each copy.
        sync_legacy: bool,
    },
    /// The streaming-read kernel over `bytes` at `data` (`read_batches.cuh`): zero `sink`, launch
    /// on `stream`, synchronize; with `prefetch_device`, a `cudaMemPrefetchAsync` to it first.
    Reads {
        /// Device-accessible memory of `bytes` (a multiple of 16).
        data: *const c_void,
        /// 4 bytes of device memory the kernel XORs into.
        sink: *mut c_void,
        /// Grid limit: [`resident_blocks`].
        blocks: u32,
        /// Prefetch managed `data` to this device before each read.
        prefetch_device: Option<i32>,
        /// A `cudaStream_t`.
        stream: *mut c_void,
    },
}

/// Blocks of 256 threads the current device holds at once (the reads' grid limit); `Err` holds
/// the CUDA error code.
pub fn resident_blocks() -> Result<u32, i32> {
    let mut blocks: c_uint = 0;
    // SAFETY: a valid out-pointer; the function only queries device attributes.
    let code = unsafe { cm_raw_resident_blocks(&mut blocks) };
    if code == 0 { Ok(blocks) } else { Err(code) }
}

/// Runs one batch of `k` raw C++ pairs of `bytes` and returns how long it took; `Err` holds the
/// CUDA error code of the first failing call.
///
/// # Safety
/// For [`RawBatch::StreamOrdered`], `pool` (when not null) and `stream` must be live handles of
/// the current device for the whole call. For [`RawBatch::Copy`], `dst` and `src` must be valid
/// for `bytes` of the memory `kind` names, not in use by anything else during the call. For
/// [`RawBatch::Reads`], `data` must be device-accessible for `bytes`, `sink` 4 bytes of device
/// memory and `stream` a live stream, none freed during the call.
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
            RawBatch::Reads { data, sink, blocks, prefetch_device, stream } => {
                cm_raw_reads(data, bytes, sink, blocks, prefetch_device.unwrap_or(-1), stream, k)
            }
        }
    };
    let elapsed = start.elapsed();
    if code == 0 { Ok(elapsed) } else { Err(code) }
}
