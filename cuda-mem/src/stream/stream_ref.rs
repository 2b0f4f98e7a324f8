//! `StreamRef`: a borrowed stream handle, as memory resources and other CUDA code name streams.

use super::Stream;
use crate::raw;
use std::fmt;
use std::marker::PhantomData;

/// A borrowed stream handle for resources: the stream an allocation is ordered on. The legacy
/// default stream needs no CUDA call to name, so adaptors can be tested without a GPU. A handle
/// of a built-in stream means the calling thread's stream on its current device, so
/// [`ResourceBuffer`](crate::resource::ResourceBuffer) passes resources one only while it holds the stream's device current.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StreamRef<'a> {
    raw: raw::cudaStream_t,
    _stream: PhantomData<&'a Stream>,
}

// SAFETY: the handle is a name passed to thread-safe runtime calls; another thread may pass it on.
// For a created stream it names that stream everywhere; for a built-in handle it names the using
// thread's stream on its current device, which is what a resource called there orders on.
unsafe impl Send for StreamRef<'_> {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for StreamRef<'_> {}

impl StreamRef<'static> {
    /// The legacy default stream (handle 0).
    pub const LEGACY: Self = Self { raw: std::ptr::null_mut(), _stream: PhantomData };
}

impl StreamRef<'_> {
    /// A reference to the stream `raw` names, for as long as the caller keeps it valid.
    pub(crate) fn new(raw: raw::cudaStream_t) -> Self {
        Self { raw, _stream: PhantomData }
    }

    /// A reference to a stream handle from other CUDA code (a PyTorch allocator hook, say).
    ///
    /// # Safety
    /// `raw` names a live stream for `'a`, or is a built-in handle (0, `cudaStreamPerThread`),
    /// which means the calling thread's stream on its current device wherever it is used.
    pub unsafe fn from_raw(raw: raw::cudaStream_t) -> Self {
        Self { raw, _stream: PhantomData }
    }

    /// The raw handle.
    pub fn as_raw(self) -> raw::cudaStream_t {
        self.raw
    }
}

impl fmt::Debug for StreamRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamRef({:p})", self.raw)
    }
}
