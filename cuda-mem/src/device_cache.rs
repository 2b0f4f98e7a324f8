//! `DeviceCache` and `CachedBuffer`: the caching allocator of [`crate::caching`] over the CUDA
//! runtime. Memory comes from the driver's virtual memory management where the device has it
//! (growable segments: an address range per stream and pool, mapped page by page, see
//! [`VmmPages`]), else from `cudaMalloc` segments; fences are events.
//!
//! Not from a `MemPool`: a hit never reaches the runtime, so the source only matters on a miss,
//! where mapped pages and `cudaMalloc` give memory usable on every stream at once (a pool
//! allocation is ordered on the stream that made it), and returning memory needs no stream.

use crate::caching::{
    Backend, CachedBlock, CachingAllocator, CachingStats, ClassStats, Config, CurrentPeak, Keep, Mapped, MappingPlan,
    Pages, StreamKey,
};
use crate::device::{CurrentDevice, Device};
use crate::error::{CudaError, ErrorKind, Result};
use crate::maybe_owned::MaybeOwned;
use crate::pool_stats::PoolStats;
use crate::raw;
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream::Event;
use crate::stream::uses::StreamUses;
use crate::stream::{Stream, StreamRef};
use bytemuck::Pod;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock, PoisonError};

mod evictions;
mod pinned_arena;
mod sleep;
use crate::memory::sealed::{Owner, Residence, UnseenUsers};
use crate::memory::{DeviceMemory, StreamOrdered};
use evictions::Evictions;
pub use sleep::{SleepError, SleepingCache};

/// The runtime behind a [`DeviceCache`]: pages or `cudaMalloc` segments on one device, events as
/// fences.
#[derive(Debug)]
pub struct CudaSegments {
    device: Device,
    /// Whether the device's driver manages virtual memory, asked on the first miss (so that a
    /// cache is made without a CUDA call).
    pages: OnceLock<Option<VmmPages>>,
}

impl CudaSegments {
    fn new(device: Device) -> Self {
        Self { device, pages: OnceLock::new() }
    }
}

/// Pages of device memory through the driver (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
/// `cuMemSetAccess`, `cuMemUnmap`): a miss maps kept allocations again, or new ones, as
/// [`MappingPlan`] lays them out; each allocation is mapped whole and goes back whole.
///
/// What this means for what users do with a [`DeviceCache`]'s memory:
/// - **Other devices** get access only through the driver's access list, which names the cache's
///   device alone: `cudaDeviceEnablePeerAccess` does not reach mapped pages, so a kernel of
///   another device reading a block faults. For memory other devices use, build the cache with
///   `Config { expandable_segments: false, .. }` (segments from `cudaMalloc`, which peer access
///   covers) or use [`DeviceBuffer`](crate::DeviceBuffer).
/// - **IPC**: a cached block has no export (`cudaIpcGetMemHandle` would refuse mapped pages, and
///   a block's segment outlives it anyway): export `DeviceBuffer`s or a pool made for IPC
///   ([`crate::ipc`]). The compiler says so:
///
/// ```compile_fail,E0599
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, DeviceCache, Stream};
/// let cache = DeviceCache::new(Device::current()?)?;
/// let stream = Stream::non_blocking()?;
/// let block = cache.zeroed::<u8>(&stream, 1024)?;
/// let _ = block.export_ipc();
/// # Ok(()) }
/// ```
/// - **CUDA graphs** capture kernels on blocks like any memory; graphs' private pools
///   ([`GraphPool`](crate::GraphPool)) take their segments from `cudaMalloc` and are unaffected.
/// - **NCCL** registers and uses mapped memory as it does PyTorch's expandable segments.
#[derive(Debug)]
pub struct VmmPages {
    device: Device,
    page: usize,
    range: usize,
    store: Mutex<MappingStore>,
    /// What a sleep gave back and kept ([`Pages::evict`]).
    evictions: Mutex<Evictions>,
}

/// The physical memory of a cache: allocations (`cuMemCreate`), each mapped whole at one address
/// or kept unmapped for a later map, so that memory moving between streams or sizes costs a
/// `cuMemUnmap` and a `cuMemMap`, never a `cuMemCreate` and `cuMemRelease`.
#[derive(Debug, Default)]
struct MappingStore {
    /// Live mappings: address -> (handle, bytes).
    mapped: HashMap<u64, (u64, usize)>,
    /// Allocations mapped nowhere, by bytes.
    kept: BTreeMap<usize, Vec<u64>>,
}

impl MappingStore {
    /// Kept allocations by bytes, counted: what [`MappingPlan`] chooses from.
    fn kept_counts(&self) -> BTreeMap<usize, usize> {
        self.kept.iter().map(|(&bytes, handles)| (bytes, handles.len())).collect()
    }

    fn keep(&mut self, handle: u64, bytes: usize) {
        self.kept.entry(bytes).or_default().push(handle);
    }

    fn take_kept(&mut self, bytes: usize) -> Option<u64> {
        let handles = self.kept.get_mut(&bytes)?;
        let handle = handles.pop();
        if handles.is_empty() {
            self.kept.remove(&bytes);
        }
        handle
    }
}

/// The runs `(address, bytes)` (in address order) joined where one ends where the next begins.
fn contiguous(runs: &[(u64, usize)]) -> Vec<(u64, usize)> {
    let mut spans: Vec<(u64, usize)> = Vec::with_capacity(runs.len());
    for &(at, bytes) in runs {
        match spans.last_mut() {
            Some((start, len)) if *start + *len as u64 == at => *len += bytes,
            _ => spans.push((at, bytes)),
        }
    }
    spans
}

impl VmmPages {
    /// The device's pages, if its driver manages virtual memory.
    fn probe(device: Device) -> Result<Option<Self>> {
        let _device = CurrentDevice::set(device)?;
        let Some(page) = raw::vmm::page_bytes(device.as_raw())? else { return Ok(None) };
        let (_, total) = raw::device::mem_info()?;
        let range = total.next_multiple_of(page);
        Ok(Some(Self { device, page, range, store: Mutex::default(), evictions: Mutex::default() }))
    }

    fn store(&self) -> std::sync::MutexGuard<'_, MappingStore> {
        // Plain map operations: a panic elsewhere leaves them consistent.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn evictions(&self) -> std::sync::MutexGuard<'_, Evictions> {
        // Lists changed only once their copies succeeded: a panic leaves them consistent.
        self.evictions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes of pinned host memory the sleeps hold: backups of evicted mappings, and spare ones
    /// kept for the next sleep.
    pub fn host_backup_bytes(&self) -> usize {
        self.evictions().host_bytes()
    }

    /// Frees the pinned backups kept for a later sleep; returns their bytes.
    fn release_host_backups(&self) -> usize {
        self.evictions().drop_spares()
    }

    /// Unmaps and releases the mappings at `runs`, taking them out of the store; returns the runs
    /// unmapped (a mapping the driver would not unmap stays mapped and in the store).
    ///
    /// # Safety
    /// No work uses the runs.
    unsafe fn unmap_and_release(&self, runs: &[(u64, usize)]) -> Vec<(u64, usize)> {
        let mut store = self.store();
        let mut unmapped = Vec::with_capacity(runs.len());
        for &(at, bytes) in runs {
            let Some(&(handle, _)) = store.mapped.get(&at) else { continue };
            // SAFETY: a whole mapping of the store, unused (the caller's contract).
            if unsafe { raw::vmm::unmap(at, bytes) }.is_ok() {
                store.mapped.remove(&at);
                // SAFETY: created by `map`, mapped nowhere now, released once.
                raw::quiet(unsafe { raw::vmm::release(handle) });
                unmapped.push((at, bytes));
            }
        }
        unmapped
    }

    /// Maps `kept` allocations (taken out of the store) and then new ones of `new` bytes each,
    /// one after another from `at`, and gives the run access; on failure unmaps what it mapped
    /// and gives back the allocations (the created ones released, the kept ones kept). Returns
    /// each mapping's handle and bytes, in address order.
    ///
    /// # Safety
    /// As `Pages::map`: the run is unmapped pages of a reserved range; `kept` mapped nowhere.
    unsafe fn map_run(&self, at: u64, kept: &[(u64, usize)], new: &[usize]) -> Result<Vec<(u64, usize)>> {
        let device = self.device.as_raw();
        // (handle, bytes, created by this call), in address order.
        let mut mapped: Vec<(u64, usize, bool)> = Vec::with_capacity(kept.len() + new.len());
        let mut end = at;
        let result = (|| {
            for &(handle, bytes) in kept {
                // SAFETY: unmapped pages of the run (the caller's contract); a kept allocation of
                // `bytes`, mapped nowhere.
                unsafe { raw::vmm::map(end, bytes, handle) }?;
                mapped.push((handle, bytes, false));
                end += bytes as u64;
            }
            for &bytes in new {
                let handle = raw::vmm::create(bytes, device)?;
                // SAFETY: as above, with an allocation of `bytes` created just now.
                if let Err(err) = unsafe { raw::vmm::map(end, bytes, handle) } {
                    // SAFETY: created just now, mapped nowhere.
                    raw::quiet(unsafe { raw::vmm::release(handle) });
                    return Err(err);
                }
                mapped.push((handle, bytes, true));
                end += bytes as u64;
            }
            // SAFETY: the run is mapped, just now.
            unsafe { raw::vmm::set_access(at, (end - at) as usize, device) }
        })();
        if let Err(err) = result {
            let mut store = self.store();
            let mut address = at;
            for &(handle, bytes, created) in &mapped {
                // SAFETY: a mapping made above, which no work has used.
                let unmapped = unsafe { raw::vmm::unmap(address, bytes) };
                address += bytes as u64;
                if created {
                    // SAFETY: created by this call and, once unmapped, mapped nowhere (a mapping
                    // the driver would not unmap keeps its allocation: leaked, not released).
                    raw::quiet(unmapped.and_then(|()| unsafe { raw::vmm::release(handle) }));
                } else if unmapped.is_ok() {
                    store.keep(handle, bytes);
                }
            }
            let kept_mapped = mapped.iter().filter(|&&(_, _, created)| !created).count();
            for &(handle, bytes) in &kept[kept_mapped..] {
                store.keep(handle, bytes);
            }
            return Err(err);
        }
        Ok(mapped.into_iter().map(|(handle, bytes, _)| (handle, bytes)).collect())
    }
}

// SAFETY: `reserve` returns a fresh range of the driver's, aligned to a page (a power of two,
// the driver's granularity), that overlaps no live range; `map` backs the run (at least `bytes`,
// at most `room`, as `MappingPlan` lays it out) with allocations of the cache's device that the
// store holds alone (kept ones mapped nowhere, or new ones), with read-write access from it,
// returns their sizes in address order and how many bytes were kept ones, and leaves nothing
// mapped (and every kept allocation kept) when it fails; `unmap` moves allocations to the kept
// lists only after the callers' contract (no work uses them) and `release_kept` releases only
// kept ones; `free` follows the callers' contract. Every call runs with the cache's device
// current.
unsafe impl Pages for VmmPages {
    type Error = CudaError;

    fn page_bytes(&self) -> usize {
        self.page
    }

    fn range_bytes(&self) -> usize {
        self.range
    }

    fn reserve(&self, bytes: usize) -> Result<NonNull<u8>> {
        let _device = CurrentDevice::set(self.device)?;
        let base = raw::vmm::reserve(bytes, self.page)?;
        NonNull::new(base as *mut u8)
            .ok_or_else(|| CudaError::new(ErrorKind::InvalidArgument("a null range"), "cuMemAddressReserve"))
    }

    unsafe fn map(&self, at: NonNull<u8>, bytes: usize, room: usize, max_new: usize) -> Result<Mapped> {
        let _device = CurrentDevice::set(self.device)?;
        let (kept, new) = {
            let mut store = self.store();
            let plan = MappingPlan::new(bytes, room, &store.kept_counts(), self.page, max_new);
            let kept: Vec<(u64, usize)> = (plan.kept.iter())
                .map(|&size| (store.take_kept(size).expect("a plan takes kept allocations the store has"), size))
                .collect();
            (kept, plan.new)
        };
        let from_kept = kept.iter().map(|&(_, size)| size).sum();
        let at = at.as_ptr() as u64;
        // SAFETY: unmapped pages of a reserved range, `room` bytes of them (the caller's
        // contract), of which the plan takes at most `room`; the kept allocations are out of the
        // store, mapped nowhere.
        let handles = unsafe { self.map_run(at, &kept, &new)? };
        let mut store = self.store();
        let mut address = at;
        let mut mappings = Vec::with_capacity(handles.len());
        for (handle, size) in handles {
            store.mapped.insert(address, (handle, size));
            address += size as u64;
            mappings.push(size);
        }
        Ok(Mapped { bytes: (address - at) as usize, from_kept, mappings })
    }

    unsafe fn unmap(&self, at: NonNull<u8>, bytes: usize) {
        let device = CurrentDevice::set(self.device);
        let (mut address, end) = (at.as_ptr() as u64, at.as_ptr() as u64 + bytes as u64);
        while address < end {
            let Some((handle, size)) = self.store().mapped.remove(&address) else {
                debug_assert!(false, "an unmap of whole mappings starts at one");
                break;
            };
            // SAFETY: a whole mapping made by `map`, no longer used (the caller's contract).
            let unmapped = unsafe { raw::vmm::unmap(address, size) };
            if unmapped.is_ok() {
                self.store().keep(handle, size);
            }
            // Else it may still be mapped: dropped from the store, leaked rather than mapped twice.
            raw::quiet(unmapped);
            address += size as u64;
        }
        drop(device);
    }

    fn release_kept(&self) -> usize {
        let kept = std::mem::take(&mut self.store().kept);
        let device = CurrentDevice::set(self.device);
        let mut bytes = 0;
        for (size, handles) in kept {
            for handle in handles {
                // SAFETY: a kept allocation: created by `map`, mapped nowhere, released once
                // (taken out of the store).
                raw::quiet(unsafe { raw::vmm::release(handle) });
                bytes += size;
            }
        }
        drop(device);
        bytes
    }

    unsafe fn free(&self, base: NonNull<u8>, bytes: usize) {
        let device = CurrentDevice::set(self.device);
        // SAFETY: a range from `reserve`, nothing mapped, freed once (the caller's contract).
        raw::quiet(unsafe { raw::vmm::free(base.as_ptr() as u64, bytes) });
        drop(device);
    }

    unsafe fn evict(&self, keep: Keep) -> Result<usize> {
        let _device = CurrentDevice::set(self.device)?;
        let mut evictions = self.evictions();
        let runs: Vec<(u64, usize)> = self.store().mapped.iter().map(|(&at, &(_, bytes))| (at, bytes)).collect();
        if keep == Keep::Nothing {
            // SAFETY: live mappings, unused until the restore (the caller's contract). A mapping
            // the driver would not unmap stays mapped and out of the evicted list.
            let unmapped = unsafe { self.unmap_and_release(&runs) };
            evictions.keep_only(&unmapped, false);
            return Ok(unmapped.iter().map(|&(_, bytes)| bytes).sum());
        }
        // Each batch is unmapped once its bytes are saved, while the next batch's copies run; the
        // allocations are released only once every copy succeeded, so that an error can map them
        // back with their bytes.
        let mut unmapped: Vec<(u64, u64, usize)> = Vec::with_capacity(runs.len());
        let unmap_batch = |batch: &[(u64, usize)]| {
            let mut store = self.store();
            for &(at, bytes) in batch {
                let Some(&(handle, _)) = store.mapped.get(&at) else { continue };
                // SAFETY: a whole mapping of the store, unused (the caller's contract) and read
                // by no copy any more (`save` passes a batch once its copies completed). One the
                // driver would not unmap stays mapped, with its contents.
                if unsafe { raw::vmm::unmap(at, bytes) }.is_ok() {
                    store.mapped.remove(&at);
                    unmapped.push((at, handle, bytes));
                }
            }
        };
        // SAFETY: live mappings, unused until the restore (the caller's contract).
        let saved = unsafe { evictions.save(self.device, &runs, unmap_batch) };
        if let Err(err) = saved {
            let device = self.device.as_raw();
            let mut store = self.store();
            for (at, handle, bytes) in unmapped {
                // SAFETY: the allocation unmapped from `at` above, mapped nowhere since, with its
                // bytes; its address is free. (A driver that refuses this has failed for good:
                // the allocation is then leaked.)
                if unsafe { raw::vmm::map(at, bytes, handle).and_then(|()| raw::vmm::set_access(at, bytes, device)) }
                    .is_ok()
                {
                    store.mapped.insert(at, (handle, bytes));
                }
            }
            return Err(err);
        }
        for &(_, handle, _) in &unmapped {
            // SAFETY: unmapped above, mapped nowhere, released once.
            raw::quiet(unsafe { raw::vmm::release(handle) });
        }
        let unmapped: Vec<(u64, usize)> = unmapped.into_iter().map(|(at, _, bytes)| (at, bytes)).collect();
        evictions.keep_only(&unmapped, true);
        Ok(unmapped.iter().map(|&(_, bytes)| bytes).sum())
    }

    fn restore(&self) -> Result<usize> {
        let _device = CurrentDevice::set(self.device)?;
        let mut evictions = self.evictions();
        let device = self.device.as_raw();
        let mut mapped: Vec<(u64, u64, usize)> = Vec::new();
        let map_batch = |batch: &[(u64, usize)]| {
            for &(at, bytes) in batch {
                let handle = raw::vmm::create(bytes, device)?;
                // SAFETY: the address of an evicted mapping: reserved, mapped nowhere (the store
                // has no mapping there while it is evicted); an allocation of its size made now.
                if let Err(err) = unsafe { raw::vmm::map(at, bytes, handle) } {
                    // SAFETY: created just now, mapped nowhere.
                    raw::quiet(unsafe { raw::vmm::release(handle) });
                    return Err(err);
                }
                mapped.push((at, handle, bytes));
            }
            for (at, bytes) in contiguous(batch) {
                // SAFETY: mapped just now, every mapping of the span. A span over two reserved
                // ranges that happen to touch may be refused: then each mapping on its own.
                if unsafe { raw::vmm::set_access(at, bytes, device) }.is_err() {
                    for &(at, bytes) in batch.iter().filter(|&&(a, _)| a >= at && a < at + bytes as u64) {
                        // SAFETY: as above, one mapping.
                        unsafe { raw::vmm::set_access(at, bytes, device) }?;
                    }
                }
            }
            Ok(())
        };
        // SAFETY: `map_batch` maps each batch, with access, before `restore` copies into it;
        // nothing else uses it: the cache hands out nothing before the wake returns.
        let result = unsafe { evictions.restore(self.device, map_batch) };
        if let Err(err) = result {
            for (at, handle, bytes) in mapped {
                // SAFETY: mapped by this call and unused (no copy is pending after the error).
                if unsafe { raw::vmm::unmap(at, bytes) }.is_ok() {
                    // SAFETY: created by this call, mapped nowhere now, released once (one the
                    // driver would not unmap is leaked rather than released under its mapping).
                    raw::quiet(unsafe { raw::vmm::release(handle) });
                }
            }
            return Err(err);
        }
        let mut store = self.store();
        let mut bytes = 0;
        for (at, handle, size) in mapped {
            store.mapped.insert(at, (handle, size));
            bytes += size;
        }
        Ok(bytes)
    }
}

// SAFETY: the promises of `Backend` hold:
// - `allocate` returns fresh `cudaMalloc` memory (256-byte aligned) that no live segment overlaps;
// - a fence is an event recorded on the stream after its queued work: `is_done` is its query
//   (a failed query means a broken context, where no work runs any more), `wait` its
//   synchronize, `stream_wait` a `cudaStreamWaitEvent`;
// - a `Stream` value names one stream while it lives: the buffers and `alloc_block` refuse the
//   per-thread stream, and every stream of one cache belongs to the cache's device, so the legacy
//   handle (0) means that device's legacy stream (`Stream::call` makes the device current for
//   it); a borrowed stream stays valid while any clone lives (`Stream::borrow_raw`'s contract).
unsafe impl Backend for CudaSegments {
    type Stream = Stream;
    type Fence = Event;
    type Error = CudaError;

    #[inline]
    fn key(stream: &Stream) -> StreamKey {
        StreamKey(stream.as_raw() as usize)
    }

    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>> {
        let _device = CurrentDevice::set(self.device)?;
        let fresh = raw::memory::malloc(bytes, self.device.as_raw())?;
        // SAFETY: allocated just now, never used.
        raw::typed::<u8>(fresh, "DeviceCache segment", |p| unsafe { raw::memory::free(p, || "a segment".into()) })
    }

    unsafe fn release(&self, base: NonNull<u8>, bytes: usize) {
        let device = CurrentDevice::set(self.device);
        // SAFETY: a segment of this backend, released once, with no pending work (the caller's
        // contract); cudaFree waits for the device anyway.
        raw::quiet(unsafe { raw::memory::free(base.as_ptr().cast(), || format!("a {bytes}-byte segment")) });
        drop(device);
    }

    fn record(&self, stream: &Stream) -> Result<Event> {
        // A fence's event is made on the stream's device (the cache's), whichever is current:
        // a free may come from a thread with another device current (PyTorch frees so).
        Event::fence(stream)
    }

    fn is_done(&self, fence: &Event) -> bool {
        fence.allows_reuse()
    }

    fn wait(&self, fence: &Event) -> Result<()> {
        fence.synchronize()
    }

    fn stream_wait(&self, stream: &Stream, fence: &Event) -> Result<()> {
        stream.wait_event(fence)
    }

    fn pages(&self) -> Option<&dyn Pages<Error = CudaError>> {
        // A failed probe (a broken context) leaves the cache on `cudaMalloc` segments, whose
        // own calls then report the failure.
        let pages = self.pages.get_or_init(|| VmmPages::probe(self.device).ok().flatten());
        pages.as_ref().map(|p| p as &dyn Pages<Error = CudaError>)
    }
}

/// A caching allocator of device memory for one device, faster than stream-ordered allocation
/// on a hit: a block freed on a stream is reused on that stream at once, from the freeing
/// thread's own cache, without a runtime call or a shared lock. Blocks move between streams only
/// after events show the old stream's work on them is done. See [`crate::caching`] for the
/// design, and [`DeviceCache::stats`] for PyTorch-style figures.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, DeviceCache, Stream};
/// let cache = DeviceCache::for_device(Device::current()?)?;
/// let stream = Stream::non_blocking()?;
/// for _step in 0..1000 {
///     let scratch = cache.zeroed::<f32>(&stream, 1 << 20)?; // a hit after the first step
///     drop(scratch); // back to this thread's cache, reusable on `stream` at once
/// }
/// println!("{:?}", cache.stats());
/// # Ok(()) }
/// ```
pub struct DeviceCache {
    allocator: CachingAllocator<CudaSegments>,
    device: Device,
    /// The stream that orders allocations made through [`MemoryResource`](crate::resource::MemoryResource), which names streams
    /// by raw handle only (see the impl).
    resource_stream: OnceLock<Stream>,
    /// The blocks out through [`MemoryResource`](crate::resource::MemoryResource), by address.
    resource_blocks: Mutex<HashMap<usize, CachedBlock>>,
}

impl fmt::Debug for DeviceCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceCache").field("device", &self.device).field("stats", &self.stats()).finish()
    }
}

impl DeviceCache {
    /// A new cache for `device` with the default [`Config`]. Makes no CUDA call.
    pub fn new(device: Device) -> Result<Self> {
        Self::with_config(device, Config::default())
    }

    /// A new cache for `device` with `config`.
    pub fn with_config(device: Device, config: Config) -> Result<Self> {
        let allocator = CachingAllocator::new(CudaSegments::new(device), config)?;
        Ok(Self { allocator, device, resource_stream: OnceLock::new(), resource_blocks: Mutex::default() })
    }

    /// The process's cache for `device`, created on first use and never dropped.
    pub fn for_device(device: Device) -> Result<&'static DeviceCache> {
        static CACHES: Mutex<Vec<(Device, &'static DeviceCache)>> = Mutex::new(Vec::new());
        let mut caches = CACHES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, cache)) = caches.iter().find(|(d, _)| *d == device) {
            return Ok(cache);
        }
        // Checks the ordinal before anything is cached for it.
        let device = Device::new(device.ordinal())?;
        let cache: &'static DeviceCache = Box::leak(Box::new(Self::new(device)?));
        caches.push((device, cache));
        Ok(cache)
    }

    /// The device the memory lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// `len` elements for use on `stream`, uninitialised.
    ///
    /// # Safety
    /// The contents are whatever the memory held (possibly another buffer's data); the caller
    /// must write every element, in stream order, before reading it.
    #[inline]
    pub unsafe fn uninit<'a, T: Pod>(
        &'a self,
        stream: impl Into<MaybeOwned<'a, Stream>>,
        len: usize,
    ) -> Result<CachedBuffer<'a, T>> {
        let stream = stream.into();
        self.check_stream(&stream, "DeviceCache")?;
        let bytes = raw::byte_len::<T>(len, "DeviceCache")?;
        if align_of::<T>() > 256 {
            let kind = ErrorKind::InvalidArgument("element alignment above 256 bytes");
            return Err(CudaError::new(kind, "DeviceCache"));
        }
        let block = if bytes == 0 { None } else { Some(self.allocator.alloc(bytes, &stream)?) };
        Ok(CachedBuffer { block, len, cache: self, stream, uses: StreamUses::new(), _type: PhantomData })
    }

    /// `len` zeroed elements for use on `stream` (a `cudaMemsetAsync` on it).
    pub fn zeroed<'a, T: Pod>(
        &'a self,
        stream: impl Into<MaybeOwned<'a, Stream>>,
        len: usize,
    ) -> Result<CachedBuffer<'a, T>> {
        // SAFETY: the memset below, queued on the buffer's stream before any other use, writes
        // every byte.
        let buffer = unsafe { self.uninit(stream, len)? };
        buffer.zero_in_stream_order()?;
        Ok(buffer)
    }

    /// A block of at least `bytes` for use on `stream`, as the cache's own handle: for allocators
    /// built on this one that keep their blocks by address (PyTorch's allocator hooks), where a
    /// [`CachedBuffer`] would be in the way. The block is given back with
    /// [`DeviceCache::free_block`] or [`DeviceCache::free_block_on`]; a block never given back
    /// stays allocated, with its segment, for as long as the cache lives. The per-thread default
    /// stream and streams of other devices are refused, as for buffers. While the cache sleeps
    /// ([`DeviceCache::sleep`]) no memory backs the block's address: code that uses the address
    /// (unsafe code, whatever reaches it) must leave it unused from the sleep to the wake.
    #[inline]
    pub fn alloc_block(&self, bytes: usize, stream: &Stream) -> Result<CachedBlock> {
        self.check_stream(stream, "DeviceCache::alloc_block")?;
        Ok(self.allocator.alloc(bytes, stream)?)
    }

    /// Returns `block` for reuse on its own stream at once.
    ///
    /// # Safety
    /// `block` came from this cache's [`DeviceCache::alloc_block`], and every use of its memory is
    /// ordered before the work queued on the block's stream after this call (uses on other streams
    /// included, e.g. through `cudaStreamWaitEvent`; otherwise use [`DeviceCache::free_block_on`]);
    /// the cache is awake (see [`DeviceCache::sleep_in_place`]).
    #[inline]
    pub unsafe fn free_block(&self, block: CachedBlock) {
        // SAFETY: forwarded from the caller.
        unsafe { self.allocator.free(block) }
    }

    /// Returns `block`, last used on `stream`: reusable once the work queued on `stream` so far has
    /// completed (an event recorded there now). On the block's own stream this is
    /// [`DeviceCache::free_block`]. When `stream` is refused (another device's, or the per-thread
    /// stream) or no event can be recorded, the error is returned and the block stays allocated
    /// for good, as it cannot be known when its users' work ends.
    ///
    /// # Safety
    /// `block` came from this cache's [`DeviceCache::alloc_block`], and every use of its memory is
    /// ordered before the work queued on `stream` after this call.
    pub unsafe fn free_block_on(&self, block: CachedBlock, stream: &Stream) -> Result<()> {
        if let Err(err) = self.check_stream(stream, "DeviceCache::free_block_on") {
            keep_out(block);
            return Err(err);
        }
        // SAFETY: forwarded from the caller; the stream is one of this cache's device, never the
        // per-thread one.
        Ok(unsafe { self.allocator.free_on(block, stream) }?)
    }

    #[inline]
    fn check_stream(&self, stream: &Stream, operation: &'static str) -> Result<()> {
        stream.require_orderable(operation)?;
        if stream.device() != self.device {
            return Err(wrong_device(stream, self.device));
        }
        Ok(())
    }

    /// The cache's configuration (a graph pool of the cache sizes its segments by it).
    pub(crate) fn config(&self) -> &Config {
        self.allocator.config()
    }

    /// Restarts every peak of [`DeviceCache::stats`] from its current value.
    pub fn reset_peaks(&self) {
        self.allocator.reset_peaks();
    }

    /// Releases every cached segment no block of which is in use, and unmaps every free page
    /// (all threads' caches included); returns the bytes released.
    pub fn empty_cache(&self) -> usize {
        self.allocator.empty_cache()
    }

    /// The bytes of a page when the cache grows by mapping pages (the driver manages virtual
    /// memory and the config's `expandable_segments` is on); `None` when it allocates whole
    /// segments with `cudaMalloc`. Asks the driver on the first call.
    pub fn page_bytes(&self) -> Option<usize> {
        self.allocator.page_bytes()
    }

    /// The cache's pages, if it has probed them (no CUDA call).
    fn vmm_pages(&self) -> Option<&VmmPages> {
        self.allocator.backend().pages.get().and_then(Option::as_ref)
    }

    /// Allocated, requested, active and reserved bytes (current and peak), fragmentation (the
    /// largest free block against all free bytes), segment allocations and releases, hits and
    /// misses.
    pub fn stats(&self) -> CachingStats {
        self.allocator.stats()
    }

    /// Bytes taken from the device now and at the peak (as in [`DeviceCache::stats`]) without a
    /// lock: cheap enough to watch the reserve after every allocation.
    pub fn reserved(&self) -> CurrentPeak {
        self.allocator.reserved()
    }

    /// The same per size class.
    pub fn class_stats(&self) -> Vec<ClassStats> {
        self.allocator.class_stats()
    }

    fn resource_stream(&self) -> Result<&Stream> {
        if let Some(stream) = self.resource_stream.get() {
            return Ok(stream);
        }
        let stream = Stream::on_device(self.device)?;
        Ok(self.resource_stream.get_or_init(|| stream))
    }
}

/// Keeps a block out of the cache for good: a handle that is not given back leaves its block, and
/// the block's segment, allocated until the process ends. For blocks whose users' work could not
/// be ordered before a reuse.
fn keep_out(block: CachedBlock) {
    let _ = block;
}

#[cold]
fn wrong_device(stream: &Stream, device: Device) -> CudaError {
    let kind = ErrorKind::InvalidArgument("the stream belongs to another device than the cache");
    CudaError::new(kind, format!("DeviceCache of {device} used with a stream of {}", stream.device()))
}

/// `len` elements of device memory from a [`DeviceCache`], ordered on a stream: the
/// [`StreamBuffer`](crate::StreamBuffer) contract. Dropping it returns the block to the cache
/// for reuse on its stream at once (work queued there later runs after every use queued before),
/// after making its stream wait for every stream passed to [`CachedBuffer::use_on`].
pub struct CachedBuffer<'a, T: Pod> {
    /// `None` for zero elements.
    block: Option<CachedBlock>,
    len: usize,
    cache: &'a DeviceCache,
    stream: MaybeOwned<'a, Stream>,
    uses: StreamUses,
    _type: PhantomData<T>,
}

// SAFETY: the buffer owns its block exclusively (like `StreamBuffer`); the thread it moves to may
// queue work on it through views and free it, which returns the block to that thread's cache
// under the buffer's stream (never the per-thread stream: refused at allocation). The cache and
// streams are Sync.
unsafe impl<T: Pod> Send for CachedBuffer<'_, T> {}
// SAFETY: shared access only gives shared device views.
unsafe impl<T: Pod> Sync for CachedBuffer<'_, T> {}

impl<T: Pod> fmt::Debug for CachedBuffer<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedBuffer")
            .field("ptr", &self.ptr())
            .field("len", &self.len)
            .field("stream", &*self.stream)
            .finish()
    }
}

impl<'a, T: Pod> CachedBuffer<'a, T> {
    #[inline]
    fn ptr(&self) -> *mut T {
        self.block.as_ref().map_or(NonNull::dangling().as_ptr(), |b| b.ptr().as_ptr().cast())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream the block is ordered on and returns to.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// A shared view, ordered on the buffer's stream.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        // SAFETY: borrowed from `self`, which keeps the block out of the cache; its previous
        // users' work and its zeroing are ordered on the stream the view names.
        unsafe { DeviceSlice::ordered_on(self.ptr(), self.len, &self.stream) }
    }

    /// An exclusive view, ordered on the buffer's stream.
    pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, T> {
        // SAFETY: borrowed exclusively from `self`; ordered as in `as_slice`.
        unsafe { DeviceSliceMut::ordered_on(self.ptr(), self.len, &self.stream) }
    }

    /// Prepares use on `other`: `other` waits (on the device) for the work queued on the
    /// buffer's stream so far, and the free will make the buffer's stream wait for `other`.
    /// The per-thread stream and a capture's stream are refused
    /// ([`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)); a stream of another
    /// device may use the block (through peer access).
    pub fn use_on(&mut self, other: &Stream) -> Result<()> {
        self.uses.use_on(&self.stream, other, "CachedBuffer::use_on")
    }

    /// Frees now and reports the verdict: the buffer's stream is made to wait for every stream
    /// passed to `use_on` (on the device); where that fails the host waits for that stream, and
    /// only if that fails too is the block kept out of the cache for good.
    pub fn free(mut self) -> Result<()> {
        self.release()
    }

    /// Frees on `stream` instead of the buffer's own: `stream` is made to wait for the buffer's
    /// stream and every stream passed to `use_on`, and the block returns to the cache once the
    /// work queued on `stream` so far has completed (an event shows it). The per-thread stream,
    /// a capture's stream and a stream of another device than the cache's are refused
    /// ([`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)); the buffer is then
    /// dropped, freed on its own stream.
    pub fn free_on(mut self, stream: &Stream) -> Result<()> {
        if stream.is_same_stream(&self.stream) {
            return self.release();
        }
        // The cache keys its blocks by stream handle, which names one stream on its device only.
        self.cache.check_stream(stream, "CachedBuffer::free_on")?;
        self.uses.hand_over(&self.stream, stream, "CachedBuffer::free_on")?;
        let Some(block) = self.block.take() else { return Ok(()) };
        if let Err(err) = self.uses.order_before(stream) {
            keep_out(block); // its users' work cannot be ordered: never reused
            return Err(err);
        }
        // SAFETY: from this cache, and `stream` is of its device, never the per-thread one; every
        // use is ordered before the work queued on `stream` now.
        Ok(unsafe { self.cache.allocator.free_on(block, stream) }?)
    }

    #[inline]
    fn release(&mut self) -> Result<()> {
        let Some(block) = self.block.take() else { return Ok(()) };
        if let Err(err) = self.uses.order_before(&self.stream) {
            keep_out(block); // its users' work cannot be ordered: never reused
            return Err(err);
        }
        // SAFETY: the block came from this cache; every use was queued on the buffer's stream or
        // on a stream the buffer's stream now waits for, so the work queued there after this call
        // runs after all of them.
        unsafe { self.cache.allocator.free(block) };
        Ok(())
    }

    /// Queues `cudaMemsetAsync` of every byte to `byte` on the buffer's stream and returns
    /// without waiting. Views name that stream, so blocking copies, scopes and the free are
    /// ordered after it.
    pub fn set_bytes_async(&mut self, byte: u8) -> Result<()> {
        self.set_in_stream_order(byte)
    }

    fn zero_in_stream_order(&self) -> Result<()> {
        self.set_in_stream_order(0)
    }

    fn set_in_stream_order(&self, byte: u8) -> Result<()> {
        let bytes = self.len * size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        let call = self.stream.call()?;
        // SAFETY: the block holds at least `bytes`; the memset is ordered on its stream.
        unsafe { raw::memory::set_async(self.ptr().cast(), byte, bytes, call.as_raw()) }
    }
}

impl<T: Pod> Drop for CachedBuffer<'_, T> {
    #[inline]
    fn drop(&mut self) {
        raw::quiet(self.release());
    }
}

/// The cache as a [`MemoryResource`](crate::resource::MemoryResource) (whose impl, in the resource
/// module, forwards here). A resource names streams by raw handle only, which the cache cannot
/// keep alive, so every block is taken on the cache's own stream, and the caller's stream is
/// ordered after it with an event on allocation; on deallocation the cache's stream waits for the
/// caller's before the block is returned. Slower than `CachedBuffer` (two events per pair), for
/// adaptors that need a resource.
impl DeviceCache {
    /// At least `bytes` (> 0) of device memory of the cache's device, 256-byte aligned, out of the
    /// cache until [`DeviceCache::resource_deallocate`], usable by work on `stream`.
    pub(crate) fn resource_allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        if bytes == 0 {
            let kind = ErrorKind::InvalidArgument("a resource allocation of 0 bytes");
            return Err(CudaError::new(kind, "DeviceCache::allocate"));
        }
        let own = self.resource_stream()?;
        let block = self.allocator.alloc(bytes, own)?;
        let ptr = block.ptr();
        let ready = Event::fence(own).and_then(|ready| {
            // SAFETY: the caller keeps the stream handle valid for the call (resource contract).
            unsafe { raw::streams::wait_event(stream.as_raw(), ready.as_raw()) }
        });
        if let Err(err) = ready {
            // SAFETY: from this cache, never used.
            unsafe { self.allocator.free(block) };
            return Err(err);
        }
        self.resource_blocks.lock().unwrap_or_else(PoisonError::into_inner).insert(ptr.as_ptr() as usize, block);
        Ok(ptr)
    }

    /// Returns a block of [`DeviceCache::resource_allocate`] once the work queued on `stream`
    /// has run; an unknown address is ignored.
    ///
    /// # Safety
    /// Nothing uses the block after the work already queued on `stream`, which stays valid for
    /// the call.
    pub(crate) unsafe fn resource_deallocate(&self, ptr: NonNull<u8>, stream: StreamRef<'_>) {
        let block =
            self.resource_blocks.lock().unwrap_or_else(PoisonError::into_inner).remove(&(ptr.as_ptr() as usize));
        let (Some(block), Ok(own)) = (block, self.resource_stream()) else { return };
        let done = Event::without_timing().and_then(|done| {
            // SAFETY: the caller keeps the stream handle valid for the call.
            unsafe { raw::events::record(done.as_raw(), stream.as_raw()) }?;
            own.wait_event(&done)
        });
        if done.is_err() {
            // The caller's work cannot be ordered before reuse: the block stays out for good.
            keep_out(block);
            return;
        }
        // SAFETY: taken on the cache's stream in `resource_allocate`; that stream now waits for
        // the caller's work on it.
        unsafe { self.allocator.free(block) };
    }

    /// The cache's figures as a pool's: reserved is the segments (current and peak), used the
    /// blocks held by users, rounded to their size classes.
    pub(crate) fn as_pool_stats(&self) -> PoolStats {
        let stats = self.stats();
        PoolStats {
            reserved_current: stats.reserved.current,
            reserved_high: stats.reserved.peak,
            used_current: stats.allocated.current,
            used_high: stats.allocated.peak,
        }
    }
}

// A free back into the cache does not wait for streams it does not know of.
impl<T: Pod> Owner for CachedBuffer<'_, T> {
    fn residence(&self) -> Residence {
        Residence::Device
    }
    fn producer(&self) -> Option<&crate::stream::Stream> {
        Some(&self.stream)
    }
    fn unseen_users(&self) -> UnseenUsers {
        UnseenUsers::Device(self.stream.device())
    }
}

impl<T: Pod> DeviceMemory for CachedBuffer<'_, T> {
    forward_device_views!();

    fn device(&self) -> Device {
        // A cache hands out blocks of its device only, for streams of that device.
        self.stream.device()
    }
}

forward_stream_ordered!(CachedBuffer);

#[cfg(test)]
mod tests {
    use super::contiguous;

    #[test]
    fn contiguous_joins_runs_that_touch_and_only_those() {
        let runs = [(0x1000, 0x1000), (0x2000, 0x3000), (0x6000, 0x1000), (0x8000, 0x1000), (0x9000, 0x800)];
        assert_eq!(contiguous(&runs), vec![(0x1000, 0x4000), (0x6000, 0x1000), (0x8000, 0x1800)]);
        assert!(contiguous(&[]).is_empty());
    }
}
