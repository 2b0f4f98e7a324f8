//! The cuda-mem side of each allocation row, shared by `families` (criterion, against the raw
//! C++ program) and `paired` (interleaved with the same C++ batches in one process). Like the C++
//! loops, each pair is an allocation and its free with nothing in between: the runtime calls
//! cannot be optimised away, so no `black_box` is needed (it would store the buffer to memory).

use cuda_mem::{CudaError, Device, DeviceBuffer, HostAllocFlags, ManagedBuffer, MemPool, PinnedBuffer, PoolProps};
use cuda_mem::{Stream, StreamBuffer};
use cuda_mem_bench::rows::Row;
use std::time::{Duration, Instant};

/// The stream and pool of a stream-ordered row, configured as the row says.
pub(crate) struct Ordered {
    pub(crate) stream: Stream,
    pub(crate) pool: MemPool,
    /// `cudaMallocFromPoolAsync` from `pool` (a created pool) instead of `cudaMallocAsync`.
    pub(crate) from_pool: bool,
    pub(crate) sync_each: bool,
}

/// One allocation row, ready to run batches.
pub(crate) struct AllocRow {
    pub(crate) family: &'static str,
    pub(crate) bytes: usize,
    pub(crate) ordered: Option<Ordered>,
}

/// The `cudaHostAlloc` flags of the pinned families (`malloc_host` is `cudaMallocHost`).
pub(crate) fn host_flags(family: &str) -> Option<HostAllocFlags> {
    Some(match family {
        "malloc_host" => HostAllocFlags::empty(),
        "host_alloc_portable" => HostAllocFlags::PORTABLE,
        "host_alloc_mapped" => HostAllocFlags::MAPPED,
        "host_alloc_wc" => HostAllocFlags::WRITE_COMBINED,
        _ => return None,
    })
}

impl AllocRow {
    /// Creates what the row needs (stream, pool with its release threshold), untimed.
    pub(crate) fn setup(row: &Row) -> Result<Self, CudaError> {
        let family = row.family();
        let ordered = match family {
            "async_default_sync" | "async_retain_sync" | "async_retain_nosync" => {
                let pool = MemPool::retaining(Device::current()?)?; // retaining (usize::MAX)
                if family == "async_default_sync" {
                    pool.set_release_threshold(0)?; // the driver's default
                }
                Some(Ordered {
                    stream: Stream::non_blocking()?,
                    pool,
                    from_pool: false,
                    sync_each: family != "async_retain_nosync",
                })
            }
            "pool_odd" => Some(Ordered {
                stream: Stream::non_blocking()?,
                pool: MemPool::new(PoolProps::new(Device::current()?))?, // retains (usize::MAX)
                from_pool: true,
                sync_each: false,
            }),
            _ => None,
        };
        Ok(Self { family, bytes: row.bytes as usize, ordered })
    }

    /// K pairs through cuda-mem; returns the time they took.
    pub(crate) fn cuda_mem(&self, k: u32) -> Result<Duration, CudaError> {
        let bytes = self.bytes;
        if let Some(o) = &self.ordered {
            let start = Instant::now();
            for _ in 0..k {
                // SAFETY: dropped (cudaFreeAsync) without being read.
                let buffer = unsafe {
                    if o.from_pool {
                        StreamBuffer::<u8>::uninit_from(&o.pool, &o.stream, bytes)?
                    } else {
                        StreamBuffer::<u8>::uninit(&o.stream, bytes)?
                    }
                };
                drop(buffer);
                if o.sync_each {
                    o.stream.synchronize()?;
                }
            }
            if !o.sync_each {
                o.stream.synchronize()?;
            }
            return Ok(start.elapsed());
        }
        let start = Instant::now();
        match self.family {
            "malloc" => {
                for _ in 0..k {
                    // SAFETY: dropped (cudaFree) without being read.
                    drop(unsafe { DeviceBuffer::<u8>::uninit(bytes)? });
                }
            }
            // ManagedBuffer only has zeroed constructors: the CPU writes every byte, and the C++
            // batch does the same (cudaMallocManaged + memset + cudaFree).
            "managed" => {
                for _ in 0..k {
                    drop(ManagedBuffer::<u8>::zeroed(bytes)?);
                }
            }
            family => {
                let flags = host_flags(family).unwrap_or_else(|| unreachable!("alloc row family {family}"));
                for _ in 0..k {
                    // SAFETY: dropped (cudaFreeHost) without being read.
                    drop(unsafe { PinnedBuffer::<u8>::uninit(bytes, flags)? });
                }
            }
        }
        Ok(start.elapsed())
    }
}

impl Drop for AllocRow {
    fn drop(&mut self) {
        // Leave the default pool as cuda-mem hands it out (retaining), whatever ran.
        if let Some(o) = &self.ordered
            && !o.from_pool
        {
            let _ = o.pool.set_release_threshold(usize::MAX);
        }
    }
}
