//! `ResourceBuffer<T>` and `ResourceHostBuffer<T>`: typed buffers that free through the resource
//! that allocated them, the first of device or managed memory, the second of pinned host memory.

use super::{MemoryKind, MemoryResource};
use crate::device::Device;
use crate::error::{CudaError, ErrorKind, Result};
use crate::maybe_owned::MaybeOwned;
use crate::memory::sealed::{Owner, Residence, UnseenUsers};
use crate::memory::{DeviceMemory, StreamOrdered};
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

/// `len` elements of device or managed memory from a [`MemoryResource`], ordered on a stream,
/// freed through the same resource on that stream when dropped. Pinned host memory from a
/// resource is a [`ResourceHostBuffer`].
///
/// Resource and stream are borrowed (`&resource, &stream`: no reference counting per buffer) or
/// owned (`resource.clone(), stream.clone()`: a `ResourceBuffer<'static, T>`); see
/// [`MaybeOwned`].
///
/// Device views are [`as_slice`](Self::as_slice) / [`as_mut_slice`](Self::as_mut_slice), as on
/// every device owner; managed memory also has host slices (`host`).
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
/// let mut view = scratch.as_mut_slice();
/// stream.scope(|s| s.set_bytes(&mut view, 0))??;
/// # Ok(()) }
/// ```
pub struct ResourceBuffer<'a, T: Pod>(Allocation<'a, T>);

/// `len` elements of pinned host memory from a [`MemoryResource`] (one whose
/// [`kind`](MemoryResource::kind) is [`MemoryKind::PinnedHost`]), ordered on a stream, freed
/// through the same resource on that stream when dropped. The host reaches it through `host` /
/// `host_mut`, which wait for the stream first: the resource may hand out memory that work queued
/// there before the allocation still uses.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::resource::{PinnedResource, ResourceHostBuffer};
/// use cuda_mem::Stream;
/// use std::sync::Arc;
/// let stream = Stream::non_blocking()?;
/// let mut staging = ResourceHostBuffer::<f32>::zeroed(Arc::new(PinnedResource::new(Default::default())), &stream, 1024)?;
/// staging.host_mut()?.fill(1.0);
/// # Ok(()) }
/// ```
pub struct ResourceHostBuffer<'a, T: Pod>(Allocation<'a, T>);

/// What both owners hold: the allocation, the resource and stream it is freed through, and the
/// other streams that used it.
struct Allocation<'a, T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    /// The resource's kind, asked once (a resource promises it never changes).
    kind: MemoryKind,
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
// SAFETY: as for `ResourceBuffer`: the same allocation, host memory only.
unsafe impl<T: Pod> Send for ResourceHostBuffer<'_, T> {}
// SAFETY: shared access only gives `&[T]`, which other threads may read.
unsafe impl<T: Pod> Sync for ResourceHostBuffer<'_, T> {}

impl<'a, T: Pod> Allocation<'a, T> {
    /// # Safety
    /// As for [`ResourceBuffer::uninit`].
    unsafe fn uninit(
        resource: MaybeOwned<'a, Arc<dyn MemoryResource>>,
        stream: MaybeOwned<'a, Stream>,
        len: usize,
        owner: &'static str,
        host: bool,
    ) -> Result<Self> {
        let kind = resource.kind();
        if (kind == MemoryKind::PinnedHost) != host {
            let why = if host {
                "device and managed memory from a resource is a ResourceBuffer"
            } else {
                "pinned host memory from a resource is a ResourceHostBuffer"
            };
            return Err(CudaError::new(ErrorKind::InvalidArgument(why), format!("{owner} over {kind:?} memory")));
        }
        // A resource may record events on the stream or keep the block under it.
        stream.require_orderable(owner)?;
        let bytes = raw::byte_len::<T>(len, owner)?;
        let uses = StreamUses::new();
        if bytes == 0 {
            return Ok(Self { ptr: NonNull::dangling(), len, kind, resource, stream, uses });
        }
        let call = stream.call()?;
        let ptr: NonNull<T> = resource.allocate(bytes, call.stream_ref())?.cast();
        if !ptr.as_ptr().is_aligned() {
            // SAFETY: just allocated from `resource` with `bytes`, never used.
            unsafe { resource.deallocate(ptr.cast(), bytes, call.stream_ref()) };
            return Err(misaligned_error::<T>(ptr.as_ptr() as usize, owner));
        }
        drop(call);
        Ok(Self { ptr, len, kind, resource, stream, uses })
    }

    /// Zeroes every byte: in stream order for device and managed memory, on the host for pinned
    /// memory.
    fn zero(&mut self) -> Result<()> {
        let bytes = self.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        match self.kind {
            MemoryKind::PinnedHost => {
                // Memory the resource reuses may still be in use by work queued on the stream.
                self.stream.synchronize()?;
                // SAFETY: `bytes` of host memory owned by this buffer alone, no work on it left.
                unsafe { std::ptr::write_bytes(self.ptr.as_ptr().cast::<u8>(), 0, bytes) };
            }
            MemoryKind::Device | MemoryKind::Managed => {
                let call = self.stream.call()?;
                // SAFETY: `bytes` of device-accessible memory owned by this buffer, in stream order.
                unsafe { raw::memory::set_async(self.ptr.as_ptr().cast(), 0, bytes, call.as_raw())? };
            }
        }
        Ok(())
    }

    /// Size in bytes (no overflow: the allocation of this size succeeded).
    fn size_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    fn require(&self, ok: bool, what: &'static str) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(CudaError::new(ErrorKind::InvalidArgument(what), format!("{:?} memory", self.kind)))
        }
    }

    fn device(&self) -> Device {
        self.resource.device().unwrap_or(self.stream.device())
    }

    fn use_on(&mut self, other: &Stream, operation: &'static str) -> Result<()> {
        self.uses.use_on(&self.stream, other, operation)
    }

    fn free_on(&mut self, stream: &Stream, operation: &'static str) -> Result<()> {
        // Resources may key reuse by stream handle, which names one stream on its device only.
        if stream.device() != self.stream.device() {
            let kind = ErrorKind::InvalidArgument("the stream belongs to another device than the buffer's");
            let site = format!("{operation}: a stream of {} for a buffer on {}", stream.device(), self.stream.device());
            return Err(CudaError::new(kind, site));
        }
        self.uses.move_free(&mut self.stream, stream, operation)?;
        self.free()
    }

    fn free(&mut self) -> Result<()> {
        let result = self.release();
        self.len = 0; // nothing left for drop to free
        result
    }

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

    /// Waits for the buffer's stream, and refuses device memory, and managed memory on a device
    /// where the host may not touch it while any kernel runs (no `concurrentManagedAccess`).
    fn before_host_access(&self) -> Result<()> {
        self.require(self.kind != MemoryKind::Device, "device memory has no host view")?;
        if self.kind == MemoryKind::Managed
            && let Some(device) = self.resource.device()
        {
            crate::managed::require_concurrent_access(device.concurrent_managed_access()?)?;
        }
        self.stream.synchronize()
    }

    host_views!();
}

impl<T: Pod> Drop for Allocation<'_, T> {
    fn drop(&mut self) {
        raw::quiet(self.release());
    }
}

/// What both owners spell the same way, inside their `impl`.
macro_rules! resource_owner {
    ($owner:literal) => {
        /// Allocates `len` elements from `resource`, ordered on `stream`, uninitialised. A
        /// resource of the other owner's memory, the per-thread stream and a capture's stream are
        /// refused ([`ErrorKind::InvalidArgument`]).
        ///
        /// # Safety
        /// The contents are unspecified until written; the caller must write every element (in
        /// stream order) before reading it.
        pub unsafe fn uninit(
            resource: impl Into<MaybeOwned<'a, Arc<dyn MemoryResource>>>,
            stream: impl Into<MaybeOwned<'a, Stream>>,
            len: usize,
        ) -> Result<Self> {
            // SAFETY: the caller's promise, passed on.
            Ok(Self(unsafe { Allocation::uninit(resource.into(), stream.into(), len, $owner, Self::HOST)? }))
        }

        /// Allocates and zeroes: in stream order on `stream` for device and managed memory (so
        /// work on other streams, and blocking copies, must be ordered after `stream`), on the
        /// host after `stream` for pinned memory.
        pub fn zeroed(
            resource: impl Into<MaybeOwned<'a, Arc<dyn MemoryResource>>>,
            stream: impl Into<MaybeOwned<'a, Stream>>,
            len: usize,
        ) -> Result<Self> {
            // SAFETY: every byte is written below before anything can read it.
            let mut buffer = unsafe { Self::uninit(resource, stream, len)? };
            buffer.0.zero()?;
            Ok(buffer)
        }

        /// Number of elements.
        pub fn len(&self) -> usize {
            self.0.len
        }

        /// True when the buffer has no elements.
        pub fn is_empty(&self) -> bool {
            self.0.len == 0
        }

        /// The resource it came from.
        pub fn resource(&self) -> &Arc<dyn MemoryResource> {
            &self.0.resource
        }

        /// The stream it is ordered on and freed on.
        pub fn stream(&self) -> &Stream {
            &self.0.stream
        }

        /// Prepares use on `other`: `other` waits (on the device) for the work queued on the
        /// buffer's stream so far, including the zeroing, and the free will wait for the work
        /// queued on `other` up to the free. The per-thread stream and a capture's stream are
        /// refused ([`ErrorKind::InvalidArgument`]).
        pub fn use_on(&mut self, other: &Stream) -> Result<()> {
            self.0.use_on(other, concat!($owner, "::use_on"))
        }

        /// Frees through the resource on `stream` instead of the buffer's own, ordered after the
        /// buffer's stream and every stream passed to `use_on`. The per-thread stream, a
        /// capture's stream and a stream of another device than the buffer's are refused
        /// ([`ErrorKind::InvalidArgument`]; the buffer is then dropped, freed on its own stream).
        /// When the users' work cannot be ordered, even by waiting on the host, the error is
        /// returned and the memory stays allocated for good rather than be freed under that work.
        pub fn free_on(mut self, stream: &Stream) -> Result<()> {
            self.0.free_on(stream, concat!($owner, "::free_on"))
        }

        /// Frees through the resource now, on the buffer's stream after every stream passed to
        /// `use_on`, and reports whether the users' work could be ordered (drop ignores it; the
        /// resource's own free reports nothing).
        pub fn free(mut self) -> Result<()> {
            self.0.free()
        }

        /// The host's view, after waiting for the buffer's stream (device memory has none:
        /// [`ErrorKind::InvalidArgument`]; managed memory needs `concurrentManagedAccess`).
        pub fn host(&self) -> Result<&[T]> {
            self.0.host()
        }

        /// The host's exclusive view; see `host`.
        pub fn host_mut(&mut self) -> Result<&mut [T]> {
            self.0.host_mut()
        }
    };
}

impl<'a, T: Pod> ResourceBuffer<'a, T> {
    const HOST: bool = false;

    resource_owner!("ResourceBuffer");

    /// A device view, ordered on the buffer's stream.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        // SAFETY: device or managed memory (checked at construction), borrowed from `self`, which
        // keeps the allocation alive; its zeroing is pending on the stream the view names.
        unsafe { DeviceSlice::ordered_on(self.0.ptr.as_ptr(), self.0.len, &self.0.stream) }
    }

    /// An exclusive device view, ordered on the buffer's stream.
    pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, T> {
        // SAFETY: borrowed exclusively from `self`; otherwise as in `as_slice`.
        unsafe { DeviceSliceMut::ordered_on(self.0.ptr.as_ptr(), self.0.len, &self.0.stream) }
    }

    /// [`as_slice`](Self::as_slice) under its name before 2026-12-03.
    #[deprecated(since = "0.1.0", note = "use `as_slice`, the device view's name on every owner")]
    pub fn device_slice(&self) -> Result<DeviceSlice<'_, T>> {
        Ok(self.as_slice())
    }

    /// [`as_mut_slice`](Self::as_mut_slice) under its name before 2026-12-03.
    #[deprecated(since = "0.1.0", note = "use `as_mut_slice`, the device view's name on every owner")]
    pub fn device_slice_mut(&mut self) -> Result<DeviceSliceMut<'_, T>> {
        Ok(self.as_mut_slice())
    }

    /// Whether the memory is managed (host-accessible too) rather than device memory.
    pub fn is_managed(&self) -> bool {
        self.0.kind == MemoryKind::Managed
    }

    /// Copies the contents into a `Vec` (blocking, after the buffer's stream).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_slice().to_vec()
    }
}

impl<'a, T: Pod> ResourceHostBuffer<'a, T> {
    const HOST: bool = true;

    resource_owner!("ResourceHostBuffer");

    /// The address of the first element (dangling when empty), for exports.
    #[cfg(feature = "dlpack")]
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.0.ptr.as_ptr()
    }

    /// Copies the contents into a `Vec`, after waiting for the buffer's stream.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.host().map(<[T]>::to_vec)
    }
}

impl<T: Pod> std::fmt::Debug for ResourceBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = &self.0;
        f.debug_struct("ResourceBuffer")
            .field("ptr", &a.ptr)
            .field("len", &a.len)
            .field("resource", &a.resource)
            .finish()
    }
}

impl<T: Pod> std::fmt::Debug for ResourceHostBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = &self.0;
        f.debug_struct("ResourceHostBuffer")
            .field("ptr", &a.ptr)
            .field("len", &a.len)
            .field("resource", &a.resource)
            .finish()
    }
}

// A free through a resource in stream order does not wait for streams it does not know of:
// device memory is used by streams of its device, managed memory by any device's.
impl<T: Pod> Owner for ResourceBuffer<'_, T> {
    fn residence(&self) -> Residence {
        if self.is_managed() { Residence::Managed } else { Residence::Device }
    }
    fn producer(&self) -> Option<&Stream> {
        Some(&self.0.stream)
    }
    fn unseen_users(&self) -> UnseenUsers {
        if self.is_managed() { UnseenUsers::AnyDevice } else { UnseenUsers::Device(self.0.stream.device()) }
    }
}

impl<T: Pod> DeviceMemory for ResourceBuffer<'_, T> {
    forward_device_views!();

    fn device(&self) -> Device {
        self.0.device()
    }
}

forward_stream_ordered!(ResourceBuffer);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::testing::HostResource;
    use crate::stream::tests::unused_stream;

    /// A resource that says its memory is device memory; never asked for any here.
    #[derive(Debug)]
    struct DeviceKind;

    // SAFETY: never allocates.
    unsafe impl MemoryResource for DeviceKind {
        fn allocate(&self, _: usize, _: crate::resource::StreamRef<'_>) -> Result<NonNull<u8>> {
            unreachable!("refused before allocating")
        }
        unsafe fn deallocate(&self, _: NonNull<u8>, _: usize, _: crate::resource::StreamRef<'_>) {}
        fn kind(&self) -> MemoryKind {
            MemoryKind::Device
        }
    }

    /// Each owner takes one kind of memory, so `ResourceBuffer`'s device views cannot fail: the
    /// other kind is refused before anything is allocated, with an error naming the right owner.
    #[test]
    fn each_resource_owner_refuses_the_other_kind_before_allocating() {
        let host = Arc::new(HostResource::default());
        let stream = unused_stream();
        // SAFETY: refused before any memory exists.
        let err = unsafe { ResourceBuffer::<u32>::uninit(host.clone(), &stream, 16) }.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains("ResourceHostBuffer")), "{err}");
        assert!(err.to_string().contains("ResourceBuffer over PinnedHost memory"), "{err}");
        assert_eq!(host.live_bytes.load(std::sync::atomic::Ordering::Relaxed), 0);
        // SAFETY: as above.
        let err = unsafe { ResourceHostBuffer::<u32>::uninit(Arc::new(DeviceKind), &stream, 16) }.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains("is a ResourceBuffer")), "{err}");
        assert!(err.to_string().contains("ResourceHostBuffer over Device memory"), "{err}");
    }
}
