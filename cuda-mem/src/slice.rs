//! Borrowed views of device-accessible memory: `DeviceSlice` (shared) and `DeviceSliceMut`
//! (exclusive). Every owner (device, managed, stream-ordered buffers; mapped host memory) hands
//! them out with its own lifetime, so a view cannot outlive its memory.
//!
//! A view of stream-ordered memory also names the stream its memory is ordered on (allocation,
//! zeroing, the free). Blocking operations wait for that stream first, and a scope on another
//! stream makes its stream wait for it, so no use can overtake the allocation or its zeroing.

use crate::error::{CudaError, ErrorKind, Result};
use crate::raw::memory::Direction;
use crate::raw::{self, same_len};
use crate::stream::Stream;
use bytemuck::Pod;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

/// A shared view of `len` elements of device-accessible memory, valid for `'a`.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::DeviceBuffer;
/// let buffer = DeviceBuffer::from_slice(&[1u16, 2, 3, 4])?;
/// let middle = buffer.as_slice().slice(1..3)?;
/// assert_eq!(middle.to_vec()?, [2, 3]);
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0597
/// # use cuda_mem::DeviceBuffer;
/// let view = {
///     let buffer = DeviceBuffer::<u32>::zeroed(4).unwrap();
///     buffer.as_slice()
/// }; // error: `buffer` does not live long enough
/// let _ = view.len();
/// ```
///
/// ```compile_fail,E0505
/// # use cuda_mem::DeviceBuffer;
/// let buffer = DeviceBuffer::<u32>::zeroed(4).unwrap();
/// let view = buffer.as_slice();
/// drop(buffer); // error: cannot move out of `buffer` because it is borrowed
/// let _ = view.to_vec();
/// ```
pub struct DeviceSlice<'a, T> {
    ptr: *const T,
    len: usize,
    owner: Option<&'a Stream>,
    _borrow: PhantomData<&'a [T]>,
}

/// An exclusive view of `len` elements of device-accessible memory, valid for `'a`.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::DeviceBuffer;
/// let mut buffer = DeviceBuffer::<u32>::zeroed(1024)?;
/// let (mut low, high) = buffer.as_mut_slice().split_at_mut(512)?;
/// low.copy_from_host(&[7; 512])?;
/// assert_eq!(high.to_vec()?, vec![0; 512]);
/// # Ok(()) }
/// ```
pub struct DeviceSliceMut<'a, T> {
    ptr: *mut T,
    len: usize,
    owner: Option<&'a Stream>,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: a view is a device address, a length and a borrowed `Stream` (Sync). Another thread
// holding it may only read the memory through runtime calls (blocking copies, or work queued in a
// scope, which waits for its stream before the view's borrow ends), on any device that can
// address it; the host never dereferences the address. Like `&[T]`, it requires T: Sync.
unsafe impl<T: Sync> Send for DeviceSlice<'_, T> {}
// SAFETY: as above; a shared view only reads.
unsafe impl<T: Sync> Sync for DeviceSlice<'_, T> {}
// SAFETY: like `&mut [T]`: the view is the only way to write its memory while it lives (its owner
// is borrowed exclusively), and the thread it moves to may write it through runtime calls.
unsafe impl<T: Send> Send for DeviceSliceMut<'_, T> {}
// SAFETY: `&DeviceSliceMut` lets other threads read the address and length, and queue reads of the
// memory in scopes (as a `DeviceSource`); writes need `&mut`. Device work of several streams on
// one view is ordered by the caller (docs/soundness.md); with Pod elements a misordered write
// leaves unspecified values, never host UB: the host reads device memory only by copies.
unsafe impl<T: Sync> Sync for DeviceSliceMut<'_, T> {}

impl<T> Clone for DeviceSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceSlice<'_, T> {}

impl<T> fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSlice").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

impl<T> fmt::Debug for DeviceSliceMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSliceMut").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

fn bounds(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        let kind = ErrorKind::InvalidArgument("range out of bounds");
        return Err(CudaError::new(kind, format!("slicing {start}..{end} of a device slice of {len} elements")));
    }
    Ok((start, end))
}

/// What both views offer alike; `$ptr` is the view's pointer type.
macro_rules! view_accessors {
    ($view:ident, $ptr:ty) => {
        impl<'a, T: Pod> $view<'a, T> {
            /// A view of memory ordered on `owner` (see the module docs).
            ///
            /// # Safety
            /// As for `from_raw_parts`, except that the memory's initialising work may be pending
            /// on `owner`.
            pub(crate) unsafe fn ordered_on(ptr: $ptr, len: usize, owner: &'a Stream) -> Self {
                Self { ptr, len, owner: Some(owner), _borrow: PhantomData }
            }

            /// The stream the memory is ordered on, for stream-ordered memory.
            pub(crate) fn owner(&self) -> Option<&'a Stream> {
                self.owner
            }

            /// The stream the memory is ordered on: `Some` for stream-ordered memory
            /// ([`StreamBuffer`](crate::StreamBuffer), [`CachedBuffer`](crate::CachedBuffer),
            /// resource buffers), whose allocation and zeroing may still be pending there. Code
            /// that queues work of its own on another stream makes that stream wait for it first
            /// ([`Stream::wait_for`]); scopes do so themselves.
            pub fn stream(&self) -> Option<&'a Stream> {
                self.owner
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// True when the view has no elements.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Size in bytes.
            pub fn size_bytes(&self) -> usize {
                self.len * size_of::<T>()
            }

            /// The device address, for handing to other CUDA code. Valid for `'a`.
            pub fn as_device_ptr(&self) -> $ptr {
                self.ptr
            }
        }
    };
}

view_accessors!(DeviceSlice, *const T);
view_accessors!(DeviceSliceMut, *mut T);

impl<'a, T: Pod> DeviceSlice<'a, T> {
    /// A view of raw device memory.
    ///
    /// # Safety
    /// `ptr` must address `len` elements of device-accessible memory that stays allocated, and is
    /// not written through any other path, for `'a`; work that initialised it must be complete or
    /// ordered before any work on the streams the view is used on.
    pub unsafe fn from_raw_parts(ptr: *const T, len: usize) -> Self {
        Self { ptr, len, owner: None, _borrow: PhantomData }
    }

    /// A sub-range, or an error if it is out of bounds.
    pub fn slice(self, range: impl RangeBounds<usize>) -> Result<Self> {
        let (start, end) = bounds(range, self.len)?;
        Ok(Self { ptr: self.ptr.wrapping_add(start), len: end - start, ..self })
    }

    /// Two views split at `mid`.
    pub fn split_at(self, mid: usize) -> Result<(Self, Self)> {
        Ok((self.slice(..mid)?, self.slice(mid..)?))
    }

    /// Copies into a host slice of the same length (`cudaMemcpy`, blocking).
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        same_len(self.len, dst.len(), "cudaMemcpy device to host")?;
        let bytes = self.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        wait_for_owner(self.owner)?;
        // SAFETY: `dst` is valid for `bytes` writes; the view addresses `bytes` of device memory.
        unsafe { raw::memory::copy(dst.as_mut_ptr().cast(), self.ptr.cast(), bytes, Direction::DeviceToHost) }
    }

    /// Copies into a new `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }
}

impl<'a, T: Pod> DeviceSliceMut<'a, T> {
    /// An exclusive view of raw device memory.
    ///
    /// # Safety
    /// `ptr` must address `len` elements of device-accessible memory that stays allocated, and is
    /// not accessed through any other path, for `'a`; work that initialised it must be complete
    /// or ordered before any work on the streams the view is used on.
    pub unsafe fn from_raw_parts(ptr: *mut T, len: usize) -> Self {
        Self { ptr, len, owner: None, _borrow: PhantomData }
    }

    /// A shared view of the same memory, for as long as this one is borrowed.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        // The shared view borrows `self`, so nothing writes through `self` meanwhile.
        DeviceSlice { ptr: self.ptr, len: self.len, owner: self.owner, _borrow: PhantomData }
    }

    /// A shorter-lived exclusive view, so `self` can be used again afterwards.
    pub fn reborrow(&mut self) -> DeviceSliceMut<'_, T> {
        // The new view borrows `self` exclusively.
        DeviceSliceMut { ptr: self.ptr, len: self.len, owner: self.owner, _borrow: PhantomData }
    }

    /// A sub-range, or an error if it is out of bounds.
    pub fn slice_mut(self, range: impl RangeBounds<usize>) -> Result<Self> {
        let (start, end) = bounds(range, self.len)?;
        // The sub-range lies inside this view, which is consumed.
        Ok(Self { ptr: self.ptr.wrapping_add(start), len: end - start, ..self })
    }

    /// Two disjoint exclusive views split at `mid`.
    pub fn split_at_mut(self, mid: usize) -> Result<(Self, Self)> {
        let (_, _) = bounds(..mid, self.len)?;
        // [0, mid) and [mid, len) are disjoint and inside this consumed view.
        let high =
            Self { ptr: self.ptr.wrapping_add(mid), len: self.len - mid, owner: self.owner, _borrow: PhantomData };
        Ok((Self { len: mid, ..self }, high))
    }

    /// The bytes a blocking write of `src_len` elements covers, after checking the length and
    /// waiting for the streams both sides are ordered on; `None` when there is nothing to do.
    fn blocking_bytes(
        &self,
        src_len: usize,
        src_owner: Option<&Stream>,
        operation: &'static str,
    ) -> Result<Option<usize>> {
        same_len(src_len, self.len, operation)?;
        if self.size_bytes() == 0 {
            return Ok(None);
        }
        wait_for_owner(self.owner)?;
        wait_for_owner(src_owner)?;
        Ok(Some(self.size_bytes()))
    }

    /// Copies from a host slice of the same length (`cudaMemcpy`, blocking).
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        let Some(bytes) = self.blocking_bytes(src.len(), None, "cudaMemcpy host to device")? else {
            return Ok(());
        };
        // SAFETY: `src` is valid for `bytes` reads; the view addresses `bytes` of device memory
        // that only this view may write.
        unsafe { raw::memory::copy(self.ptr.cast(), src.as_ptr().cast(), bytes, Direction::HostToDevice)? };
        // From pageable memory cudaMemcpy returns once the data is staged, before the DMA has
        // landed (documented); work on a non-blocking stream would race with it.
        raw::streams::synchronize_legacy("a host-to-device cudaMemcpy")
    }

    /// Copies from another device slice of the same length (`cudaMemcpy` device to device; the
    /// host waits for it).
    pub fn copy_from_device<'s>(&mut self, src: impl DeviceSource<'s, T>) -> Result<()> {
        let src = src.source();
        let Some(bytes) = self.blocking_bytes(src.len(), src.owner, "cudaMemcpy device to device")? else {
            return Ok(());
        };
        // SAFETY: both views address `bytes` of live device memory; `self` is exclusive, so the
        // ranges can only overlap if `src` was made unsafely.
        unsafe { raw::memory::copy(self.ptr.cast(), src.ptr.cast(), bytes, Direction::DeviceToDevice)? };
        // cudaMemcpy device-to-device may return before the copy ends; keep the blocking promise.
        raw::streams::synchronize_legacy("a device-to-device cudaMemcpy")
    }

    /// Sets every byte to `byte` (`cudaMemset`, blocking).
    pub fn set_bytes(&mut self, byte: u8) -> Result<()> {
        let Some(bytes) = self.blocking_bytes(self.len, None, "cudaMemset")? else {
            return Ok(());
        };
        // SAFETY: the view addresses `bytes` of device memory only it may write.
        unsafe { raw::memory::set(self.ptr.cast(), byte, bytes)? };
        // cudaMemset may return before it finishes for device memory.
        raw::streams::synchronize_legacy("cudaMemset")
    }

    /// Copies into a host slice of the same length (blocking).
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.as_slice().copy_to_host(dst)
    }

    /// Copies into a new `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_slice().to_vec()
    }
}

pub(crate) mod sealed {
    use super::DeviceSlice;

    /// Not nameable outside the crate, so only cuda-mem can turn a lent `&DeviceSliceMut` into a
    /// shared view that lives as long as the scope.
    pub trait Source<'a, T> {
        fn source(&self) -> DeviceSlice<'a, T>;
    }
}

/// Device memory that may be read: a [`DeviceSlice`], or a `&DeviceSliceMut` (in a scope, one
/// that the same scope also writes: the stream orders the two).
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{DeviceBuffer, Stream};
/// let source = DeviceBuffer::from_slice(&[1u8; 256])?;
/// let mut target = DeviceBuffer::<u8>::zeroed(256)?;
/// let mut dst = target.as_mut_slice();
/// let stream = Stream::new()?;
/// // A shared view and a lent `&DeviceSliceMut` are both sources.
/// stream.scope(|s| s.copy_from_device(&mut dst, source.as_slice()))??;
/// # Ok(()) }
/// ```
pub trait DeviceSource<'a, T>: sealed::Source<'a, T> {}

impl<'a, T> sealed::Source<'a, T> for DeviceSlice<'a, T> {
    fn source(&self) -> DeviceSlice<'a, T> {
        *self
    }
}
impl<'a, T> DeviceSource<'a, T> for DeviceSlice<'a, T> {}

impl<'a, T> sealed::Source<'a, T> for &DeviceSliceMut<'a, T> {
    fn source(&self) -> DeviceSlice<'a, T> {
        DeviceSlice { ptr: self.ptr, len: self.len, owner: self.owner, _borrow: PhantomData }
    }
}
impl<'a, T> DeviceSource<'a, T> for &DeviceSliceMut<'a, T> {}

/// Waits for the stream that stream-ordered memory is ordered on, so a blocking operation cannot
/// overtake its allocation or zeroing (the legacy stream does not wait for non-blocking streams).
fn wait_for_owner(owner: Option<&Stream>) -> Result<()> {
    match owner {
        Some(stream) => stream.synchronize(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(len: usize) -> DeviceSlice<'static, u32> {
        // SAFETY: the views in these tests are never dereferenced or passed to CUDA.
        unsafe { DeviceSlice::from_raw_parts(std::ptr::null(), len) }
    }

    #[test]
    fn slicing_checks_bounds_without_panicking() {
        assert_eq!(view(10).slice(2..5).unwrap().len(), 3);
        assert_eq!(view(10).slice(..).unwrap().len(), 10);
        assert_eq!(view(10).slice(3..=3).unwrap().len(), 1);
        let err = view(10).slice(5..11).unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::InvalidArgument("range out of bounds"));
        let (start, end) = (6, 5);
        assert!(view(10).slice(start..end).is_err());
        let (a, b) = view(10).split_at(4).unwrap();
        assert_eq!((a.len(), b.len()), (4, 6));
        assert_eq!(b.as_device_ptr() as usize, 16);
        assert!(view(10).split_at(11).is_err());
    }

    #[test]
    fn same_len_is_reported_before_any_cuda_call() {
        let mut host = [0u32; 3];
        let err = view(4).copy_to_host(&mut host).unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::LengthMismatch { src: 4, dst: 3 });
        // SAFETY: never dereferenced: the length check fails first.
        let mut dst = unsafe { DeviceSliceMut::<u32>::from_raw_parts(std::ptr::null_mut(), 2) };
        let err = dst.copy_from_host(&[1, 2, 3]).unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::LengthMismatch { src: 3, dst: 2 });
        assert!(dst.copy_from_device(view(5)).is_err());
    }
}
