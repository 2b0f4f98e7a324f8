//! Trace tooling (feature `trace`): memory snapshots in PyTorch's format. It inspects allocators
//! rather than allocating, so it stays out of [`resource`](crate::resource), which keeps the
//! resources and their adaptors. Logs of [`LoggingResource`](crate::resource::LoggingResource)
//! are read and replayed outside the library (`cuda-mem-workloads`'s `log`, `cuda-mem-bench`'s
//! `replay`).

pub mod snapshot;
