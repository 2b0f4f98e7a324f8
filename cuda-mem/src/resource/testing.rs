//! A host-memory resource for testing adaptors without a GPU.

use super::{MemoryKind, MemoryResource, StreamRef};
use crate::error::{CudaError, ErrorKind, Result};
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator behind the resource interface; counts live bytes so tests can check
/// that every allocation came back.
#[derive(Debug, Default)]
pub struct HostResource {
    /// Bytes allocated and not yet freed.
    pub live_bytes: AtomicUsize,
}

fn layout(bytes: usize) -> Option<Layout> {
    Layout::from_size_align(bytes, 256).ok()
}

// SAFETY: the contract on `MemoryResource` holds: host memory from the global allocator, aligned
// as asked, freed only by `deallocate`; kind is always PinnedHost (host-accessible).
unsafe impl MemoryResource for HostResource {
    fn allocate(&self, bytes: usize, _stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        if bytes == 0 {
            return Err(CudaError::new(ErrorKind::InvalidArgument("zero bytes"), "HostResource::allocate"));
        }
        let refused = || CudaError::new(ErrorKind::InvalidArgument("host allocation refused"), "HostResource");
        let layout = layout(bytes).ok_or_else(refused)?;
        // SAFETY: non-zero size, valid alignment.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or_else(refused)?;
        self.live_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, _stream: StreamRef<'_>) {
        self.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
        let layout = layout(bytes).expect("allocate accepted this size");
        // SAFETY: allocated above with the same layout, freed once (the caller's contract).
        unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::PinnedHost
    }
}
