//! Stand-ins for tests and fuzz targets of code built on cuda-mem (feature `testing`): they run
//! without a GPU. Not for production: [`HostResource`] hands out pageable host memory under the
//! device resources' interface.

pub use crate::resource::testing::HostResource;
pub use crate::staged::{chunk_size, deal};
