//! Stand-ins for tests and fuzz targets of code built on cuda-mem (feature `testing`): they run
//! without a GPU. Not for production: [`HostResource`] hands out pageable host memory under the
//! device resources' interface, reported as [`MemoryKind::PinnedHost`](crate::resource::MemoryKind)
//! so that buffers over it give host slices only; exported (DLPack) or handed to device work, that
//! memory would be taken for page-locked memory a kernel can reach, which it is not.

pub use crate::resource::testing::HostResource;
pub use crate::staged::{chunk_size, deal};
