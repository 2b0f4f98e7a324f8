//! What the caching allocator needs from CUDA: segments of device memory, and fences (events)
//! recorded on streams that the host can query or wait for and that other streams can wait for.

use crate::BackendError;
use std::ptr::NonNull;

/// A stream as the front caches and blocks know it: the value of its raw handle, compared and
/// hashed, never dereferenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey(pub usize);

/// The memory system behind a [`CachingAllocator`](super::CachingAllocator).
///
/// # Safety
/// The cache hands out parts of segments and decides when memory may be reused from these
/// promises; an implementation that breaks one makes it hand out memory that is still in use:
/// - `allocate(bytes)` returns `bytes` bytes aligned to at least 256, overlapping no segment it
///   returned before that has not been released;
/// - a fence from `record(stream)` covers the work queued on `stream` before the call: `is_done`
///   is true and `wait` returns `Ok` only once that work has completed, and `stream_wait(other,
///   fence)` returns `Ok` only when work queued on `other` afterwards cannot start before it;
/// - while a `Stream` handle lives, its `key` names that stream and no other.
pub unsafe trait Backend: Send + Sync + 'static {
    /// A handle to a stream. The cache keeps a clone of it (taken off the hot path) while it
    /// holds memory of that stream or a fence on it, so the stream, and with it its key, stays
    /// that stream's until the cache is done with it.
    type Stream: Clone + Send + Sync + 'static;

    /// A mark in a stream's work (a CUDA event).
    type Fence: Send + Sync + 'static;

    /// What the backend's calls fail with; the cache passes it on in [`Error`](crate::Error).
    type Error: BackendError;

    /// The key of `stream` (its raw handle's value): cheap, as every allocation and free uses it.
    fn key(stream: &Self::Stream) -> StreamKey;

    /// A new segment of `bytes` (a multiple of 512) bytes. An error whose
    /// [`is_out_of_memory`](BackendError::is_out_of_memory) is true makes the cache release what it
    /// holds and try once more.
    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>, Self::Error>;

    /// Returns a segment to the system.
    ///
    /// # Safety
    /// `base` and `bytes` are a segment from this backend's `allocate`, released once, and every
    /// piece of work that used its memory has completed.
    unsafe fn release(&self, base: NonNull<u8>, bytes: usize);

    /// A fence after the work queued on `stream` so far.
    fn record(&self, stream: &Self::Stream) -> Result<Self::Fence, Self::Error>;

    /// True when the fenced work has completed; never blocks.
    fn is_done(&self, fence: &Self::Fence) -> bool;

    /// Blocks the calling thread until the fenced work has completed.
    fn wait(&self, fence: &Self::Fence) -> Result<(), Self::Error>;

    /// Makes work queued on `stream` from now on wait for the fenced work, without blocking the
    /// host (`cudaStreamWaitEvent`).
    fn stream_wait(&self, stream: &Self::Stream, fence: &Self::Fence) -> Result<(), Self::Error>;

    /// Page-granular virtual memory, when the system has it: then the cache grows one address
    /// range per stream and pool by mapping pages, and returns free pages without releasing the
    /// range ([`Pages`]). `None` (the default): segments only.
    fn pages(&self) -> Option<&dyn Pages<Error = Self::Error>> {
        None
    }
}

/// Address ranges reserved up front, backed by mappings of whole pages (`cuMemAddressReserve`,
/// `cuMemCreate`, `cuMemMap`, `cuMemUnmap`): growth never fragments, and returning memory needs
/// no device-wide synchronization. A mapping is unmapped whole or not at all (the driver unmaps
/// whole mappings only, and maps a whole allocation only), so the cache unmaps runs of whole
/// mappings, as [`Pages::map`] reports them.
///
/// # Safety
/// As [`Backend`]'s promises: `page_bytes` is a power of two of at least 512 and `range_bytes` a
/// multiple of it, both the same at every call; `reserve` returns `bytes` of addresses aligned to
/// `page_bytes`, overlapping no range it returned before that was not freed; after `map(at,
/// bytes, room)` returns `Ok(mapped)`, `mapped.bytes` from `at` (at least `bytes`, at most
/// `room`) are memory of the cache's device that nothing else uses (new, or kept by an `unmap`
/// and mapped nowhere else), readable and writable there, until `unmap` of them, and
/// `mapped.mappings` are the sizes of its mappings in address order, adding up to
/// `mapped.bytes`; the figures `map` and `release_kept` return are exact.
pub unsafe trait Pages: Send + Sync {
    /// What the calls fail with: the backend's error.
    type Error: BackendError;

    /// Bytes of a page: every mapping is a multiple of it, at a multiple of it.
    fn page_bytes(&self) -> usize;

    /// Bytes of a range the cache reserves for a stream's pool: all the memory the device has
    /// (rounded to pages), so one range is all a stream's pool needs.
    fn range_bytes(&self) -> usize;

    /// Reserves `bytes` (a multiple of `page_bytes`) of addresses with no memory behind them.
    fn reserve(&self, bytes: usize) -> Result<NonNull<u8>, Self::Error>;

    /// Backs at least `bytes` and at most `room` (multiples of `page_bytes`) from `at` with
    /// memory, as [`MappingPlan`] lays it out: kept mappings first, new ones of at most
    /// `max_new` bytes (the cache's [`Config::max_mapping_bytes`](crate::Config::max_mapping_bytes),
    /// at least a page) for the rest. Out of
    /// memory is an error whose [`is_out_of_memory`](BackendError::is_out_of_memory) is true,
    /// with nothing of the run left mapped and every kept mapping still kept.
    ///
    /// # Safety
    /// The `room` bytes from `at` lie in one range from `reserve` and none of them is mapped.
    unsafe fn map(&self, at: NonNull<u8>, bytes: usize, room: usize, max_new: usize) -> Result<Mapped, Self::Error>;

    /// Takes the memory behind the mappings of `bytes` from `at` off those addresses and keeps
    /// it, unmapped, for later `map`s (a miss then maps memory that exists instead of creating
    /// it) until `release_kept`.
    ///
    /// # Safety
    /// The run is whole mappings made by `map`, and every piece of work that used it has
    /// completed.
    unsafe fn unmap(&self, at: NonNull<u8>, bytes: usize);

    /// Returns every kept mapping's memory to the system; returns their bytes.
    fn release_kept(&self) -> usize;

    /// Gives back a range from `reserve`.
    ///
    /// # Safety
    /// `base` and `bytes` are a range from `reserve`, none of it mapped, freed once.
    unsafe fn free(&self, base: NonNull<u8>, bytes: usize);

    /// Gives the memory behind every live mapping back to the system, keeping its addresses
    /// reserved and, with [`Keep::Contents`], its bytes elsewhere (host memory), until
    /// [`restore`](Pages::restore). Returns the bytes given back. On error every mapping is as it
    /// was, mapped with its contents.
    ///
    /// # Safety
    /// No work uses any mapping from this call until `restore` returns `Ok`, and no other call of
    /// this trait but `restore`, `page_bytes` and `range_bytes` comes in between.
    unsafe fn evict(&self, keep: Keep) -> Result<usize, Self::Error>;

    /// Backs every mapping `evict` gave back with new memory at its own address, with its kept
    /// bytes, readable and writable again as before; returns the bytes mapped. On error (out of
    /// memory, whose [`is_out_of_memory`](BackendError::is_out_of_memory) is true), nothing of
    /// them is mapped and every one stays evicted with its kept bytes: the call can be repeated.
    fn restore(&self) -> Result<usize, Self::Error>;
}

/// What [`Pages::evict`] (and a cache's sleep) keeps of the memory it gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Keep {
    /// The bytes: copied to host memory, and back at the restore.
    Contents,
    /// Nothing: after the restore the memory holds arbitrary bytes (a KV cache that will be
    /// recomputed, scratch).
    Nothing,
}

/// What a [`Pages::map`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// Bytes mapped from the run's start.
    pub bytes: usize,
    /// Bytes of them that were kept memory (the rest is new).
    pub from_kept: usize,
    /// The sizes of the mappings made, in address order.
    pub mappings: Vec<usize>,
}

/// How a [`Pages`] lays out a run: which kept mappings it maps again and which new ones it
/// creates, in address order. One rule for every implementation, so that the cache's figures
/// (and the fake backend's) follow what the device does.
///
/// A kept mapping of `bytes` to `room` alone comes first (the smallest such: a miss is then one
/// remap of memory that exists, and the stream keeps the rest as free space); else kept mappings
/// no larger than what is left, largest first; then new memory for the rest, in mappings of at
/// most `max_new` bytes (each one allocation: fewer calls than a page each, and each can still go
/// back alone).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MappingPlan {
    /// Sizes of the kept mappings to map again, in address order.
    pub kept: Vec<usize>,
    /// Sizes of the new mappings, after them.
    pub new: Vec<usize>,
}

impl MappingPlan {
    /// The plan for at least `bytes` and at most `room` from the kept mappings `kept` (size ->
    /// count); `bytes`, `room` and every size are multiples of `page`, and `max_new` is at least
    /// `page`.
    pub fn new(
        bytes: usize,
        room: usize,
        kept: &std::collections::BTreeMap<usize, usize>,
        page: usize,
        max_new: usize,
    ) -> Self {
        // Any other input still gives a plan, never a panic or an endless loop: a room below the
        // need is the need, a page of 0 is a byte, a largest new mapping below a page is a page,
        // and kept mappings of 0 bytes are never taken.
        let (page, room) = (page.max(1), room.max(bytes));
        if bytes == 0 {
            return Self::default();
        }
        if let Some((&size, _)) = kept.range(bytes..=room).find(|&(_, &count)| count > 0) {
            return Self { kept: vec![size], new: Vec::new() };
        }
        let mut plan = Self::default();
        let mut left = bytes;
        let mut taken: std::collections::BTreeMap<usize, usize> = std::collections::BTreeMap::new();
        while left > 0 {
            let fit = kept
                .range(1..=left)
                .rev()
                .find(|&(size, &count)| count > taken.get(size).copied().unwrap_or(0))
                .map(|(&size, _)| size);
            let Some(size) = fit else { break };
            *taken.entry(size).or_default() += 1;
            plan.kept.push(size);
            left -= size;
        }
        let max_new = (max_new / page * page).max(page);
        while left > 0 {
            let size = left.min(max_new);
            plan.new.push(size);
            left -= size;
        }
        plan
    }

    /// Bytes the plan maps.
    pub fn bytes(&self) -> usize {
        self.kept.iter().chain(&self.new).sum()
    }
}
