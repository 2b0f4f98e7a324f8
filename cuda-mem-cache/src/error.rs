//! The cache's errors: its own refusals, and its backend's errors passed through.

use crate::CachingStats;
use std::fmt;

/// What the cache needs to know of its backend's errors.
pub trait BackendError: std::error::Error + Send + Sync + 'static {
    /// True when the system is out of memory: the cache then returns what it holds and tries
    /// once more before giving up.
    fn is_out_of_memory(&self) -> bool;
}

/// An error of the cache, generic over its backend's error `E`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error<E> {
    /// The backend refused a call for another reason than memory.
    Backend(E),
    /// The backend had no memory even after the cache returned everything it held; `stats` is
    /// the cache's state at that moment.
    OutOfMemory { source: E, stats: Box<CachingStats> },
    /// A request whose size class or segment would not fit in `usize`.
    SizeOverflow { bytes: usize },
    /// A [`Config`](crate::Config) the cache cannot work with: what is wrong with it.
    InvalidConfig(&'static str),
    /// A call the allocator does not support, and why (a private pool's fences, for one).
    Refused(&'static str),
    /// A sleep, wake or allocation that the cache's sleep state refuses: a sleep of a sleeping
    /// cache, a wake of an awake one, an allocation from a sleeping one (the message says which).
    SleepState(&'static str),
}

/// The result of the cache's calls.
pub type Result<T, E> = std::result::Result<T, Error<E>>;

impl<E: BackendError> Error<E> {
    /// True for out of memory, whether the cache has already retried or the backend said so.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Self::OutOfMemory { .. } => true,
            Self::Backend(err) => err.is_out_of_memory(),
            _ => false,
        }
    }

    /// Marks the backend's out of memory as final, with the cache's state.
    pub(crate) fn with_stats(self, stats: impl FnOnce() -> CachingStats) -> Self {
        match self {
            Self::Backend(source) if source.is_out_of_memory() => {
                Self::OutOfMemory { source, stats: Box::new(stats()) }
            }
            other => other,
        }
    }
}

impl<E> From<E> for Error<E> {
    fn from(err: E) -> Self {
        Self::Backend(err)
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Backend(err) => err.fmt(f),
            Self::OutOfMemory { source, stats } => write!(
                f,
                "{source}; the caching allocator still reserves {} bytes ({} allocated) after returning what it held",
                stats.reserved.current, stats.allocated.current
            ),
            Self::SizeOverflow { bytes } => write!(f, "a request of {bytes} bytes: its size class overflows usize"),
            Self::InvalidConfig(why) => write!(f, "invalid cache configuration: {why}"),
            Self::Refused(why) => write!(f, "refused: {why}"),
            Self::SleepState(why) => write!(f, "refused by the cache's sleep state: {why}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Backend(err) | Self::OutOfMemory { source: err, .. } => Some(err),
            _ => None,
        }
    }
}
