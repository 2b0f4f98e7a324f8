//! The same rows through cudarc 0.19.10 (driver API, loaded at run time), for comparison.
//!
//! Measured exactly like the cuda-mem rows (same K, samples, batching); only the operations differ,
//! and only where cudarc's safe API has an equivalent:
//! * pinned rows: `CudaContext::alloc_pinned_with_flags` + drop (which synchronizes an event and
//!   calls `cuMemFreeHost`);
//! * async rows: `CudaStream::alloc` (`cuMemAllocAsync` from the device's current pool) + drop
//!   (`cuMemFreeAsync` on the stream), on a `new_stream()` with cudarc's default event tracking;
//!   the default pool's release threshold is set through cuda-mem (the runtime and the driver share
//!   the primary context and its pools);
//! * copies: `memcpy_htod` / `memcpy_dtoh` / `memcpy_dtod` on a stream + `synchronize()` (cudarc
//!   has no blocking `cuMemcpy` wrapper); pinned = flags 0, write-combined =
//!   `CU_MEMHOSTALLOC_WRITECOMBINED`.
//!
//! No cudarc row: `malloc_*` (its safe API allocates stream-ordered whenever pools exist),
//! `managed_*` (would not do the same work as the zeroing cuda-mem/C++ rows), `pool_odd_*` (no
//! `cuMemAllocFromPoolAsync` wrapper), `*_registered` (no host-register wrapper), and the kernel
//! rows (no kernel here).

use super::{bench_row, group};
use criterion::Criterion;
use cuda_mem::{Device, MemPool};
use cuda_mem_bench::rows::{self, Peer, Section};
use cudarc::driver::{CudaContext, DriverError, sys};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Runs every cudarc row.
pub fn run(c: &mut Criterion) {
    let ctx = super::ok(CudaContext::new(0), "cudarc context");
    alloc(c, &ctx);
    bandwidth(c, &ctx);
}

fn pinned_flags(family: &str) -> Option<u32> {
    Some(match family {
        "malloc_host" => 0,
        "host_alloc_portable" => sys::CU_MEMHOSTALLOC_PORTABLE,
        "host_alloc_mapped" => sys::CU_MEMHOSTALLOC_DEVICEMAP,
        "host_alloc_wc" => sys::CU_MEMHOSTALLOC_WRITECOMBINED,
        _ => return None,
    })
}

fn alloc(c: &mut Criterion, ctx: &std::sync::Arc<CudaContext>) {
    let mut group = group(c, Section::Alloc, Peer::Cudarc);
    for row in rows::section_rows(Section::Alloc) {
        let bytes = row.bytes as usize;
        let family = row.family();
        if let Some(flags) = pinned_flags(family) {
            bench_row(
                &mut group,
                row,
                || Ok::<_, DriverError>(()),
                |_, k| {
                    let start = Instant::now();
                    for _ in 0..k {
                        // SAFETY: the memory is dropped without being read.
                        let buffer = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, flags)? };
                        drop(black_box(buffer));
                    }
                    Ok(start.elapsed())
                },
            );
            continue;
        }
        let sync_each = match family {
            "async_default_sync" | "async_retain_sync" => true,
            "async_retain_nosync" => false,
            _ => continue,
        };
        let retain = family != "async_default_sync";
        let setup = || -> Result<_, String> {
            let pool = MemPool::retaining(Device::current().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
            if !retain {
                pool.set_release_threshold(0).map_err(|e| e.to_string())?;
            }
            ctx.new_stream().map_err(|e| e.to_string())
        };
        bench_row(&mut group, row, setup, |stream, k| -> Result<Duration, String> {
            let start = Instant::now();
            for _ in 0..k {
                // SAFETY: the memory is dropped (cuMemFreeAsync) without being read.
                let buffer = unsafe { stream.alloc::<u8>(bytes) }.map_err(|e| e.to_string())?;
                drop(black_box(buffer));
                if sync_each {
                    stream.synchronize().map_err(|e| e.to_string())?;
                }
            }
            if !sync_each {
                stream.synchronize().map_err(|e| e.to_string())?;
            }
            Ok(start.elapsed())
        });
    }
    if let Ok(device) = Device::current() {
        let _ = MemPool::retaining(device);
    }
    group.finish();
}

fn bandwidth(c: &mut Criterion, ctx: &std::sync::Arc<CudaContext>) {
    let bytes = rows::COPY_BYTES as usize;
    let mut group = group(c, Section::Bandwidth, Peer::Cudarc);
    for row in rows::section_rows(Section::Bandwidth) {
        if row.key == "d2d" {
            let setup = || -> Result<_, DriverError> {
                let stream = ctx.new_stream()?;
                let src = stream.clone_htod(&vec![1u8; bytes])?;
                let dst = stream.alloc_zeros::<u8>(bytes)?;
                stream.synchronize()?;
                Ok((stream, src, dst))
            };
            bench_row(&mut group, row, setup, |(stream, src, dst), k| {
                let start = Instant::now();
                for _ in 0..k {
                    stream.memcpy_dtod(src, dst)?;
                    stream.synchronize()?;
                }
                Ok(start.elapsed())
            });
            continue;
        }
        let (direction, kind) = row.key.split_once('_').expect("copy keys are <direction>_<kind>");
        let upload = direction == "h2d";
        let flags = match kind {
            "pageable" => None,
            "pinned" => Some(0),
            "wc" => Some(sys::CU_MEMHOSTALLOC_WRITECOMBINED),
            _ => continue, // no host-register wrapper in cudarc's safe API
        };
        let setup = move || -> Result<_, DriverError> {
            let stream = ctx.new_stream()?;
            let device = stream.clone_htod(&vec![1u8; bytes])?;
            let host = match flags {
                None => Err(vec![1u8; bytes]),
                Some(flags) => {
                    // SAFETY: every byte is written below before any copy reads it.
                    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, flags)? };
                    pinned.as_mut_slice()?.fill(1);
                    Ok(pinned)
                }
            };
            stream.synchronize()?;
            Ok((stream, device, host))
        };
        bench_row(&mut group, row, setup, move |(stream, device, host), k| {
            let start = Instant::now();
            for _ in 0..k {
                match (upload, &mut *host) {
                    (true, Ok(pinned)) => stream.memcpy_htod(pinned, device)?,
                    (true, Err(pageable)) => stream.memcpy_htod(pageable, device)?,
                    (false, Ok(pinned)) => stream.memcpy_dtoh(device, pinned)?,
                    (false, Err(pageable)) => stream.memcpy_dtoh(device, pageable)?,
                }
                stream.synchronize()?;
            }
            Ok(start.elapsed())
        });
    }
    group.finish();
}
