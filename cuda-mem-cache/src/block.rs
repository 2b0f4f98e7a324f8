//! `CachedBlock`: one block handed out by a caching allocator, owned by whoever holds it.

use super::arena::BlockId;
use super::backend::StreamKey;
use super::front::Parked;
use super::size_class::SizeClass;
use std::fmt;
use std::ptr::NonNull;

/// A block of device memory from a [`CachingAllocator`](super::CachingAllocator), for use on its
/// stream. Neither `Clone` nor `Copy`: the one handle is given back once, to
/// [`CachingAllocator::free`](super::CachingAllocator::free) or `free_on`. The handle does not
/// keep the allocator alive; an owner that holds one holds the allocator too (the allocator
/// releases only segments none of whose blocks are out, so a forgotten handle leaks its segment).
pub struct CachedBlock {
    pub(super) ptr: NonNull<u8>,
    pub(super) requested: usize,
    pub(super) class: SizeClass,
    pub(super) stream: StreamKey,
    pub(super) id: BlockId,
    /// For a block lent by another stream: the core's shard that holds its segment (the
    /// lender's), where its return from a front cache goes, pending a fence on its stream.
    pub(super) lent: Option<u8>,
    pub(super) allocator: u64,
}

// SAFETY: the handle owns its block exclusively and the cache never dereferences the address;
// another thread may use the memory through CUDA calls ordered on the block's stream, and free it.
unsafe impl Send for CachedBlock {}
// SAFETY: `&CachedBlock` only reads the address and sizes.
unsafe impl Sync for CachedBlock {}

impl CachedBlock {
    /// The block's address (aligned to at least 256 bytes).
    #[inline]
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes in the block: the request rounded up to its size class.
    #[inline]
    pub fn bytes(&self) -> usize {
        self.class.bytes()
    }

    /// Bytes asked for.
    #[inline]
    pub fn requested(&self) -> usize {
        self.requested
    }

    /// The stream the block was allocated on: it is reusable there as soon as it is freed there
    /// (a block lent by another stream, once the work queued there before its free completes).
    #[inline]
    pub fn stream(&self) -> StreamKey {
        self.stream
    }

    /// Whether the block's memory belongs to another stream that lent it (see
    /// [`CachingStats::blocks_lent`](super::CachingStats::blocks_lent)).
    #[inline]
    pub fn is_lent(&self) -> bool {
        self.lent.is_some()
    }

    #[inline]
    pub(super) fn parked(&self) -> Parked {
        Parked { ptr: self.ptr, id: self.id, stream: self.stream, lent: self.lent }
    }
}

impl fmt::Debug for CachedBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedBlock")
            .field("ptr", &self.ptr)
            .field("bytes", &self.bytes())
            .field("requested", &self.requested)
            .field("stream", &self.stream)
            .field("lent", &self.lent.is_some())
            .finish()
    }
}
