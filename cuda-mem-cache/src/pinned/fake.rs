//! A backend over the system allocator with fences completed by hand, for tests and fuzzing.

use super::cache::{Block, PinnedBackend};
use super::size_class::class_of;
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
}

/// Completed by setting it.
pub type FakeFence = Arc<AtomicBool>;

impl PinnedBackend for FakeBackend {
    type Fence = FakeFence;
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
        // SAFETY: allocated by `fake_block` with this layout.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), Layout::from_size_align(bytes, 4096).unwrap()) };
    }
}

/// A new block from the system allocator, as a miss would produce.
pub fn fake_block(bytes: usize) -> Block<FakeFence> {
    let class = class_of(bytes).unwrap();
    // SAFETY: non-zero size, valid alignment.
    let ptr = unsafe { std::alloc::alloc(Layout::from_size_align(class.bytes, 4096).unwrap()) };
    Block { ptr: NonNull::new(ptr).unwrap(), class, fences: Vec::new() }
}
