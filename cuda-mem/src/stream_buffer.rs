//! `StreamBuffer<T>`: stream-ordered device memory (`cudaMallocAsync` / `cudaMallocFromPoolAsync`),
//! freed with `cudaFreeAsync` on its stream.

use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::maybe_owned::MaybeOwned;
use crate::memory::sealed::{Owner, Residence, UnseenUsers};
use crate::memory::{DeviceMemory, StreamOrdered};
use crate::pool::{MemPool, retaining_pool};
use crate::raw::{self, misaligned_error};
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream::Stream;
use crate::stream::uses::StreamUses;
use bytemuck::Pod;
use std::ffi::c_void;
use std::ptr::NonNull;

/// `len` elements of device memory allocated in stream order on a stream, from cuda-mem's
/// retaining pool of the stream's device ([`MemPool::retaining`]) or from a given [`MemPool`].
/// Dropping it queues `cudaFreeAsync` on that stream: the memory returns to its pool after the
/// work queued so far, without blocking the host. The default pool keeps freed memory for reuse,
/// so a synchronize between steps does not hand it back to the driver (the release-threshold trap
/// of the driver's own pools); pass [`MemPool::driver_default`] to `*_from` to use the driver's
/// pool as it is.
///
/// Views carry the buffer's stream: blocking copies wait for it, and scopes on other streams
/// make their stream wait for it, so nothing reads the memory before its zeroing.
///
/// The buffer borrows its stream and pool (`&stream`: no cost beyond the runtime calls) or owns
/// handles to them (`stream.clone()`: a `StreamBuffer<'static, T>`), see [`MaybeOwned`]. A
/// created pool may even be dropped first: the driver releases a destroyed pool's memory only
/// after its last allocation is freed (`cudaMemPoolDestroy`).
///
/// Use on other streams is ordered with events: [`StreamBuffer::use_on`] makes the other stream
/// wait for the allocation and records it, so the free later waits for that stream's work too.
/// Freeing on another stream is [`StreamBuffer::free_on`]. Scopes on any stream synchronize
/// before their borrows end, so work queued through a scope never races with the free.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Stream, StreamBuffer};
/// let (a, b) = (Stream::non_blocking()?, Stream::non_blocking()?);
/// let mut temp = StreamBuffer::<u32>::zeroed(&a, 1 << 20)?; // allocated and zeroed on `a`
/// temp.use_on(&b)?; // `b` waits for the allocation; the free will wait for `b`
/// let mut view = temp.as_mut_slice();
/// b.scope(|s| s.set_bytes(&mut view, 0xff))??;
/// drop(temp); // cudaFreeAsync on `a`, after `b`'s work
/// # Ok(()) }
/// ```
///
/// A buffer cannot outlive a stream or pool it borrows:
///
/// ```compile_fail,E0597
/// use cuda_mem::{Stream, StreamBuffer};
/// let buffer = {
///     let stream = Stream::non_blocking().unwrap();
///     StreamBuffer::<u32>::zeroed(&stream, 16).unwrap()
/// }; // `stream` dropped here while still borrowed
/// # drop(buffer);
/// ```
pub struct StreamBuffer<'a, T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    stream: MaybeOwned<'a, Stream>,
    /// The pool the memory came from, for [`StreamBuffer::pool`] and error reports.
    pool: MaybeOwned<'a, MemPool>,
    /// Other streams that used the memory: the free waits for each of them.
    uses: StreamUses,
}

// SAFETY: the buffer owns its allocation; the host never dereferences it. The thread it moves to
// may write it through views and free it, on the buffer's own stream, which is never the
// thread-relative per-thread stream (refused at construction): `Stream::call` resolves the legacy
// stream against the stream's device on any thread. Stream and pool handles are Send + Sync.
unsafe impl<T: Pod> Send for StreamBuffer<'_, T> {}
// SAFETY: `&StreamBuffer` only hands out shared views, which other threads may read through
// runtime calls ordered after the buffer's stream.
unsafe impl<T: Pod> Sync for StreamBuffer<'_, T> {}

debug_fields!(StreamBuffer<'a>: ptr, len, stream, pool);

impl<'a, T: Pod> StreamBuffer<'a, T> {
    /// Allocates on `stream` (borrowed `&Stream` or owned `Stream`) from cuda-mem's retaining
    /// pool of the stream's device ([`MemPool::retaining`], `cudaMallocFromPoolAsync`),
    /// uninitialised.
    ///
    /// # Safety
    /// The contents are unspecified until written; the caller must write every element (in stream
    /// order) before reading it.
    #[inline]
    pub unsafe fn uninit(stream: impl Into<MaybeOwned<'a, Stream>>, len: usize) -> Result<Self> {
        let stream = stream.into();
        let pool = retaining_pool(stream.device())?;
        // SAFETY: forwarded from the caller.
        unsafe { Self::uninit_from(pool, stream, len) }
    }

    /// Allocates on `stream` from `pool` (`cudaMallocFromPoolAsync`), uninitialised. Any size is
    /// accepted; beyond the pool's `max_size` the error is out-of-memory.
    ///
    /// # Safety
    /// As for [`StreamBuffer::uninit`].
    #[inline]
    pub unsafe fn uninit_from(
        pool: impl Into<MaybeOwned<'a, MemPool>>,
        stream: impl Into<MaybeOwned<'a, Stream>>,
        len: usize,
    ) -> Result<Self> {
        let (pool, stream) = (pool.into(), stream.into());
        let bytes = stream.buffer_bytes::<T>(len, "StreamBuffer")?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        if bytes != 0 {
            let call = stream.call()?;
            // SAFETY: pool and stream handles are valid (`call` checked the stream's).
            raw =
                unsafe { raw::pools::malloc_from_pool_async(bytes, pool.as_raw(), call.as_raw(), || pool_site(&pool)) }
                    .map_err(|err| err.with_pool_stats(|| pool.stats().ok()))?;
            if !raw.cast::<T>().is_aligned() {
                return Err(misaligned::<T>(raw, bytes, call.as_raw()));
            }
        }
        Ok(Self::from_raw(raw, len, stream, pool))
    }

    /// Allocates as [`StreamBuffer::uninit`] does (cuda-mem's retaining pool of the stream's
    /// device, whatever pool is current) and zeroes in stream order (`cudaMemsetAsync`).
    pub fn zeroed(stream: impl Into<MaybeOwned<'a, Stream>>, len: usize) -> Result<Self> {
        // SAFETY: the memset below, queued before any other use on this stream, writes every byte.
        let buffer = unsafe { Self::uninit(stream, len)? };
        buffer.zero_in_stream_order()?;
        Ok(buffer)
    }

    /// Allocates from `pool` and zeroes in stream order.
    pub fn zeroed_from(
        pool: impl Into<MaybeOwned<'a, MemPool>>,
        stream: impl Into<MaybeOwned<'a, Stream>>,
        len: usize,
    ) -> Result<Self> {
        // SAFETY: as in `zeroed`.
        let buffer = unsafe { Self::uninit_from(pool, stream, len)? };
        buffer.zero_in_stream_order()?;
        Ok(buffer)
    }

    #[inline]
    fn from_raw(raw: *mut c_void, len: usize, stream: MaybeOwned<'a, Stream>, pool: MaybeOwned<'a, MemPool>) -> Self {
        let ptr = NonNull::new(raw.cast()).unwrap_or(NonNull::dangling());
        Self { ptr, len, stream, pool, uses: StreamUses::new() }
    }

    fn zero_in_stream_order(&self) -> Result<()> {
        self.set_in_stream_order(0)
    }

    fn set_in_stream_order(&self, byte: u8) -> Result<()> {
        let bytes = self.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        let call = self.stream.call()?;
        // SAFETY: the allocation holds `bytes`; the memset is ordered after it on its stream.
        unsafe { raw::memory::set_async(self.ptr.as_ptr().cast(), byte, bytes, call.as_raw()) }
    }

    /// Queues `cudaMemsetAsync` of every byte to `byte` on the buffer's stream and returns
    /// without waiting. Views name that stream, so blocking copies, scopes and the free are
    /// ordered after it.
    pub fn set_bytes_async(&mut self, byte: u8) -> Result<()> {
        self.set_in_stream_order(byte)
    }

    element_count!();

    /// The stream the memory was allocated on and will be freed on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The pool it came from.
    pub fn pool(&self) -> &MemPool {
        &self.pool
    }

    /// A shared view, ordered on the buffer's stream.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        // SAFETY: borrowed from `self`, which keeps the allocation alive; its zeroing is pending
        // on the stream the view names.
        unsafe { DeviceSlice::ordered_on(self.ptr.as_ptr(), self.len, &self.stream) }
    }

    /// An exclusive view, ordered on the buffer's stream.
    pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, T> {
        // SAFETY: borrowed exclusively from `self`; ordered as in `as_slice`.
        unsafe { DeviceSliceMut::ordered_on(self.ptr.as_ptr(), self.len, &self.stream) }
    }

    /// Prepares use on `other`: `other` waits (on the device, not the host) for the work queued
    /// on the owning stream so far, including the allocation, and the eventual free will wait for
    /// the work queued on `other` up to the free.
    /// The per-thread stream and a capture's stream are refused
    /// ([`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)).
    pub fn use_on(&mut self, other: &Stream) -> Result<()> {
        self.uses.use_on(&self.stream, other, "StreamBuffer::use_on")
    }

    /// Frees on `stream` instead of the owning one (`cudaFreeAsync`), ordered after the owning
    /// stream's work and every stream passed to `use_on`. Reports the runtime's verdict. The
    /// per-thread stream and a capture's stream are refused; the buffer is then dropped, freed
    /// on its own stream.
    pub fn free_on(mut self, stream: &Stream) -> Result<()> {
        self.uses.move_free(&mut self.stream, stream, "StreamBuffer::free_on")?;
        self.free()
    }

    free_now!("Frees on the owning stream now and reports the runtime's verdict (drop ignores it).");

    /// The free, in stream order. The common case (no other stream used the buffer, the free
    /// succeeds) is a length test and one `cudaFreeAsync`: inlined, with the rest out of line.
    #[inline]
    fn release(&mut self) -> Result<()> {
        if self.size_bytes() == 0 {
            return Ok(());
        }
        // On failure the memory stays allocated rather than freed under pending work.
        self.uses.order_before(&self.stream)?;
        let call = self.stream.call()?;
        // SAFETY: the pointer came from cudaMallocFromPoolAsync and is freed once, in stream order
        // after every known use.
        unsafe { raw::pools::free_async(self.ptr.as_ptr().cast(), call.as_raw(), self.size_bytes()) }
    }
}

impl<T: Pod> Drop for StreamBuffer<'_, T> {
    #[inline]
    fn drop(&mut self) {
        raw::quiet(self.release());
    }
}

/// Frees a fresh allocation whose address does not suit `T` and says so (pools align to at
/// least 256 bytes; only element types aligned beyond that can get here).
#[cold]
fn misaligned<T>(ptr: *mut c_void, bytes: usize, stream: raw::cudaStream_t) -> CudaError {
    // SAFETY: allocated just now on `stream` and never used.
    raw::quiet(unsafe { raw::pools::free_async(ptr, stream, bytes) });
    misaligned_error::<T>(ptr as usize, "cudaMallocFromPoolAsync")
}

/// Where a pool allocation was made, for error messages.
#[cold]
fn pool_site(pool: &MemPool) -> String {
    format!("on {}", pool.device())
}

// A free in stream order does not wait for streams it does not know of.
impl<T: Pod> Owner for StreamBuffer<'_, T> {
    fn residence(&self) -> Residence {
        Residence::Device
    }
    fn producer(&self) -> Option<&crate::stream::Stream> {
        Some(&self.stream)
    }
    fn unseen_users(&self) -> UnseenUsers {
        UnseenUsers::Device(self.pool.device())
    }
}

impl<T: Pod> DeviceMemory for StreamBuffer<'_, T> {
    forward_device_views!();

    fn device(&self) -> Device {
        self.pool.device()
    }
}

forward_stream_ordered!(StreamBuffer);
