//! The adaptor stacks of the resource rows, shared by `families` and `paired`.

use cuda_mem::resource::{LimitingResource, MemoryResource, PoolResource, StatisticsResource, TrackingResource};
use std::sync::Arc;

/// Builds one row's resource over a `PoolResource`.
pub(crate) type Stack = fn(PoolResource) -> Arc<dyn MemoryResource>;

/// Each adaptor row's key and stack, after the plain `resource_pool_1m` row. The limit is never
/// reached (`usize::MAX`): the rows measure the bookkeeping.
pub(crate) const ADAPTOR_STACKS: [(&str, Stack); 4] = [
    ("resource_stats_pool_1m", |pool| Arc::new(StatisticsResource::new(pool))),
    ("resource_limit_pool_1m", |pool| Arc::new(LimitingResource::new(pool, usize::MAX))),
    ("resource_limit_stats_pool_1m", |pool| Arc::new(LimitingResource::new(StatisticsResource::new(pool), usize::MAX))),
    ("resource_tracking_pool_1m", |pool| Arc::new(TrackingResource::new(pool, false))),
];
