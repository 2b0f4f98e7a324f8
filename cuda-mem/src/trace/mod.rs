//! Trace tooling (feature `trace`): allocation logs parsed and replayed against any resource,
//! the synthetic workloads that measure allocators (an LLM serving trace, the stress schedule),
//! and memory snapshots in PyTorch's format. It drives and inspects allocators rather than
//! allocating, so it stays out of [`resource`](crate::resource), which keeps the resources and
//! their adaptors; [`LoggingResource`](crate::resource::LoggingResource) writes the logs read here.
//!
//! The unit tests build it without the feature, since the allocator's own tests replay these
//! workloads.

mod replay;
mod serving_trace;
pub mod snapshot;
mod stress_schedule;

pub use replay::{ReplayEvent, ReplayReport, parse_log, replay, write_log};
pub use serving_trace::ServingTrace;
pub use stress_schedule::{StressOp, StressSchedule};
