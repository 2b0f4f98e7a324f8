//! The raw C++ allocation and copy batches (`reference/alloc_batches.h`, `copy_batches.h`: the
//! code `raw_reference` runs), compiled by `build.rs` into this crate so that the `paired`
//! benchmark can interleave raw CUDA and cuda-mem in one process. Timing is done here, with the same clock as every other row.

use std::ffi::{c_int, c_uint, c_void};
use std::time::{Duration, Instant};

// SAFETY (for every function): plain C functions of reference/in_process.cpp; each takes its
// arguments by value and only calls the CUDA runtime.
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
}

/// Runs one batch of `k` raw C++ pairs of `bytes` and returns how long it took; `Err` holds the
/// CUDA error code of the first failing call.
///
/// # Safety
/// For [`RawBatch::StreamOrdered`], `pool` (when not null) and `stream` must be live handles of
/// the current device for the whole call. For [`RawBatch::Copy`], `dst` and `src` must be valid
/// for `bytes` of the memory `kind` names, not in use by anything else during the call.
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
        }
    };
    let elapsed = start.elapsed();
    if code == 0 { Ok(elapsed) } else { Err(code) }
}
