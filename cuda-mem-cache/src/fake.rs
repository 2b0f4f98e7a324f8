//! A backend for tests and fuzzing: segments from the system allocator (or bare addresses, for
//! replays of traces larger than the host), and streams modelled by counters. Work queued on a
//! stream ([`FakeBackend::submit`]) completes in order, only when a test says so
//! ([`FakeBackend::complete`]) or the cache waits for it; a fence is a stream and a count. A
//! device-side wait is a piece of work too, which completes only after the work it waits for
//! (so completing a stream completes what it waited for, as on a device).
//! [`FakeBackend::is_ordered`] answers whether work queued on a stream now comes after a given
//! piece of another stream's work, which is what a test checks when a block changes hands.

use super::backend::{Backend, Keep, Mapped, MappingPlan, Pages, StreamKey};
use crate::BackendError;
use rustc_hash::FxHashMap;
use std::alloc::Layout;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The fake's refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeError {
    /// An allocation or mapping of `requested` bytes beyond the capacity (or refused on purpose);
    /// `free` and `total` are the capacity's figures, when it has one.
    OutOfMemory { requested: usize, free: Option<usize>, total: Option<usize> },
    /// A fence refused on purpose ([`FakeBackend::fail_records`]).
    FenceRefused,
    /// An eviction refused on purpose ([`FakeBackend::fail_next_evictions`]): the host memory
    /// for the kept bytes, say, could not be had.
    EvictionRefused,
}

impl fmt::Display for FakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfMemory { requested, .. } => write!(f, "fake allocation of {requested} bytes refused"),
            Self::FenceRefused => f.write_str("fake fence refused"),
            Self::EvictionRefused => f.write_str("fake eviction refused"),
        }
    }
}

impl std::error::Error for FakeError {}

impl BackendError for FakeError {
    fn is_out_of_memory(&self) -> bool {
        matches!(self, Self::OutOfMemory { .. })
    }
}

/// Segment alignment: what `cudaMalloc` guarantees at least.
const ALIGN: usize = 512;

/// The end of an address-only backend's address space (a 64-bit device's is far smaller).
const ADDRESS_END: usize = 1 << 62;

/// A backend over the system allocator with hand-completed streams. Clones share the state, so
/// a test keeps one to inspect what the allocator did with the other.
#[derive(Debug, Clone, Default)]
pub struct FakeBackend {
    state: Arc<Mutex<FakeState>>,
    /// Taken by page calls that have a latency, for that long.
    driver: Arc<Mutex<()>>,
    /// Page bytes when the backend offers [`Pages`] (address ranges, mapped page by page).
    page: Option<usize>,
}

#[derive(Debug, Default)]
struct FakeState {
    streams: FxHashMap<StreamKey, FakeStream>,
    /// Live segments: address -> (pointer, bytes).
    segments: BTreeMap<usize, (NonNull<u8>, usize)>,
    /// Refuse allocations beyond this many reserved bytes (`None`: no limit).
    capacity: Option<usize>,
    /// Refuse this many allocations whatever the capacity.
    fail_next: usize,
    fail_records: bool,
    /// Whether the next `map` or `unmap` panics (a user's backend gone wrong).
    panic_next_page_call: bool,
    allocations: u64,
    released: Vec<(usize, usize)>,
    host_waits: u64,
    /// Segments are addresses only, from `next_address` up (never reused), with no memory behind
    /// them: for replays whose reserve would not fit the host.
    address_only: bool,
    next_address: usize,
    /// Reserved address ranges: start -> bytes.
    ranges: BTreeMap<usize, usize>,
    /// Addresses of the mapped pages.
    mapped: BTreeSet<usize>,
    /// Bytes of pages unmapped and kept for later maps (`Pages::unmap`).
    kept: usize,
    /// The kept mappings: bytes -> how many.
    kept_mappings: BTreeMap<usize, usize>,
    /// Live mappings: address -> bytes.
    mappings: BTreeMap<usize, usize>,
    maps: u64,
    unmaps: u64,
    /// Driver calls the CUDA backend would make for these maps, unmaps and releases.
    driver_calls: u64,
    /// What the live mappings hold: tokens that tests stamp at addresses
    /// ([`FakeBackend::stamp`]) in place of bytes.
    contents: BTreeMap<usize, u64>,
    /// Mappings `evict` gave back: address -> (bytes, the tokens kept in it).
    evicted: BTreeMap<usize, (usize, Vec<(usize, u64)>)>,
    fail_evictions: usize,
    range_bytes: usize,
    /// Holds `map` and `unmap` calls at their start ([`FakeBackend::hold_page_calls`]).
    gate: Option<Arc<Gate>>,
    /// How long a `map` or `unmap` takes ([`FakeBackend::set_page_call_latency`]).
    page_call_latency: Option<std::time::Duration>,
}

/// Holds a fake backend's `map` and `unmap` calls at their start until [`Gate::open`]: tests
/// of what other threads may do while a driver call is in flight.
#[derive(Debug, Default)]
pub struct Gate {
    /// (open, calls waiting now)
    state: Mutex<(bool, usize)>,
    changed: std::sync::Condvar,
}

impl Gate {
    /// Lets every held call, and every later one, through.
    pub fn open(&self) {
        self.lock().0 = true;
        self.changed.notify_all();
    }

    /// Waits until `calls` calls are held, or `timeout` passes; true if they are.
    pub fn wait_for_held(&self, calls: usize, timeout: std::time::Duration) -> bool {
        let state = self.lock();
        let (state, _) =
            self.changed.wait_timeout_while(state, timeout, |s| s.1 < calls).unwrap_or_else(PoisonError::into_inner);
        state.1 >= calls
    }

    fn pass(&self) {
        let mut state = self.lock();
        state.1 += 1;
        self.changed.notify_all();
        while !state.0 {
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        state.1 -= 1;
    }

    fn lock(&self) -> MutexGuard<'_, (bool, usize)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FakeState {
    fn mapped_bytes(&self, page: usize) -> usize {
        self.mapped.len() * page
    }

    fn in_mapping(&self, address: usize) -> bool {
        self.mappings.range(..=address).next_back().is_some_and(|(&start, &bytes)| address < start + bytes)
    }

    /// Takes the tokens stamped in `bytes` from `start`.
    fn take_contents(&mut self, start: usize, bytes: usize) -> Vec<(usize, u64)> {
        let inside: Vec<usize> = self.contents.range(start..start + bytes).map(|(&a, _)| a).collect();
        inside.into_iter().map(|a| (a, self.contents.remove(&a).expect("a stamped address"))).collect()
    }

    fn segment_bytes(&self) -> usize {
        self.segments.values().map(|&(_, bytes)| bytes).sum()
    }

    /// The next free address after `bytes` more of address space, where the space has them
    /// (a real system runs out of addresses as it runs out of memory: a refusal, not a panic).
    fn take_addresses(&self, bytes: Option<usize>) -> Option<usize> {
        bytes.and_then(|bytes| self.next_address.checked_add(bytes)).filter(|&next| next <= ADDRESS_END)
    }

    /// The out-of-memory error for a request of `bytes`, if it must fail now.
    fn refuse(&mut self, bytes: usize, reserved: usize) -> Option<FakeError> {
        let over = self.capacity.is_some_and(|cap| reserved.saturating_add(bytes) > cap);
        if self.fail_next == 0 && !over {
            return None;
        }
        self.fail_next = self.fail_next.saturating_sub(1);
        Some(FakeError::OutOfMemory {
            requested: bytes,
            free: self.capacity.map(|cap| cap.saturating_sub(reserved)),
            total: self.capacity,
        })
    }
}

// SAFETY: the segment pointers are system-allocator memory this state alone frees (or bare
// addresses); any thread holding the state (through its mutex) may free them.
unsafe impl Send for FakeState {}

#[derive(Debug, Default)]
struct FakeStream {
    /// Pieces of work queued so far.
    queued: u64,
    /// Pieces of work completed (a prefix of the queued ones).
    completed: u64,
    /// Device-side waits: (the piece of work that is the wait, the stream and count it waits for).
    waits: Vec<(u64, StreamKey, u64)>,
}

impl FakeState {
    fn completed(&self, stream: StreamKey) -> u64 {
        self.streams.get(&stream).map_or(0, |s| s.completed)
    }

    /// Completes the first `seq` pieces of `stream`'s work, and first what they waited for.
    fn complete_to(&mut self, stream: StreamKey, seq: u64) {
        if self.completed(stream) >= seq {
            return;
        }
        let waits: Vec<_> = self.streams[&stream].waits.iter().filter(|w| w.0 <= seq).map(|w| (w.1, w.2)).collect();
        for (other, other_seq) in waits {
            self.complete_to(other, other_seq);
        }
        self.streams.get_mut(&stream).expect("a stream with work").completed = seq;
    }
}

/// The work queued on `stream` before the fence was recorded: its first `seq` pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeFence {
    /// Where it was recorded.
    pub stream: StreamKey,
    /// How many pieces of work it covers.
    pub seq: u64,
}

impl FakeBackend {
    /// A backend whose segments are addresses with no memory behind them (the cache never
    /// dereferences its segments): any reserve fits, as in replays of large traces.
    pub fn address_only() -> Self {
        let backend = Self::default();
        let mut state = backend.state();
        state.address_only = true;
        state.next_address = 1 << 40;
        drop(state);
        backend
    }

    /// An address-only backend with [`Pages`] of `page` bytes, whose ranges are `range` bytes.
    pub fn with_pages(page: usize, range: usize) -> Self {
        let backend = Self { page: Some(page), ..Self::address_only() };
        let mut state = backend.state();
        state.next_address = (1usize << 40).next_multiple_of(page);
        state.range_bytes = range;
        drop(state);
        backend
    }

    /// The same backend handing out addresses from `address` up (rounded up to its page): fake
    /// backends that stand for caches of one device must not hand out the same addresses.
    pub fn starting_at(self, address: usize) -> Self {
        let mut state = self.state();
        state.next_address = address.next_multiple_of(self.page.unwrap_or(ALIGN));
        drop(state);
        self
    }

    /// The sizes of the live mappings, in address order.
    pub fn mappings(&self) -> Vec<(usize, usize)> {
        self.state().mappings.iter().map(|(&at, &bytes)| (at, bytes)).collect()
    }

    /// Calls of `map` and of `unmap` so far.
    pub fn page_calls(&self) -> (u64, u64) {
        let state = self.state();
        (state.maps, state.unmaps)
    }

    /// The driver calls the CUDA backend would have made for the maps, unmaps and releases so
    /// far: a `cuMemCreate` per new mapping, a `cuMemMap` per mapping, a `cuMemSetAccess` per
    /// map, a `cuMemUnmap` per mapping unmapped and a `cuMemRelease` per kept one released.
    pub fn driver_calls(&self) -> u64 {
        self.state().driver_calls
    }

    /// Writes `token` at `address` (standing for the bytes there); false when no mapping holds
    /// the address.
    pub fn stamp(&self, address: usize, token: u64) -> bool {
        let mut state = self.state();
        if !state.in_mapping(address) {
            return false;
        }
        state.contents.insert(address, token);
        true
    }

    /// The token at `address` (0 where none was stamped, or where a restore did not keep it),
    /// or `None` when no mapping holds the address.
    pub fn stamp_of(&self, address: usize) -> Option<u64> {
        let state = self.state();
        state.in_mapping(address).then(|| state.contents.get(&address).copied().unwrap_or(0))
    }

    /// Bytes of the mappings evicted and not restored.
    pub fn evicted_bytes(&self) -> usize {
        self.state().evicted.values().map(|&(bytes, _)| bytes).sum()
    }

    /// Refuses the next `count` evictions (nothing evicted).
    pub fn fail_next_evictions(&self, count: usize) {
        self.state().fail_evictions = count;
    }

    /// True when every page that `bytes` from `address` touch is mapped.
    pub fn is_mapped(&self, address: usize, bytes: usize) -> bool {
        let page = self.page.expect("a backend with pages");
        let state = self.state();
        let first = address / page * page;
        (first..address + bytes).step_by(page).all(|p| state.mapped.contains(&p))
    }

    /// Reserved ranges not freed yet.
    pub fn live_ranges(&self) -> usize {
        self.state().ranges.len()
    }

    /// Bytes of mapped pages.
    pub fn mapped_bytes(&self) -> usize {
        self.page.map_or(0, |page| self.state().mapped_bytes(page))
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// From now on every `map` and `unmap` call waits at its start until the returned gate
    /// opens.
    pub fn hold_page_calls(&self) -> Arc<Gate> {
        let gate = Arc::new(Gate::default());
        self.state().gate = Some(Arc::clone(&gate));
        gate
    }

    /// From now on every `map` and `unmap` call takes `latency` of one lock that all of them
    /// share, as the driver's virtual-memory calls run one at a time: threads that miss together
    /// then wait for each other, as on a device.
    pub fn set_page_call_latency(&self, latency: std::time::Duration) {
        self.state().page_call_latency = Some(latency);
    }

    /// Sleeps for the page-call latency, if any, holding the backend's driver lock.
    fn take_driver_time(&self) {
        let latency = self.state().page_call_latency;
        if let Some(latency) = latency {
            let _one_at_a_time = self.driver.lock().unwrap_or_else(PoisonError::into_inner);
            std::thread::sleep(latency);
        }
    }

    /// Waits at the gate of [`FakeBackend::hold_page_calls`], if there is one; then panics if
    /// [`FakeBackend::panic_next_page_call`] asked for it.
    fn before_page_call(&self) {
        let gate = self.state().gate.clone();
        if let Some(gate) = gate {
            gate.pass();
        }
        let panics = std::mem::take(&mut self.state().panic_next_page_call);
        assert!(!panics, "the next page call panics (FakeBackend::panic_next_page_call)");
    }

    /// Makes the next `map` or `unmap` panic before it changes anything, as a backend written by
    /// a user might.
    pub fn panic_next_page_call(&self) {
        self.state().panic_next_page_call = true;
    }

    /// Refuses allocations that would take the live segments beyond `bytes` (`None`: no limit).
    pub fn set_capacity(&self, bytes: Option<usize>) {
        self.state().capacity = bytes;
    }

    /// Refuses the next `count` allocations.
    pub fn fail_next_allocations(&self, count: usize) {
        self.state().fail_next = count;
    }

    /// Makes `record` fail (a broken context) or work again.
    pub fn fail_records(&self, fail: bool) {
        self.state().fail_records = fail;
    }

    /// Queues a piece of work on `stream`; returns how many are queued there now.
    pub fn submit(&self, stream: StreamKey) -> u64 {
        let mut state = self.state();
        let s = state.streams.entry(stream).or_default();
        s.queued += 1;
        s.queued
    }

    /// Work queued on `stream` so far: a free now is ordered after this much of it.
    pub fn queued(&self, stream: StreamKey) -> u64 {
        self.state().streams.get(&stream).map_or(0, |s| s.queued)
    }

    /// Completes every piece of work queued on `stream` (and what it waited for).
    pub fn complete(&self, stream: StreamKey) {
        let mut state = self.state();
        let queued = state.streams.get(&stream).map_or(0, |s| s.queued);
        state.complete_to(stream, queued);
    }

    /// Completes all work on every stream.
    pub fn complete_all(&self) {
        let mut state = self.state();
        let streams: Vec<_> = state.streams.iter().map(|(&k, s)| (k, s.queued)).collect();
        for (stream, queued) in streams {
            state.complete_to(stream, queued);
        }
    }

    /// True when work queued on `to` from now on starts after the first `seq` pieces of `from`'s
    /// work: same stream, completed, or waited for on the device, directly or through waits of
    /// the streams waited for.
    pub fn is_ordered(&self, from: StreamKey, seq: u64, to: StreamKey) -> bool {
        let state = self.state();
        if from == to || state.completed(from) >= seq {
            return true;
        }
        // Depth-first over waits: `(stream, count)` means "after that stream's first `count` pieces".
        let mut seen: FxHashMap<StreamKey, u64> = FxHashMap::default();
        let mut stack = vec![(to, state.streams.get(&to).map_or(0, |s| s.queued))];
        while let Some((stream, count)) = stack.pop() {
            if stream == from && count >= seq {
                return true;
            }
            if seen.get(&stream).is_some_and(|&c| c >= count) {
                continue;
            }
            seen.insert(stream, count);
            if let Some(s) = state.streams.get(&stream) {
                stack.extend(s.waits.iter().filter(|w| w.0 <= count).map(|w| (w.1, w.2)));
            }
        }
        false
    }

    /// True when the first `seq` pieces of work on `stream` have completed.
    pub fn is_complete(&self, stream: StreamKey, seq: u64) -> bool {
        self.state().completed(stream) >= seq
    }

    /// Bytes in live segments, mapped pages and kept pages.
    pub fn reserved(&self) -> usize {
        let state = self.state();
        state.segment_bytes() + self.page.map_or(0, |page| state.mapped_bytes(page)) + state.kept
    }

    /// Bytes of pages unmapped and kept for later maps.
    pub fn kept_bytes(&self) -> usize {
        self.state().kept
    }

    /// Live segments as (address, bytes).
    pub fn live_segments(&self) -> Vec<(usize, usize)> {
        self.state().segments.iter().map(|(&a, &(_, b))| (a, b)).collect()
    }

    /// Segments allocated so far.
    pub fn allocations(&self) -> u64 {
        self.state().allocations
    }

    /// Addresses of the mapped pages, in order.
    pub fn mapped_pages(&self) -> Vec<usize> {
        self.state().mapped.iter().copied().collect()
    }

    /// Segments released and runs of pages unmapped since the last call, as (address, bytes).
    pub fn take_released(&self) -> Vec<(usize, usize)> {
        std::mem::take(&mut self.state().released)
    }

    /// Times the cache blocked on a fence.
    pub fn host_waits(&self) -> u64 {
        self.state().host_waits
    }
}

impl Drop for FakeState {
    fn drop(&mut self) {
        // Segments the allocator kept (blocks it could never take back): the test is over.
        for &(ptr, bytes) in self.segments.values().filter(|_| !self.address_only) {
            // SAFETY: a live segment from `allocate`, released here once as the state goes.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout(bytes)) };
        }
    }
}

fn layout(bytes: usize) -> Layout {
    Layout::from_size_align(bytes, ALIGN).expect("segment sizes fit a layout")
}

// SAFETY: segments are distinct live allocations of the system allocator, aligned to 512 (or,
// address only, distinct ranges of a counter that only grows, with nothing behind them to use,
// as nothing dereferences them). A fence
// covers the first `seq` pieces of its stream's work: `is_done` and `wait` report completion of
// exactly those (waiting completes them, as a blocking wait returns only after they ran), and
// `stream_wait` queues a wait after which the stream's work comes after them. Streams are their
// keys: plain numbers chosen by the tests, never reused for another stream.
unsafe impl Backend for FakeBackend {
    type Stream = StreamKey;
    type Fence = FakeFence;
    type Error = FakeError;

    fn key(stream: &StreamKey) -> StreamKey {
        *stream
    }

    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>, FakeError> {
        let mut state = self.state();
        let reserved = state.segment_bytes() + self.page.map_or(0, |page| state.mapped_bytes(page)) + state.kept;
        if let Some(err) = state.refuse(bytes, reserved) {
            return Err(err);
        }
        let ptr = if state.address_only {
            let address = state.next_address;
            let Some(next) = state.take_addresses(bytes.checked_next_multiple_of(ALIGN)) else {
                return Err(FakeError::OutOfMemory { requested: bytes, free: None, total: state.capacity });
            };
            state.next_address = next;
            NonNull::new(std::ptr::without_provenance_mut(address)).expect("addresses start above 0")
        } else {
            // SAFETY: a non-zero size (the cache asks for multiples of 512) and a valid alignment.
            NonNull::new(unsafe { std::alloc::alloc(layout(bytes)) }).unwrap_or_else(|| {
                std::alloc::handle_alloc_error(layout(bytes));
            })
        };
        state.segments.insert(ptr.as_ptr().addr(), (ptr, bytes));
        state.allocations += 1;
        Ok(ptr)
    }

    unsafe fn release(&self, base: NonNull<u8>, bytes: usize) {
        let mut state = self.state();
        let addr = base.as_ptr().addr();
        let live = state.segments.remove(&addr).map(|(_, b)| b);
        assert_eq!(live, Some(bytes), "released a segment that is not live");
        state.released.push((addr, bytes));
        if !state.address_only {
            // SAFETY: allocated by `allocate` with this layout (the map just proved it live, so
            // this is its one release).
            unsafe { std::alloc::dealloc(base.as_ptr(), layout(bytes)) };
        }
    }

    fn record(&self, stream: &StreamKey) -> Result<FakeFence, FakeError> {
        let mut state = self.state();
        if state.fail_records {
            return Err(FakeError::FenceRefused);
        }
        let seq = state.streams.entry(*stream).or_default().queued;
        Ok(FakeFence { stream: *stream, seq })
    }

    fn is_done(&self, fence: &FakeFence) -> bool {
        self.state().completed(fence.stream) >= fence.seq
    }

    fn wait(&self, fence: &FakeFence) -> Result<(), FakeError> {
        let mut state = self.state();
        state.host_waits += 1;
        state.complete_to(fence.stream, fence.seq);
        Ok(())
    }

    fn stream_wait(&self, stream: &StreamKey, fence: &FakeFence) -> Result<(), FakeError> {
        let mut state = self.state();
        let s = state.streams.entry(*stream).or_default();
        s.queued += 1;
        s.waits.push((s.queued, fence.stream, fence.seq));
        Ok(())
    }

    fn pages(&self) -> Option<&dyn Pages<Error = FakeError>> {
        self.page.map(|_| self as &dyn Pages<Error = FakeError>)
    }
}

// SAFETY: ranges are distinct runs of a counter that only grows, page-aligned, with nothing
// behind them (address only: nothing dereferences them); the bookkeeping asserts that a map
// covers only unmapped pages of one live range, an unmap only mapped pages, and a free a live
// range with nothing mapped, so a broken caller fails the test instead of passing.
unsafe impl Pages for FakeBackend {
    type Error = FakeError;

    fn page_bytes(&self) -> usize {
        self.page.expect("a backend with pages")
    }

    fn range_bytes(&self) -> usize {
        self.state().range_bytes
    }

    fn reserve(&self, bytes: usize) -> Result<NonNull<u8>, FakeError> {
        let page = self.page_bytes();
        assert!(bytes.is_multiple_of(page), "ranges are whole pages");
        let mut state = self.state();
        let address = state.next_address;
        // A page of gap: neighbours never touch.
        let Some(next) = state.take_addresses(bytes.checked_add(page)) else {
            return Err(FakeError::OutOfMemory { requested: bytes, free: None, total: state.capacity });
        };
        state.next_address = next;
        state.ranges.insert(address, bytes);
        Ok(NonNull::new(std::ptr::without_provenance_mut(address)).expect("addresses start above 0"))
    }

    unsafe fn map(&self, at: NonNull<u8>, bytes: usize, room: usize, max_new: usize) -> Result<Mapped, FakeError> {
        self.before_page_call();
        self.take_driver_time();
        let page = self.page_bytes();
        let start = at.as_ptr().addr();
        assert!(start.is_multiple_of(page) && bytes.is_multiple_of(page) && bytes > 0, "whole pages");
        assert!(room.is_multiple_of(page) && room >= bytes, "room for the run");
        let mut state = self.state();
        assert!(state.evicted.is_empty(), "a map while mappings are evicted");
        let (&base, &len) = state.ranges.range(..=start).next_back().expect("a map inside a range");
        assert!(start + room <= base + len, "a map inside one range");
        assert!(state.mapped.range(start..start + room).next().is_none(), "a page mapped twice");
        let plan = MappingPlan::new(bytes, room, &state.kept_mappings, page, max_new);
        let (from_kept, new): (usize, usize) = (plan.kept.iter().sum(), plan.new.iter().sum());
        let reserved = state.segment_bytes() + state.mapped_bytes(page) + state.kept;
        if new > 0
            && let Some(err) = state.refuse(new, reserved)
        {
            return Err(err);
        }
        for size in &plan.kept {
            let count = state.kept_mappings.get_mut(size).expect("a kept mapping of the plan");
            *count -= 1;
            if *count == 0 {
                state.kept_mappings.remove(size);
            }
        }
        state.kept -= from_kept;
        let mut address = start;
        let mappings: Vec<usize> = plan.kept.iter().chain(&plan.new).copied().collect();
        for &size in &mappings {
            state.mappings.insert(address, size);
            address += size;
        }
        state.mapped.extend((start..address).step_by(page));
        state.maps += 1;
        // A map per mapping, a create per new one, one access call for the run.
        state.driver_calls += (mappings.len() + plan.new.len() + 1) as u64;
        Ok(Mapped { bytes: address - start, from_kept, mappings })
    }

    unsafe fn unmap(&self, at: NonNull<u8>, bytes: usize) {
        self.before_page_call();
        self.take_driver_time();
        let page = self.page_bytes();
        let start = at.as_ptr().addr();
        let mut state = self.state();
        assert!(state.evicted.is_empty(), "an unmap while mappings are evicted");
        let mut address = start;
        while address < start + bytes {
            // The driver unmaps whole mappings only.
            let size = state.mappings.remove(&address).expect("an unmap starts at a mapping");
            state.take_contents(address, size);
            assert!(address + size <= start + bytes, "an unmap of part of a mapping");
            *state.kept_mappings.entry(size).or_default() += 1;
            state.driver_calls += 1;
            address += size;
        }
        for address in (start..start + bytes).step_by(page) {
            assert!(state.mapped.remove(&address), "unmapped a page that is not mapped");
        }
        state.unmaps += 1;
        state.kept += bytes;
        state.released.push((start, bytes));
    }

    fn release_kept(&self) -> usize {
        let mut state = self.state();
        state.driver_calls += state.kept_mappings.values().sum::<usize>() as u64;
        state.kept_mappings.clear();
        std::mem::take(&mut state.kept)
    }

    unsafe fn free(&self, base: NonNull<u8>, bytes: usize) {
        let start = base.as_ptr().addr();
        let mut state = self.state();
        assert_eq!(state.ranges.remove(&start), Some(bytes), "freed a range that is not live");
        assert!(state.mapped.range(start..start + bytes).next().is_none(), "freed a range with pages mapped");
        assert!(state.evicted.range(start..start + bytes).next().is_none(), "freed a range with pages evicted");
    }

    unsafe fn evict(&self, keep: Keep) -> Result<usize, FakeError> {
        let page = self.page_bytes();
        let mut state = self.state();
        assert!(state.evicted.is_empty(), "an eviction before the last one was restored");
        if state.fail_evictions > 0 {
            state.fail_evictions -= 1;
            return Err(FakeError::EvictionRefused);
        }
        let mappings = std::mem::take(&mut state.mappings);
        let mut bytes = 0;
        for (address, size) in mappings {
            let tokens = state.take_contents(address, size);
            state.evicted.insert(address, (size, if keep == Keep::Contents { tokens } else { Vec::new() }));
            for page_address in (address..address + size).step_by(page) {
                assert!(state.mapped.remove(&page_address), "a mapping's page is mapped");
            }
            // An unmap and a release per mapping.
            state.driver_calls += 2;
            bytes += size;
        }
        Ok(bytes)
    }

    fn restore(&self) -> Result<usize, FakeError> {
        let page = self.page_bytes();
        let mut state = self.state();
        let bytes: usize = state.evicted.values().map(|&(bytes, _)| bytes).sum();
        let reserved = state.segment_bytes() + state.mapped_bytes(page) + state.kept;
        if bytes > 0
            && let Some(err) = state.refuse(bytes, reserved)
        {
            return Err(err);
        }
        for (address, (size, tokens)) in std::mem::take(&mut state.evicted) {
            state.mappings.insert(address, size);
            state.mapped.extend((address..address + size).step_by(page));
            state.contents.extend(tokens);
            // A create, a map and an access call per mapping.
            state.driver_calls += 3;
        }
        Ok(bytes)
    }
}
