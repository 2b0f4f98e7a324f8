//! Regions: what PyTorch allocates inside `cuda_mem.torch.region(tag)` comes from a device cache
//! of the tag's own, which can sleep (its device memory given back, the bytes kept in pinned host
//! memory or dropped) and wake (new memory at the same addresses, the bytes restored). Tensors,
//! their `data_ptr()`s and the CUDA graphs that use them stay valid across a cycle.
//!
//! **Tags** are names, numbered from 1 in the order first used (0: no tag). A thread's current
//! tag is set by [`enter`] and put back by [`leave`]; the allocations a thread makes with a tag
//! set come from that tag's cache on the device. What a CUDA graph capture allocates comes from
//! the graph's private pool even inside a region (pool memory never sleeps).
//!
//! **While a tag sleeps** its allocations are refused ([`ErrorKind::SleepState`]) and its frees
//! are held until the wake, since a sleeping cache frees nothing; frees and `record_stream` of
//! other memory go on as before. A sleep waits for the work queued on the streams its blocks
//! were allocated and freed on, and for the streams `Tensor.record_stream` named (events, not
//! a device-wide synchronize). What it cannot see is the caller's to order: from the sleep until
//! the wake no work may use a sleeping tensor's memory, and work queued on other streams that
//! use it must have completed (PyTorch asks the same of a free without `record_stream`).

use crate::backend::{AllocatorBackend, Figures, is_unknown_block, unknown_block};
use crate::cache::{BlockSource, CacheBackend};
use crate::graphs::DeferredFree;
use cuda_mem::caching::Keep;
use cuda_mem::resource::StreamRef;
use cuda_mem::{CudaError, ErrorKind, Result};
use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A region's tag: its name's number (from 1; [`NO_TAG`] for none).
pub type Tag = u32;

/// No tag: allocations come from the device's main cache.
pub const NO_TAG: Tag = 0;

/// The longest tag name.
pub const MAX_NAME: usize = 64;

/// Tag names, by number - 1. Names are never forgotten (a handful per process).
static NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

thread_local! {
    /// The calling thread's current tag.
    static CURRENT: Cell<Tag> = const { Cell::new(NO_TAG) };
}

fn names() -> MutexGuard<'static, Vec<String>> {
    // The list is consistent at every point a panic could leave it.
    NAMES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The tag named `name`, numbered now if it is new. Refused: an empty name, one longer than
/// [`MAX_NAME`] bytes, or one with whitespace or control characters (names are printed in
/// whitespace-separated figures).
pub fn tag_named(name: &str) -> Result<Tag> {
    let bad = |why| Err(CudaError::new(ErrorKind::InvalidArgument(why), format!("region tag {name:?}")));
    if name.is_empty() || name.len() > MAX_NAME {
        return bad("a tag is 1 to 64 bytes long");
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("a tag holds no whitespace or control characters");
    }
    let mut names = names();
    if let Some(index) = names.iter().position(|n| n == name) {
        return Ok(index as Tag + 1);
    }
    names.push(name.to_owned());
    Ok(names.len() as Tag)
}

/// The tag named `name`, if a region used it; else an error saying so.
pub fn existing_tag(name: &str) -> Result<Tag> {
    match names().iter().position(|n| n == name) {
        Some(index) => Ok(index as Tag + 1),
        None => {
            let kind = ErrorKind::InvalidArgument("no region has this tag");
            Err(CudaError::new(kind, format!("region tag {name:?}")))
        }
    }
}

/// The name of `tag`, if it has one.
pub fn name_of(tag: Tag) -> Option<String> {
    names().get((tag as usize).checked_sub(1)?).cloned()
}

/// The calling thread's current tag ([`NO_TAG`] while its storage is torn down).
#[inline]
pub fn current() -> Tag {
    CURRENT.try_with(Cell::get).unwrap_or(NO_TAG)
}

/// Makes `tag` the calling thread's current tag; returns the one it replaces, for [`leave`].
pub fn enter(tag: Tag) -> Tag {
    CURRENT.try_with(|current| current.replace(tag)).unwrap_or(NO_TAG)
}

/// Puts back the tag [`enter`] returned. Refused, changing nothing: a tag no name has.
pub fn leave(previous: Tag) -> Result<()> {
    if previous != NO_TAG && name_of(previous).is_none() {
        let kind = ErrorKind::InvalidArgument("a tag no region has");
        return Err(CudaError::new(kind, format!("leaving a region for tag {previous}")));
    }
    let _ = CURRENT.try_with(|current| current.set(previous));
    Ok(())
}

/// A backend whose memory can sleep and wake.
pub trait RegionBackend: AllocatorBackend {
    /// Returns the blocks held back for other streams (waiting for their work), gives the free
    /// memory back, then the memory behind the blocks still allocated, keeping their addresses
    /// (and their bytes with [`Keep::Contents`]). Returns the bytes of the latter.
    ///
    /// # Safety
    /// Until a wake succeeds, no work uses any block's memory and no block is freed; no
    /// allocation is in progress; work on other streams than the blocks' own and those
    /// `record_stream` named has completed.
    unsafe fn sleep(&self, keep: Keep) -> Result<usize>;

    /// New memory at the sleeping blocks' addresses, with their kept bytes; the bytes mapped.
    /// Out of memory leaves the backend asleep with what it kept.
    fn wake(&self) -> Result<usize>;

    /// Bytes of pinned host memory the sleeps hold.
    fn host_backup_bytes(&self) -> usize;

    /// Frees the pinned host memory kept for the next sleep (not what holds a sleeping region's
    /// bytes); returns its bytes.
    fn release_host_backups(&self) -> usize;
}

impl<S: BlockSource> RegionBackend for CacheBackend<S> {
    unsafe fn sleep(&self, keep: Keep) -> Result<usize> {
        // Waits for the fences of blocks held back for other streams, and returns them.
        self.release_cached()?;
        // SAFETY: forwarded from the caller; no block is held back any more.
        unsafe { self.source().sleep(keep) }
    }

    fn wake(&self) -> Result<usize> {
        self.source().wake()
    }

    fn host_backup_bytes(&self) -> usize {
        self.source().host_backup_bytes()
    }

    fn release_host_backups(&self) -> usize {
        self.source().release_host_backups()
    }
}

/// Where regions get their caches.
pub trait RegionMemory: Send + Sync + fmt::Debug {
    /// A new, empty backend for one region.
    fn create(&self) -> Result<Box<dyn RegionBackend>>;
}

/// One region's figures on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStats {
    /// The region's tag.
    pub tag: Tag,
    /// Bytes handed to PyTorch and not freed (frees held during a sleep count as freed).
    pub allocated: usize,
    /// Blocks handed to PyTorch and not freed.
    pub blocks: usize,
    /// Bytes of device memory the region's cache holds.
    pub reserved: usize,
    /// The sleep's [`Keep`] while the region sleeps.
    pub asleep: Option<Keep>,
    /// Bytes of device memory the sleep gave back (0 while awake).
    pub slept: usize,
    /// Bytes of pinned host memory the region's sleeps hold.
    pub host_backup: usize,
}

/// A sleep underway.
struct Asleep {
    keep: Keep,
    slept: usize,
    /// Frees made while asleep, made at the wake.
    frees: Vec<DeferredFree>,
}

struct Region {
    tag: Tag,
    /// Created at the region's first allocation on the device.
    backend: Option<Box<dyn RegionBackend>>,
    allocated: usize,
    blocks: usize,
    asleep: Option<Asleep>,
}

impl Region {
    fn backend(&mut self, memory: &dyn RegionMemory, holding: bool, count: &AtomicUsize) -> Result<&dyn RegionBackend> {
        if self.backend.is_none() {
            let backend = memory.create()?;
            backend.hold_event_queries(holding);
            self.backend = Some(backend);
            count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(self.backend.as_deref().expect("created above"))
    }
}

/// One device's regions.
pub struct Regions {
    memory: Box<dyn RegionMemory>,
    /// Regions with a cache (read without the lock when the main backend refuses a free).
    with_memory: AtomicUsize,
    /// A CUDA graph capture is underway.
    holding: AtomicBool,
    regions: Mutex<Vec<Region>>,
}

impl fmt::Debug for Regions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Regions").field("memory", &self.memory).field("stats", &self.stats()).finish()
    }
}

impl Regions {
    /// No regions yet; their caches will come from `memory`.
    pub fn new(memory: Box<dyn RegionMemory>) -> Self {
        Self { memory, with_memory: AtomicUsize::new(0), holding: AtomicBool::new(false), regions: Mutex::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Region>> {
        // Every region is consistent at every point a panic could leave it.
        self.regions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// True once some region holds memory on the device.
    #[inline]
    pub fn any(&self) -> bool {
        self.with_memory.load(Ordering::Relaxed) > 0
    }

    /// `bytes` for region `tag` on `stream`; refused while the region sleeps.
    pub fn allocate(&self, tag: Tag, bytes: usize, stream: StreamRef<'static>) -> Result<NonNull<u8>> {
        let mut regions = self.lock();
        let region = region_mut(&mut regions, tag);
        if region.asleep.is_some() {
            return Err(refused("an allocation in a sleeping region", tag));
        }
        let ptr = region
            .backend(&*self.memory, self.holding.load(Ordering::Relaxed), &self.with_memory)?
            .allocate(bytes, stream)?;
        region.allocated += bytes;
        region.blocks += 1;
        Ok(ptr)
    }

    /// Frees a region's block as [`AllocatorBackend::deallocate`] does, or holds the free until
    /// the wake while the region sleeps. `Ok(false)`: no region handed `ptr` out.
    ///
    /// # Safety
    /// As [`AllocatorBackend::deallocate`].
    pub unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'static>) -> Result<bool> {
        if !self.any() {
            return Ok(false);
        }
        let mut regions = self.lock();
        let Some(region) = find(&mut regions, ptr, bytes)? else { return Ok(false) };
        let backend = region.backend.as_deref().expect("a region that handed out memory has a cache");
        match &mut region.asleep {
            Some(asleep) => asleep.frees.push(DeferredFree { ptr, bytes, stream }),
            // SAFETY: forwarded from the caller; `find` saw the block live with this size.
            None => unsafe { backend.deallocate(ptr, bytes, stream) }?,
        }
        region.allocated -= bytes;
        region.blocks -= 1;
        Ok(true)
    }

    /// The refusal a free would get, `Ok(false)` when no region handed `ptr` out.
    pub fn check_free(&self, ptr: NonNull<u8>, bytes: usize) -> Result<bool> {
        if !self.any() {
            return Ok(false);
        }
        Ok(find(&mut self.lock(), ptr, bytes)?.is_some())
    }

    /// `Tensor.record_stream` for a region's block; `Ok(false)` when none handed `ptr` out.
    pub fn record_stream(&self, ptr: NonNull<u8>, stream: StreamRef<'static>) -> Result<bool> {
        if !self.any() {
            return Ok(false);
        }
        for region in self.lock().iter() {
            if let Some(backend) = &region.backend
                && backend.record_stream(ptr, stream)?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Puts region `tag` to sleep (see the module documentation); returns the bytes of device
    /// memory given back. Refused with [`ErrorKind::SleepState`]: a sleeping region, a CUDA graph
    /// capture underway. A failure of the cache leaves the region awake as it was.
    ///
    /// # Safety
    /// From this call until the wake succeeds, no work uses the memory of the region's blocks;
    /// work queued before it on other streams than their own (and those `record_stream` named)
    /// has completed.
    pub unsafe fn sleep(&self, tag: Tag, keep: Keep) -> Result<usize> {
        let mut regions = self.lock();
        let region = region_mut(&mut regions, tag);
        if region.asleep.is_some() {
            return Err(refused("a sleep of a sleeping region", tag));
        }
        if self.holding.load(Ordering::Relaxed) {
            return Err(refused("a sleep while a CUDA graph capture is underway", tag));
        }
        let slept = match &region.backend {
            // SAFETY: the caller's contract for the blocks' use; the lock keeps allocations and
            // frees of the region out until `asleep` is set, and frees are held from then on.
            Some(backend) => unsafe { backend.sleep(keep) }?,
            None => 0,
        };
        region.asleep = Some(Asleep { keep, slept, frees: Vec::new() });
        Ok(slept)
    }

    /// Wakes region `tag`: its blocks' memory back at their addresses (with their bytes when the
    /// sleep kept them), then the frees made while it slept. Returns the bytes mapped. Refused
    /// with [`ErrorKind::SleepState`] when it is awake; out of memory leaves it asleep with
    /// everything kept, to be tried again.
    pub fn wake(&self, tag: Tag) -> Result<usize> {
        let mut regions = self.lock();
        let region = region_mut(&mut regions, tag);
        if region.asleep.is_none() {
            return Err(refused("a wake of an awake region", tag));
        }
        let woke = match &region.backend {
            Some(backend) => backend.wake()?,
            None => 0,
        };
        let asleep = region.asleep.take().expect("checked above");
        let backend = region.backend.as_deref();
        for free in asleep.frees {
            // SAFETY: freed by PyTorch while the region slept, under `deallocate`'s contract,
            // and found live with this size then (a second free of it was refused); held until
            // the memory was back. The backend frees it now in the order of `free.stream`.
            let _ = unsafe { backend.expect("a block implies a cache").deallocate(free.ptr, free.bytes, free.stream) };
        }
        Ok(woke)
    }

    /// True while region `tag` sleeps on this device.
    pub fn is_asleep(&self, tag: Tag) -> bool {
        self.lock().iter().any(|r| r.tag == tag && r.asleep.is_some())
    }

    /// Every region's figures on the device, by tag.
    pub fn stats(&self) -> Vec<RegionStats> {
        let mut stats: Vec<_> = self
            .lock()
            .iter()
            .map(|region| RegionStats {
                tag: region.tag,
                allocated: region.allocated,
                blocks: region.blocks,
                reserved: region.backend.as_ref().map_or(0, |b| b.figures().reserved.current),
                asleep: region.asleep.as_ref().map(|a| a.keep),
                slept: region.asleep.as_ref().map_or(0, |a| a.slept),
                host_backup: region.backend.as_ref().map_or(0, |b| b.host_backup_bytes()),
            })
            .collect();
        stats.sort_by_key(|s| s.tag);
        stats
    }

    /// The regions' figures together.
    pub fn figures(&self) -> Figures {
        let regions = self.lock();
        regions.iter().filter_map(|r| r.backend.as_ref()).fold(Figures::default(), |sum, b| sum.plus(b.figures()))
    }

    /// Frees the pinned host memory the regions keep for their next sleeps; returns its bytes.
    pub fn release_host_backups(&self) -> usize {
        self.lock().iter().filter_map(|r| r.backend.as_ref()).map(|b| b.release_host_backups()).sum()
    }

    /// Restarts the regions' reserved peaks.
    pub fn reset_peak(&self) {
        self.lock().iter().filter_map(|r| r.backend.as_ref()).for_each(|b| b.reset_peak());
    }

    /// Returns the cached memory of the awake regions to the driver (a sleeping one holds none).
    pub fn release_cached(&self) -> Result<()> {
        for region in self.lock().iter().filter(|r| r.asleep.is_none()) {
            if let Some(backend) = &region.backend {
                backend.release_cached()?;
            }
        }
        Ok(())
    }

    /// While `hold` (a CUDA graph capture is underway), the regions' caches make no event query
    /// or record of their own accord, and no region sleeps.
    pub fn hold_event_queries(&self, hold: bool) {
        let regions = self.lock();
        self.holding.store(hold, Ordering::Relaxed);
        regions.iter().filter_map(|r| r.backend.as_ref()).for_each(|b| b.hold_event_queries(hold));
    }
}

/// Region `tag`, created (with no cache yet) if the device has none.
fn region_mut(regions: &mut Vec<Region>, tag: Tag) -> &mut Region {
    let index = match regions.iter().position(|r| r.tag == tag) {
        Some(index) => index,
        None => {
            regions.push(Region { tag, backend: None, allocated: 0, blocks: 0, asleep: None });
            regions.len() - 1
        }
    };
    &mut regions[index]
}

/// The region that handed out the live block at `ptr`, if one did; an error for a wrong size, or
/// for a block whose free is held already (a second free during a sleep).
fn find(regions: &mut [Region], ptr: NonNull<u8>, bytes: usize) -> Result<Option<&mut Region>> {
    for region in regions.iter_mut() {
        let Some(backend) = &region.backend else { continue };
        if region.asleep.as_ref().is_some_and(|a| a.frees.iter().any(|f| f.ptr == ptr)) {
            return Err(unknown_block(ptr, bytes));
        }
        match backend.check_free(ptr, bytes) {
            Ok(()) => return Ok(Some(region)),
            Err(err) if is_unknown_block(&err) => continue,
            Err(err) => return Err(err),
        }
    }
    Ok(None)
}

fn refused(why: &'static str, tag: Tag) -> CudaError {
    let name = name_of(tag).unwrap_or_else(|| format!("#{tag}"));
    CudaError::new(ErrorKind::SleepState(why), format!("region {name:?}"))
}

#[cfg(test)]
mod tests;
