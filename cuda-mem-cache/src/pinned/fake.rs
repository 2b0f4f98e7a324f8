//! A backend over the system allocator with fences completed by hand, for tests and fuzzing.

use super::cache::PinnedBackend;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The system allocator and fences that tests complete by hand.
#[derive(Debug, Default)]
pub struct FakeBackend {
    /// Sizes of released blocks, in order (shared by clones, so a test can read it after
    /// the cache that owned the backend is gone).
    pub released: Arc<Mutex<Vec<usize>>>,
    /// Fences the cache waited for (a real backend blocks until the work completes).
    pub waits: AtomicUsize,
    /// Allocations still to refuse (as a driver out of memory would), one per call.
    pub refusals: AtomicUsize,
}

/// Completed by setting it.
pub type FakeFence = Arc<AtomicBool>;

/// An allocation the fake refused (see [`FakeBackend::refusals`]), or one the system could not
/// make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeRefusal {
    /// The bytes asked for.
    pub bytes: usize,
}

fn layout(bytes: usize) -> Option<Layout> {
    Layout::from_size_align(bytes, 4096).ok()
}

impl PinnedBackend for FakeBackend {
    type Fence = FakeFence;
    type Error = FakeRefusal;
    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>, FakeRefusal> {
        let refused = self.refusals.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok();
        let layout = layout(bytes).filter(|l| l.size() > 0 && !refused).ok_or(FakeRefusal { bytes })?;
        // SAFETY: a non-zero size and a valid alignment.
        NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or(FakeRefusal { bytes })
    }
    fn is_done(&self, fence: &FakeFence) -> bool {
        fence.load(Ordering::Acquire)
    }
    fn wait(&self, fence: &FakeFence) {
        // Waiting ends with the work complete.
        self.waits.fetch_add(1, Ordering::Relaxed);
        fence.store(true, Ordering::Release);
    }
    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
        self.released.lock().unwrap().push(bytes);
        let layout = layout(bytes).expect("allocate made this layout");
        // SAFETY: from `allocate(bytes)` with this layout (the caller's guarantee), freed once.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
    }
}
