//! `MaybeOwned`: how a buffer holds the stream (or pool, or resource) it frees through.

use std::fmt;
use std::ops::Deref;

/// A handle a buffer keeps until it frees: borrowed (`&stream`: free of cost, the buffer cannot
/// outlive it) or owned (`stream.clone()`: one reference count, the buffer is `'static`).
///
/// Constructors take `impl Into<MaybeOwned<'a, _>>`, so passing `&stream` borrows and passing a
/// `Stream` value owns. Per-step temporaries borrow and cost nothing beyond the raw runtime calls;
/// buffers kept in long-lived structures own their handles.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Stream, StreamBuffer};
/// let stream = Stream::non_blocking()?;
/// let temp = StreamBuffer::<f32>::zeroed(&stream, 1024)?; // borrows `stream`
/// let kept: StreamBuffer<'static, f32> = StreamBuffer::zeroed(stream.clone(), 1024)?; // owns a handle
/// # drop((temp, kept)); Ok(()) }
/// ```
pub enum MaybeOwned<'a, T> {
    /// Borrowed for the buffer's lifetime.
    Borrowed(&'a T),
    /// Owned by the buffer.
    Owned(T),
}

impl<T> Deref for MaybeOwned<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        match self {
            Self::Borrowed(value) => value,
            Self::Owned(value) => value,
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for MaybeOwned<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<'a, T> From<&'a T> for MaybeOwned<'a, T> {
    fn from(value: &'a T) -> Self {
        Self::Borrowed(value)
    }
}

impl<'a, T> From<&'a mut T> for MaybeOwned<'a, T> {
    fn from(value: &'a mut T) -> Self {
        Self::Borrowed(value)
    }
}

// Owned forms are one `From` per handle type, beside the type (stream/mod.rs, pool.rs), so that
// `&T` and `T` never overlap and this module names no type above it.
