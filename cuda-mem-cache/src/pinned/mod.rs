//! The bookkeeping of a caching allocator of pinned host memory: size classes (four per power of
//! two), per-thread front caches, and shared free lists with one lock per class, where a block
//! that asynchronous work used is handed out again only after fences on that work completed.
//! cuda-mem's `PinnedPool` plugs CUDA in through [`PinnedBackend`]; see [`cache`].

pub mod cache;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
mod front;
pub mod size_class;
#[cfg(test)]
mod tests;

pub use cache::{Block, BlockCache, ForeignBlock, Lease, PinnedBackend, PinnedPoolStats};
pub use size_class::{MIN_BLOCK, NUM_CLASSES, PinnedClass, class_of};
