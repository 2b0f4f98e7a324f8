//! The allocator's parameters: how requests map to segments, and how much each thread's front
//! cache may hold.

use super::size_class::{MIN_BLOCK, SizeClass};

/// Which segments a request is carved from. Small requests stay out of large segments, so that
/// a few long-lived small blocks cannot keep a large segment from becoming free as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    /// Classes up to [`Config::small_max`], in segments of [`Config::small_segment`] bytes.
    Small = 0,
    /// Larger classes.
    Large = 1,
}

/// Parameters of a [`CachingAllocator`](super::CachingAllocator). Sizes are multiples of 512.
/// The segment defaults are PyTorch's; the benchmarks decide where they belong here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Classes up to this share small segments.
    pub small_max: usize,
    /// Bytes of a small segment.
    pub small_segment: usize,
    /// Bytes of a shared large segment, for large classes below `own_segment_from`.
    pub large_segment: usize,
    /// Classes from this size up get a segment of their own, rounded up to `granularity`; the
    /// rest of it is a free block like any other.
    pub own_segment_from: usize,
    /// Own segments are a multiple of this.
    pub granularity: usize,
    /// Blocks each thread keeps per stream and class; 0 turns the front cache off.
    pub front_depth: usize,
    /// Bytes each thread may keep in its front cache (per allocator).
    pub front_max_bytes: usize,
    /// When a stream finds no free memory of its own but another stream has a free segment whose
    /// last use has not been seen completing, the stream waits for it on the device
    /// (`cudaStreamWaitEvent`) rather than growing the cache.
    pub cross_stream_waits: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            small_max: 1 << 20,
            small_segment: 2 << 20,
            large_segment: 20 << 20,
            own_segment_from: 10 << 20,
            granularity: 2 << 20,
            front_depth: 8,
            front_max_bytes: 256 << 20,
            cross_stream_waits: true,
        }
    }
}

impl Config {
    /// Why these parameters cannot work, if they cannot.
    pub fn check(&self) -> Result<(), &'static str> {
        let sizes = [self.small_max, self.small_segment, self.large_segment, self.own_segment_from, self.granularity];
        if sizes.iter().any(|&s| s == 0 || !s.is_multiple_of(MIN_BLOCK)) {
            return Err("caching allocator sizes must be non-zero multiples of 512");
        }
        if self.small_max > self.small_segment {
            return Err("small_max must fit in small_segment");
        }
        if self.front_depth > u16::MAX as usize {
            return Err("front_depth above 65535");
        }
        Ok(())
    }

    /// The pool serving `class`.
    #[inline]
    pub(super) fn pool_of(&self, class: SizeClass) -> Pool {
        if class.bytes() <= self.small_max { Pool::Small } else { Pool::Large }
    }

    /// Bytes of a new segment for `class`, or `None` when rounding overflows.
    pub(super) fn segment_bytes(&self, class: SizeClass) -> Option<usize> {
        let bytes = class.bytes();
        if bytes <= self.small_max {
            Some(self.small_segment)
        } else if bytes < self.own_segment_from {
            Some(self.large_segment.max(bytes.checked_next_multiple_of(self.granularity)?))
        } else {
            bytes.checked_next_multiple_of(self.granularity)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::size_class::class_of;
    use super::*;

    #[test]
    fn segments_follow_the_request_size() {
        let config = Config::default();
        let segment = |bytes| config.segment_bytes(class_of(bytes).unwrap()).unwrap();
        assert_eq!(segment(4096), 2 << 20);
        assert_eq!(segment(1 << 20), 2 << 20);
        assert_eq!(segment((1 << 20) + 1), 20 << 20);
        assert_eq!(segment(9 << 20), 20 << 20);
        assert_eq!(segment(10 << 20), 10 << 20);
        assert_eq!(segment(64 << 20), 64 << 20);
        assert_eq!(segment((10 << 20) + 1), 12 << 20); // class 10.5 MiB, rounded to 2 MiB
        assert_eq!(config.pool_of(class_of(1 << 20).unwrap()), Pool::Small);
        assert_eq!(config.pool_of(class_of((1 << 20) + 1).unwrap()), Pool::Large);
        let coarse = Config { granularity: 1 << (usize::BITS - 2), ..Config::default() };
        assert_eq!(coarse.segment_bytes(class_of((3 << (usize::BITS - 2)) + 1).unwrap()), None);
    }

    #[test]
    fn bad_parameters_are_named() {
        assert!(Config::default().check().is_ok());
        assert!(Config { granularity: 1000, ..Config::default() }.check().is_err());
        assert!(Config { small_max: 4 << 20, ..Config::default() }.check().is_err());
    }
}
