//! `StreamScope`: asynchronous work that borrows memory, made safe by waiting for the stream
//! before the borrows end (the `std::thread::scope` pattern applied to a CUDA stream).

use crate::error::Result;
use crate::raw::memory::Direction::{DeviceToDevice as D2D, DeviceToHost as D2H, HostToDevice as H2D};
use crate::raw::{self, same_len};
use crate::slice::{DeviceSliceMut, DeviceSource};
use crate::stream::Stream;
use bytemuck::Pod;
use std::marker::PhantomData;

/// Queues work on a stream; created by [`Stream::scope`]. Everything passed in is borrowed for
/// `'scope`, which ends only after the stream has been synchronized.
///
/// Device memory is lent as a view created before the scope; destinations are `&mut` views, and one
/// view may be written and read by several operations of the same scope, which the stream runs in
/// order:
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// # use cuda_mem::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let host = vec![7u32; 1024];
/// let mut back = vec![0u32; 1024];
/// let mut device = DeviceBuffer::<u32>::zeroed(1024)?;
/// let mut dev = device.as_mut_slice();
/// stream.scope(|s| -> cuda_mem::Result<()> {
///     s.copy_from_host(&mut dev, &host)?;
///     s.copy_to_host(&mut back, &dev)?;
///     Ok(())
/// })??;
/// # Ok(()) }
/// ```
///
/// Host memory handed to an asynchronous copy can be neither mutated nor dropped before the scope
/// ends:
///
/// ```compile_fail,E0502
/// # use cuda_mem::{DeviceBuffer, Stream};
/// # let stream = Stream::new().unwrap();
/// let mut host = vec![1u32; 16];
/// let mut device = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// stream.scope(|s| {
///     s.copy_from_host(&mut device.as_mut_slice(), &host).unwrap();
///     host[0] = 2; // error: `host` is borrowed by the pending copy
/// }).unwrap();
/// ```
///
/// ```compile_fail,E0597
/// # use cuda_mem::{DeviceBuffer, Stream};
/// # let stream = Stream::new().unwrap();
/// let mut device = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// stream.scope(|s| {
///     let host = vec![1u32; 16];
///     s.copy_from_host(&mut device.as_mut_slice(), &host).unwrap();
///     drop(host); // error: `host` must outlive the scope
/// }).unwrap();
/// ```
/// A destination is borrowed exclusively, so it cannot also be the source of the same operation:
///
/// ```compile_fail,E0502
/// # use cuda_mem::{DeviceBuffer, Stream};
/// # let stream = Stream::new().unwrap();
/// let mut device = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// let mut view = device.as_mut_slice();
/// stream.scope(|s| s.copy_from_device(&mut view, &view)).unwrap().unwrap();
/// ```
#[derive(Debug)]
pub struct StreamScope<'scope, 'env: 'scope> {
    stream: &'scope Stream,
    // Invariant lifetimes, as in `std::thread::Scope`.
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// One `Result` from a fallible scope's closure and the synchronize that ended it: the closure's
/// error first, with the synchronize's failure attached (see [`CudaError::later`](crate::CudaError::later)) when both
/// failed.
pub(crate) fn merge<T>(value: Result<T>, synchronized: Result<()>) -> Result<T> {
    match (value, synchronized) {
        (Ok(value), Ok(())) => Ok(value),
        (Ok(_), Err(sync)) => Err(sync),
        (Err(err), Ok(())) => Err(err),
        (Err(err), Err(sync)) => Err(err.with_later(sync)),
    }
}

/// Waits for the stream if the scope's closure unwinds, so borrows never end with work pending.
struct SyncOnUnwind<'a>(&'a Stream);

impl Drop for SyncOnUnwind<'_> {
    fn drop(&mut self) {
        // An error here is consumed by `synchronize` (it goes through `check`); unwinding goes on.
        let _ = self.0.synchronize();
    }
}

/// Scopes of a stream: defined here, beside [`StreamScope`], so that streams need not know it.
impl Stream {
    /// Runs `f` with a scope through which work that borrows memory is queued on this stream, then
    /// waits for the stream, so everything borrowed for the scope is free of GPU work when `scope`
    /// returns — also if `f` panics. This is how cuda-mem makes asynchronous copies safe: host
    /// memory lent to the GPU cannot be touched, moved or dropped while a copy may still read or
    /// write it.
    ///
    /// The outer `Result` is the final synchronize; `f`'s own value comes back inside it.
    pub fn scope<'env, F, R>(&'env self, f: F) -> Result<R>
    where
        F: for<'scope> FnOnce(&'scope StreamScope<'scope, 'env>) -> R,
    {
        StreamScope::run(self, f)
    }

    /// [`Stream::scope`] for a closure that returns a `Result`: one `Result` comes back, the
    /// closure's error first. When both the closure and the final synchronize fail, the
    /// synchronize's error is attached to the closure's ([`CudaError::later`](crate::CudaError::later)).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cuda_mem::CudaError> {
    /// use cuda_mem::{DeviceBuffer, Stream};
    /// let stream = Stream::non_blocking()?;
    /// let host = vec![3u32; 1024];
    /// let mut device = DeviceBuffer::<u32>::zeroed(1024)?;
    /// let mut back = vec![0u32; 1024];
    /// let mut view = device.as_mut_slice();
    /// stream.try_scope(|s| {
    ///     s.copy_from_host(&mut view, &host)?;
    ///     s.copy_to_host(&mut back, &view)
    /// })?;
    /// assert_eq!(back, host);
    /// # Ok(()) }
    /// ```
    pub fn try_scope<'env, F, T>(&'env self, f: F) -> Result<T>
    where
        F: for<'scope> FnOnce(&'scope StreamScope<'scope, 'env>) -> Result<T>,
    {
        StreamScope::run_fallible(self, f)
    }
}

impl<'scope> StreamScope<'scope, 'scope> {
    /// Runs `f` with a scope whose end does not synchronize, for work on `value`, which the
    /// caller owns by value and keeps until the work has completed (a [`Pending`](crate::Pending)).
    /// Nothing borrowed from outside can be lent: `f` is higher-ranked over the scope's lifetime,
    /// which only `value` is borrowed for. If `f` panics, the stream is synchronized before the
    /// unwinding drops `value`.
    pub(crate) fn run_owned<T, F>(stream: &Stream, value: &mut T, f: F) -> Result<()>
    where
        F: for<'s> FnOnce(&'s StreamScope<'s, 's>, &'s mut T) -> Result<()>,
    {
        let scope = StreamScope { stream, _scope: PhantomData, _env: PhantomData };
        let guard = SyncOnUnwind(stream);
        let queued = f(&scope, value);
        std::mem::forget(guard);
        queued
    }
}

impl<'env> StreamScope<'env, 'env> {
    /// The scope of a stream capture ([`Stream::capture`](crate::Stream::capture)): everything
    /// lent to it is borrowed for `'env`, the lifetime of the graph the capture makes. It does
    /// not synchronize: captured work does not run until the graph is launched, and launches
    /// wait before the graph's borrows can end (`GraphExec`).
    pub(crate) fn capturing(stream: &'env Stream) -> Self {
        StreamScope { stream, _scope: PhantomData, _env: PhantomData }
    }
}

impl<'scope, 'env> StreamScope<'scope, 'env> {
    pub(crate) fn run<F, R>(stream: &'env Stream, f: F) -> Result<R>
    where
        F: for<'s> FnOnce(&'s StreamScope<'s, 'env>) -> R,
    {
        let scope = StreamScope { stream, _scope: PhantomData, _env: PhantomData };
        let guard = SyncOnUnwind(stream);
        let value = f(&scope);
        std::mem::forget(guard);
        stream.synchronize().map(|()| value)
    }

    /// [`StreamScope::run`] for a fallible closure: one `Result` (see [`merge`]).
    pub(crate) fn run_fallible<F, T>(stream: &'env Stream, f: F) -> Result<T>
    where
        F: for<'s> FnOnce(&'s StreamScope<'s, 'env>) -> Result<T>,
    {
        let scope = StreamScope { stream, _scope: PhantomData, _env: PhantomData };
        let guard = SyncOnUnwind(stream);
        let value = f(&scope);
        std::mem::forget(guard);
        merge(value, stream.synchronize())
    }

    /// The stream work is queued on (for launching kernels through cuda-mem-kernels or other code).
    pub fn stream(&self) -> &'scope Stream {
        self.stream
    }

    /// Queues a host-to-device copy (`cudaMemcpyAsync`). From pinned memory it overlaps with other
    /// work; from pageable memory the runtime stages it.
    pub fn copy_from_host<'v: 'scope, T: Pod>(&self, dst: &mut DeviceSliceMut<'v, T>, src: &'scope [T]) -> Result<()> {
        const OP: &str = "cudaMemcpyAsync host to device";
        same_len(src.len(), dst.len(), OP)?;
        self.order_after(dst.owner())?;
        // SAFETY: both sides cover `size_bytes` and are borrowed for 'scope.
        unsafe { self.enqueue_copy(dst.as_device_ptr().cast(), src.as_ptr().cast(), dst.size_bytes(), H2D) }
    }

    /// Queues a device-to-host copy (`cudaMemcpyAsync`).
    pub fn copy_to_host<T: Pod>(&self, dst: &'scope mut [T], src: impl DeviceSource<'scope, T>) -> Result<()> {
        const OP: &str = "cudaMemcpyAsync device to host";
        let src = src.source();
        same_len(src.len(), dst.len(), OP)?;
        self.order_after(src.owner())?;
        // SAFETY: both sides cover `size_bytes` and are borrowed for 'scope (`dst` exclusively).
        unsafe { self.enqueue_copy(dst.as_mut_ptr().cast(), src.as_device_ptr().cast(), src.size_bytes(), D2H) }
    }

    /// Queues a device-to-device copy (`cudaMemcpyAsync`).
    pub fn copy_from_device<'v: 'scope, T: Pod>(
        &self,
        dst: &mut DeviceSliceMut<'v, T>,
        src: impl DeviceSource<'scope, T>,
    ) -> Result<()> {
        const OP: &str = "cudaMemcpyAsync device to device";
        let src = src.source();
        same_len(src.len(), dst.len(), OP)?;
        self.order_after(dst.owner())?;
        self.order_after(src.owner())?;
        // SAFETY: both sides cover `size_bytes` and are borrowed for 'scope.
        unsafe { self.enqueue_copy(dst.as_device_ptr().cast(), src.as_device_ptr().cast(), src.size_bytes(), D2D) }
    }

    /// Queues a memset of every byte (`cudaMemsetAsync`).
    pub fn set_bytes<'v: 'scope, T: Pod>(&self, dst: &mut DeviceSliceMut<'v, T>, byte: u8) -> Result<()> {
        let bytes = dst.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        self.order_after(dst.owner())?;
        let call = self.stream.call()?;
        // SAFETY: `dst` addresses `bytes` of device memory, borrowed for 'scope.
        unsafe { raw::memory::set_async(dst.as_device_ptr().cast(), byte, bytes, call.as_raw()) }
    }

    /// The device address of memory lent to this scope for writing, for kernel launchers: valid
    /// for work queued on [`StreamScope::stream`] until the scope ends. The scope's stream is
    /// first ordered after the stream the memory is ordered on, if that is another one.
    pub fn device_ptr_mut<'v: 'scope, T: Pod>(&self, dst: &mut DeviceSliceMut<'v, T>) -> Result<*mut T> {
        self.order_after(dst.owner())?;
        Ok(dst.as_device_ptr())
    }

    /// The device address and length of memory lent to this scope for reading (see
    /// [`StreamScope::device_ptr_mut`]).
    pub fn device_ptr<T: Pod>(&self, src: impl DeviceSource<'scope, T>) -> Result<(*const T, usize)> {
        let src = src.source();
        self.order_after(src.owner())?;
        Ok((src.as_device_ptr(), src.len()))
    }

    /// Makes this scope's stream wait (on the device) for the work queued so far on `owner`, the
    /// stream stream-ordered memory was allocated and zeroed on, unless it is this stream. The
    /// free of that memory comes after the scope, which has synchronized its stream by then.
    #[inline]
    fn order_after(&self, owner: Option<&Stream>) -> Result<()> {
        match owner {
            Some(owner) if !owner.is_same_stream(self.stream) => self.wait_for(owner),
            _ => Ok(()),
        }
    }

    #[cold]
    #[inline(never)]
    fn wait_for(&self, owner: &Stream) -> Result<()> {
        self.stream.wait_for(owner)
    }

    /// # Safety
    /// `dst` and `src` must each address `bytes` of memory that stays allocated and otherwise
    /// untouched for 'scope (the scope synchronizes the stream before 'scope ends).
    unsafe fn enqueue_copy(
        &self,
        dst: *mut std::ffi::c_void,
        src: *const std::ffi::c_void,
        bytes: usize,
        direction: raw::memory::Direction,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let call = self.stream.call()?;
        // SAFETY: the caller guarantees both ranges live, untouched, until the stream has been
        // synchronized at the end of the scope; `call` checked that the handle means this stream.
        unsafe { raw::memory::copy_async(dst, src, bytes, direction, call.as_raw()) }
    }
}

#[cfg(test)]
mod tests {
    use super::merge;
    use crate::error::{CudaError, ErrorCode, ErrorKind};

    fn closure_error() -> CudaError {
        CudaError::new(ErrorKind::LengthMismatch { src: 1, dst: 2 }, "cudaMemcpyAsync host to device")
    }

    fn sync_error() -> CudaError {
        CudaError::new(ErrorKind::Runtime(ErrorCode::ILLEGAL_ADDRESS), "cudaStreamSynchronize")
    }

    #[test]
    fn merging_keeps_the_first_failure_and_attaches_the_synchronize() {
        assert_eq!(merge(Ok(5), Ok(())), Ok(5));
        assert_eq!(merge(Ok(5), Err(sync_error())), Err(sync_error()));
        assert_eq!(merge::<u8>(Err(closure_error()), Ok(())), Err(closure_error()));
        let both = merge::<u8>(Err(closure_error()), Err(sync_error())).unwrap_err();
        assert_eq!(both.kind(), closure_error().kind());
        assert_eq!(both.operation(), "cudaMemcpyAsync host to device");
        assert_eq!(both.later(), Some(&sync_error()));
        assert!(both.is_sticky() == closure_error().is_sticky(), "the kind stays the closure's");
    }

    #[test]
    #[cfg_attr(miri, ignore = "formats a runtime error code, whose text comes from the CUDA runtime (FFI)")]
    fn the_merged_message_names_both_failures_in_order() {
        let both = merge::<u8>(Err(closure_error()), Err(sync_error())).unwrap_err();
        let text = both.to_string();
        let (first, second) = text.split_once("; then ").expect(&text);
        assert_eq!(first, closure_error().to_string());
        assert_eq!(second, sync_error().to_string());
    }

    #[test]
    #[cfg_attr(miri, ignore = "formats a runtime error code, whose text comes from the CUDA runtime (FFI)")]
    fn later_failures_chain_in_order() {
        let third = CudaError::new(ErrorKind::Unsupported("x"), "third");
        let chained = closure_error().with_later(sync_error()).with_later(third.clone());
        assert_eq!(chained.later().unwrap().later(), Some(&third));
        assert!(chained.to_string().ends_with("; then third failed: not supported: x"), "{chained}");
    }
}
