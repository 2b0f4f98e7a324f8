//! `ResourceBuffer<T>`: a typed buffer that frees through the resource that allocated it.

use super::{MemoryKind, MemoryResource};
use crate::error::{CudaError, ErrorKind, Result};
use crate::maybe_owned::MaybeOwned;
use crate::raw::{self, misaligned_error};
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream::Stream;
use crate::stream::uses::StreamUses;
use bytemuck::Pod;
use std::ptr::NonNull;
use std::sync::Arc;

/// A resource owned by the buffer (the `Arc` moves in).
impl<'a> From<Arc<dyn MemoryResource>> for MaybeOwned<'a, Arc<dyn MemoryResource>> {
    fn from(value: Arc<dyn MemoryResource>) -> Self {
        Self::Owned(value)
    }
}

/// An `Arc` of a concrete resource, owned as the `Arc<dyn MemoryResource>` buffers hold (the
/// unsizing coercion a plain parameter would apply).
impl<'a, R: MemoryResource + 'static> From<Arc<R>> for MaybeOwned<'a, Arc<dyn MemoryResource>> {
    fn from(value: Arc<R>) -> Self {
        Self::Owned(value)
    }
}

/// `len` elements from a [`MemoryResource`], ordered on a stream, freed through the same resource
/// on that stream when dropped.
///
/// Resource and stream are borrowed (`&resource, &stream`: no reference counting per buffer) or
/// owned (`resource.clone(), stream.clone()`: a `ResourceBuffer<'static, T>`); see
/// [`MaybeOwned`].
///
/// Device and managed memory give device views ([`ResourceBuffer::as_slice`]); pinned host
/// and managed memory give host slices (`host`).
///
/// Use on other streams is ordered with events, as for [`StreamBuffer`](crate::StreamBuffer):
/// [`ResourceBuffer::use_on`] makes the other stream wait for the buffer's and remembers it, so
/// the free waits for its work too; [`ResourceBuffer::free_on`] frees through the resource on
/// another stream.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::resource::{default_resource, ResourceBuffer};
/// use cuda_mem::{Device, Stream};
/// let stream = Stream::non_blocking()?;
/// let resource = default_resource(Device::current()?)?; // the device's retaining pool
/// let mut scratch = ResourceBuffer::<f32>::zeroed(&resource, &stream, 1 << 20)?;
/// let mut view = scratch.as_mut_slice()?;
/// stream.scope(|s| s.set_bytes(&mut view, 0))??;
/// # Ok(()) }
/// ```
pub struct ResourceBuffer<'a, T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    resource: MaybeOwned<'a, Arc<dyn MemoryResource>>,
    stream: MaybeOwned<'a, Stream>,
    /// Other streams that used the memory: the free waits for each of them.
    uses: StreamUses,
}

// SAFETY: owns its allocation exclusively, like `Vec<T>` (T: Pod is Send + Sync). The thread it
// moves to may read and write it through host slices and views and free it, through the resource
// on the buffer's stream, which is never the per-thread stream (refused at construction); the
// legacy stream is resolved against its device on any thread. Resources and streams are Sync.
unsafe impl<T: Pod> Send for ResourceBuffer<'_, T> {}
// SAFETY: shared access only gives shared views and `&[T]`, which other threads may read.
unsafe impl<T: Pod> Sync for ResourceBuffer<'_, T> {}

debug_fields!(ResourceBuffer<'a>: ptr, len, resource);

impl<'a, T: Pod> ResourceBuffer<'a, T> {
    /// Allocates `len` elements from `resource`, ordered on `stream`, uninitialised.
    ///
    /// # Safety
    /// The contents are unspecified until written; the caller must write every element (in
    /// stream order) before reading it.
    pub unsafe fn uninit(
        resource: impl Into<MaybeOwned<'a, Arc<dyn MemoryResource>>>,
        stream: impl Into<MaybeOwned<'a, Stream>>,
        len: usize,
    ) -> Result<Self> {
        let (resource, stream) = (resource.into(), stream.into());
        // A resource may record events on the stream or keep the block under it.
        stream.require_orderable("ResourceBuffer")?;
        let bytes = raw::byte_len::<T>(len, "ResourceBuffer")?;
        let uses = StreamUses::new();
        if bytes == 0 {
            return Ok(Self { ptr: NonNull::dangling(), len, resource, stream, uses });
        }
        let call = stream.call()?;
        let ptr: NonNull<T> = resource.allocate(bytes, call.stream_ref())?.cast();
        if !ptr.as_ptr().is_aligned() {
            // SAFETY: just allocated from `resource` with `bytes`, never used.
            unsafe { resource.deallocate(ptr.cast(), bytes, call.stream_ref()) };
            return Err(misaligned_error::<T>(ptr.as_ptr() as usize, "ResourceBuffer"));
        }
        drop(call);
        Ok(Self { ptr, len, resource, stream, uses })
    }

    /// Allocates and zeroes: in stream order on `stream` for device and managed memory (so work
    /// on other streams, and blocking copies, must be ordered after `stream`), on the host for
    /// pinned memory.
    pub fn zeroed(
        resource: impl Into<MaybeOwned<'a, Arc<dyn MemoryResource>>>,
        stream: impl Into<MaybeOwned<'a, Stream>>,
        len: usize,
    ) -> Result<Self> {
        // SAFETY: every byte is written below before anything can read it.
        let buffer = unsafe { Self::uninit(resource, stream, len)? };
        let bytes = buffer.size_bytes();
        if bytes == 0 {
            return Ok(buffer);
        }
        match buffer.resource.kind() {
            MemoryKind::PinnedHost => {
                // SAFETY: `bytes` of host memory owned by this buffer alone.
                unsafe { std::ptr::write_bytes(buffer.ptr.as_ptr().cast::<u8>(), 0, bytes) };
            }
            MemoryKind::Device | MemoryKind::Managed => {
                let call = buffer.stream.call()?;
                // SAFETY: `bytes` of device-accessible memory owned by this buffer, in stream order.
                unsafe { raw::memory::set_async(buffer.ptr.as_ptr().cast(), 0, bytes, call.as_raw())? };
            }
        }
        Ok(buffer)
    }

    element_count!();

    /// The resource it came from.
    pub fn resource(&self) -> &Arc<dyn MemoryResource> {
        &self.resource
    }

    /// The stream it is ordered on and freed on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    fn require(&self, ok: bool, what: &'static str) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(CudaError::new(ErrorKind::InvalidArgument(what), format!("{:?} memory", self.resource.kind())))
        }
    }

    /// A device view (device and managed memory), ordered on the buffer's stream; pinned host
    /// memory has none ([`ErrorKind::InvalidArgument`]).
    pub fn as_slice(&self) -> Result<DeviceSlice<'_, T>> {
        self.require_device_view()?;
        // SAFETY: borrowed from `self`, which keeps the allocation alive; its zeroing is pending on
        // the stream the view names.
        Ok(unsafe { DeviceSlice::ordered_on(self.ptr.as_ptr(), self.len, &self.stream) })
    }

    /// An exclusive device view (device and managed memory), ordered on the buffer's stream.
    pub fn as_mut_slice(&mut self) -> Result<DeviceSliceMut<'_, T>> {
        self.require_device_view()?;
        // SAFETY: borrowed exclusively from `self`; ordered as in `as_slice`.
        Ok(unsafe { DeviceSliceMut::ordered_on(self.ptr.as_ptr(), self.len, &self.stream) })
    }

    /// [`as_slice`](Self::as_slice) under its name before 2026-12-03.
    #[deprecated(since = "0.1.0", note = "use `as_slice`, the device view's name on every owner")]
    pub fn device_slice(&self) -> Result<DeviceSlice<'_, T>> {
        self.as_slice()
    }

    /// [`as_mut_slice`](Self::as_mut_slice) under its name before 2026-12-03.
    #[deprecated(since = "0.1.0", note = "use `as_mut_slice`, the device view's name on every owner")]
    pub fn device_slice_mut(&mut self) -> Result<DeviceSliceMut<'_, T>> {
        self.as_mut_slice()
    }

    fn require_device_view(&self) -> Result<()> {
        self.require(self.resource.kind() != MemoryKind::PinnedHost, "pinned host memory has no device view here")
    }

    /// The address of the first element (dangling when empty), for exports.
    #[cfg(feature = "dlpack")]
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Prepares use on `other`: `other` waits (on the device) for the work queued on the
    /// buffer's stream so far, including the zeroing, and the free will wait for the work queued
    /// on `other` up to the free. The per-thread stream and a capture's stream are refused
    /// ([`ErrorKind::InvalidArgument`]).
    pub fn use_on(&mut self, other: &Stream) -> Result<()> {
        self.uses.use_on(&self.stream, other, "ResourceBuffer::use_on")
    }

    /// Frees through the resource on `stream` instead of the buffer's own, ordered after the
    /// buffer's stream and every stream passed to `use_on`. The per-thread stream, a capture's
    /// stream and a stream of another device than the buffer's are refused
    /// ([`ErrorKind::InvalidArgument`]; the buffer is then dropped, freed on its own stream).
    /// When the users' work cannot be ordered, even by waiting on the host, the error is returned
    /// and the memory stays allocated for good rather than be freed under that work.
    pub fn free_on(mut self, stream: &Stream) -> Result<()> {
        // Resources may key reuse by stream handle, which names one stream on its device only.
        if stream.device() != self.stream.device() {
            let kind = ErrorKind::InvalidArgument("the stream belongs to another device than the buffer's");
            let site = format!(
                "ResourceBuffer::free_on: a stream of {} for a buffer on {}",
                stream.device(),
                self.stream.device()
            );
            return Err(CudaError::new(kind, site));
        }
        self.uses.move_free(&mut self.stream, stream, "ResourceBuffer::free_on")?;
        self.free()
    }

    free_now!(
        "Frees through the resource now, on the buffer's stream after every stream passed to `use_on`, and reports whether the users' work could be ordered (drop ignores it; the resource's own free reports nothing)."
    );

    fn release(&mut self) -> Result<()> {
        let bytes = self.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        // On failure (the users' work cannot be ordered, or a broken context) the memory stays
        // allocated rather than freed under pending work.
        self.uses.order_before(&self.stream)?;
        let call = self.stream.call()?;
        // SAFETY: allocated from this resource with `bytes`, freed once (the length is cleared or
        // the buffer gone after), ordered on a stream that is not being captured (refused at
        // construction and by `free_on`) after every known use; scopes that used it have ended.
        unsafe { self.resource.deallocate(self.ptr.cast(), bytes, call.stream_ref()) };
        Ok(())
    }

    /// Waits for the buffer's stream, and refuses managed memory on a device where the host may
    /// not touch it while any kernel runs (no `concurrentManagedAccess`).
    fn before_host_access(&self) -> Result<()> {
        let kind = self.resource.kind();
        self.require(kind != MemoryKind::Device, "device memory has no host view")?;
        if kind == MemoryKind::Managed
            && let Some(device) = self.resource.device()
        {
            crate::managed::require_concurrent_access(device.concurrent_managed_access()?)?;
        }
        self.stream.synchronize()
    }

    host_views!();

    /// Copies the contents into a `Vec`, after waiting for this buffer's stream.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        match self.resource.kind() {
            MemoryKind::PinnedHost => self.host().map(<[T]>::to_vec),
            MemoryKind::Device | MemoryKind::Managed => self.as_slice()?.to_vec(),
        }
    }
}

impl<T: Pod> Drop for ResourceBuffer<'_, T> {
    fn drop(&mut self) {
        raw::quiet(self.release());
    }
}
