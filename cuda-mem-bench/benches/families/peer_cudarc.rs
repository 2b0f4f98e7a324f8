//! The same rows through cudarc 0.19.10 (driver API, loaded at run time), for comparison: same K,
//! samples and batching; only the operations differ, and only where cudarc's safe API has an
//! equivalent:
//! * pinned rows: `CudaContext::alloc_pinned_with_flags` + drop (an event synchronize and
//!   `cuMemFreeHost`);
//! * async rows: `CudaStream::alloc` (`cuMemAllocAsync` from the device's current pool, the
//!   driver's default pool, whose release threshold is set as the raw C++ program sets it) + drop
//!   (`cuMemFreeAsync`), on a `new_stream()` with cudarc's default event tracking;
//! * copies: `memcpy_htod` / `memcpy_dtoh` / `memcpy_dtod` on a stream + `synchronize()` (cudarc
//!   has no blocking `cuMemcpy` wrapper).
//!
//! No cudarc row: `malloc_*` (its safe API allocates stream-ordered whenever pools exist),
//! `managed_*` (not the zeroing work of the cuda-mem and C++ rows), `pool_odd_*` (no
//! `cuMemAllocFromPoolAsync` wrapper), `*_registered` (no host-register wrapper), the kernel rows.

use super::{bench_row, group};
use criterion::Criterion;
use cuda_mem::{Device, MemPool};
use cuda_mem_bench::rows::{self, Peer, Section};
use cudarc::driver::{CudaContext, DriverError, sys};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

/// Runs every cudarc row.
pub fn run(c: &mut Criterion) {
    let ctx = super::ok(CudaContext::new(0), "cudarc context");
    alloc(c, &ctx);
    bandwidth(c, &ctx);
}

fn alloc(c: &mut Criterion, ctx: &Arc<CudaContext>) {
    let mut group = group(c, Section::Alloc, Peer::Cudarc);
    for row in rows::section_rows(Section::Alloc) {
        let bytes = row.bytes as usize;
        let flags = match row.family() {
            "malloc_host" => 0,
            "host_alloc_portable" => sys::CU_MEMHOSTALLOC_PORTABLE,
            "host_alloc_mapped" => sys::CU_MEMHOSTALLOC_DEVICEMAP,
            "host_alloc_wc" => sys::CU_MEMHOSTALLOC_WRITECOMBINED,
            "async_default_sync" | "async_retain_sync" | "async_retain_nosync" => {
                let (retain, sync_each) = (row.family() != "async_default_sync", row.family() != "async_retain_nosync");
                let setup = || -> Result<_, String> {
                    let pool = MemPool::driver_default(Device::current().map_err(|e| e.to_string())?);
                    let threshold = if retain { usize::MAX } else { 0 };
                    pool.and_then(|pool| pool.set_release_threshold(threshold)).map_err(|e| e.to_string())?;
                    ctx.new_stream().map_err(|e| e.to_string())
                };
                bench_row(&mut group, row, setup, |stream, k| -> Result<_, String> {
                    let start = Instant::now();
                    for _ in 0..k {
                        // SAFETY: the memory is dropped (cuMemFreeAsync) without being read.
                        drop(black_box(unsafe { stream.alloc::<u8>(bytes) }.map_err(|e| e.to_string())?));
                        if sync_each {
                            stream.synchronize().map_err(|e| e.to_string())?;
                        }
                    }
                    if !sync_each {
                        stream.synchronize().map_err(|e| e.to_string())?;
                    }
                    Ok(start.elapsed())
                });
                continue;
            }
            _ => continue,
        };
        bench_row(
            &mut group,
            row,
            || Ok::<_, DriverError>(()),
            |_, k| {
                let start = Instant::now();
                for _ in 0..k {
                    // SAFETY: the memory is dropped without being read.
                    drop(black_box(unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, flags)? }));
                }
                Ok(start.elapsed())
            },
        );
    }
    group.finish();
}

fn bandwidth(c: &mut Criterion, ctx: &Arc<CudaContext>) {
    let bytes = rows::COPY_BYTES as usize;
    let mut group = group(c, Section::Bandwidth, Peer::Cudarc);
    for row in rows::section_rows(Section::Bandwidth) {
        let (direction, kind) = row.key.split_once('_').unwrap_or((row.key, ""));
        let flags = match kind {
            "pageable" | "" => None, // "" is d2d
            "pinned" => Some(0),
            "wc" => Some(sys::CU_MEMHOSTALLOC_WRITECOMBINED),
            _ => continue,
        };
        let setup = move || -> Result<_, DriverError> {
            let stream = ctx.new_stream()?;
            let device = stream.clone_htod(&vec![1u8; bytes])?;
            let host = match flags {
                _ if row.key == "d2d" => Err(stream.alloc_zeros::<u8>(bytes)?),
                None => Ok(Err(vec![1u8; bytes])),
                Some(flags) => {
                    // SAFETY: every byte is written before any copy reads it.
                    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, flags)? };
                    pinned.as_mut_slice()?.fill(1);
                    Ok(Ok(pinned))
                }
            };
            stream.synchronize()?;
            Ok((stream, device, host))
        };
        bench_row(&mut group, row, setup, move |(stream, device, other), k| {
            let start = Instant::now();
            for _ in 0..k {
                match (direction == "h2d", &mut *other) {
                    (_, Err(dst)) => stream.memcpy_dtod(device, dst)?,
                    (true, Ok(Ok(pinned))) => stream.memcpy_htod(pinned, device)?,
                    (true, Ok(Err(pageable))) => stream.memcpy_htod(pageable, device)?,
                    (false, Ok(Ok(pinned))) => stream.memcpy_dtoh(device, pinned)?,
                    (false, Ok(Err(pageable))) => stream.memcpy_dtoh(device, pageable)?,
                }
                stream.synchronize()?;
            }
            Ok(start.elapsed())
        });
    }
    group.finish();
}
