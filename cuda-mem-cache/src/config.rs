//! The allocator's parameters: how requests map to segments, and how much each thread's front
//! cache may hold.

use super::size_class::{MIN_BLOCK, SizeClass};

/// Which segments a request is carved from. Small requests stay out of large segments, so that
/// a few long-lived small blocks cannot keep a large segment from becoming free as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    /// Classes up to [`Config::small_max`], in segments of up to [`Config::small_segment`] bytes.
    Small = 0,
    /// Larger classes.
    Large = 1,
    /// Classes from [`Config::own_range_from`] up, when that is on and segments are growable:
    /// address ranges of their own, apart from the smaller classes' (see there).
    Huge = 2,
}

/// How many pools there are: one past the last, so that arrays indexed by pool follow the enum.
pub(super) const POOLS: usize = Pool::Huge as usize + 1;

/// Parameters of a [`CachingAllocator`](super::CachingAllocator). Sizes are multiples of 512.
///
/// The segment sizes are PyTorch's. The rest keeps the reserve close to what is in use: over
/// whole segments, the defaults hold the peak reserve within 1.15 times the peak of requested
/// bytes on the one-thread replays of cuda-mem's `tests/cache_replay.rs` (three seeds of the
/// serving workload's log, of gigabytes: 1.12–1.14; eight schedules of the stress example's log,
/// of a few megabytes: 1.02–1.08), where PyTorch's segment sizes alone, with none of the rules
/// below, reserve 1.14–1.17 and 1.58–2.12 times. The price is misses: on the stress log a third
/// of the allocations need a new segment (a few megabytes cached cannot hold every size it sees),
/// on the serving logs about one in thirty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Classes up to this share small segments.
    pub small_max: usize,
    /// Bytes of a small segment, at most; see `small_segment_divisor`.
    pub small_segment: usize,
    /// Bytes of a shared large segment, for large classes below `own_segment_from`.
    pub large_segment: usize,
    /// Classes from this size up get a segment of their own, rounded up to `granularity`; the
    /// rest of it is a free block like any other.
    pub own_segment_from: usize,
    /// Own segments are a multiple of this.
    pub granularity: usize,
    /// A new small segment holds this fraction of the small pool's reserve (rounded down to a
    /// power of two, from 512 bytes up to `small_segment`, and at least its request), so that
    /// a cache of a few megabytes does not grow by whole `small_segment`s; 0 gives every small
    /// segment `small_segment` bytes.
    pub small_segment_divisor: usize,
    /// A free small block larger than the small pool's segments now (one that was a segment of
    /// its own) serves only requests that leave at most this fraction of the request (a quarter)
    /// free: cut further, its rest would be holes in a segment that cannot be released. 0 lets
    /// any block serve.
    pub small_fit_divisor: usize,
    /// A free block larger than `large_segment` (from an own segment) serves only requests that
    /// leave at most this many bytes of it: a long-lived block cut from it would keep its rest
    /// from serving the large requests it was freed by.
    pub large_fit_slack: usize,
    /// Blocks each thread keeps per stream and class up to `front_max_block`; 0 turns those bins
    /// off (the large-block slot is `front_large_slot`'s: turn both off for no front cache).
    pub front_depth: usize,
    /// Bytes each thread may keep in its front cache (per allocator).
    pub front_max_bytes: usize,
    /// Blocks larger than this skip the front caches and return to the core at once, where they
    /// merge with their free neighbours: a parked block stays whole, and parked large blocks of
    /// sizes that do not come back keep the space around them from serving other sizes. The
    /// default, the small pool's largest class, keeps the front caches for the small blocks that
    /// come and go most; on the corpus over the fake backend, parking large blocks too raised the
    /// serving replay's reserve from 1.042 to 1.083 times live and tripled the recorded training
    /// trace's misses.
    pub front_max_block: usize,
    /// Each thread's front cache keeps one block it freed above `front_max_block` (within
    /// `front_max_bytes`) until that thread's next miss: the first freed while its slot is empty
    /// (a hit or a miss empties it; a later free goes to the core rather than swap, which would
    /// take the core's lock). A thread that frees and allocates one large size in turn reuses it
    /// without the core, and at most one large block per thread is kept from merging, for one
    /// miss at most. Independent of `front_depth`.
    pub front_large_slot: bool,
    /// When a stream finds no free memory of its own but another stream has a free segment whose
    /// last use has not been seen completing, the stream waits for it on the device
    /// (`cudaStreamWaitEvent`) rather than growing the cache.
    pub cross_stream_waits: bool,
    /// When a new segment would take the reserve above its highest figure so far, idle segments
    /// are released first, largest first, until it would not (each after its last use, which the
    /// miss waits for: `cudaFree` waits for the device anyway). Trades `cudaFree` calls, and
    /// the waits, on such misses for a reserve that follows what is in use rather than the sum
    /// of every size ever cached; below the high-water mark misses release nothing.
    pub release_idle_on_miss: bool,
    /// Over growable segments with `release_idle_on_miss`, a miss may also map pages up to this
    /// many hundredths above the bytes allocated then (the request included) without unmapping
    /// any, even above the reserve's peak: a workload whose live bytes climb step by step (a
    /// training run meeting longer sequences) then pays no unmap and later map at each step, and
    /// the reserve still stays within this share above the live peak, plus the partial pages
    /// that free blocks keep. 0: the peak alone decides. (On the corpus over the fake backend on
    /// 2026-12-03, 4 took the training replay's unmaps after warm-up from 8 to none, and its
    /// misses from 2 to none, at a reserve of 1.014 times live rather than 1.001; the serving
    /// replay's reserve went from 1.037 to 1.041 times live.)
    pub live_slack_percent: usize,
    /// Over a backend with [`Pages`](super::Pages) (the CUDA one, where the driver has virtual
    /// memory management), each stream's pool grows one reserved address range page by page, as
    /// PyTorch's `expandable_segments`: freed blocks coalesce across the whole range, and memory
    /// moves between streams and sizes by unmapping free pages (with `release_idle_on_miss`,
    /// when mapping would raise the reserve's peak) rather than by releasing whole segments.
    /// The segment sizes above then do not apply. Off, or without pages: segments allocated whole.
    pub expandable_segments: bool,
    /// Over [`Pages`](super::Pages), the largest physical allocation a miss creates (rounded
    /// down to whole pages; 0 or less than a page: a page each). A miss that maps at least a
    /// quarter of this creates its new memory in allocations of up to this size, each one
    /// `cuMemCreate` and `cuMemMap`; a smaller miss, a page each. The driver's cost is per call
    /// far more than per byte, so large mappings make a large miss (and the refill after
    /// `empty_cache`) a few calls; but a mapping goes back to the driver only whole, so free
    /// memory inside a partly used one stays mapped: small misses keep to pages, because the
    /// small blocks that later reuse their space would pin a large mapping. Default 64 MiB
    /// (docs/measurements/2026-12-06-h100-mapping-sizes.txt).
    pub max_mapping_bytes: usize,
    /// Over [`Pages`](super::Pages), what a miss of the large pool maps beyond its request while
    /// the reserve is below its peak (after `empty_cache`, a trim or blocks given back): up to
    /// this many bytes more, never within this many bytes of the peak (that room stays for
    /// other misses' requests), in allocations of up to
    /// [`max_mapping_bytes`](Self::max_mapping_bytes). Memory below the peak costs nothing the
    /// peak has not cost already, and the stream's next large misses find it mapped: a refill
    /// after `empty_cache` takes a few misses instead of one per request. If the device has too
    /// little memory for the extra, the miss maps its request alone. 0: a miss maps only what it
    /// needs (for a process that empties the cache to leave memory to others). Default 64 MiB.
    pub map_ahead_bytes: usize,
    /// With growable segments, classes from this size up are cut from address ranges of their
    /// own (a third pool per stream), apart from smaller ones; 0: off (the default). A large
    /// miss maps allocations of up to [`max_mapping_bytes`](Self::max_mapping_bytes), which go
    /// back to the driver only whole: without this, a small block that reuses part of a large
    /// block's space after its free keeps the whole mapping from going back for as long as it
    /// lives. A serving engine's KV-cache pages, which live for hundreds of steps and take the
    /// space of prefill buffers freed before them, are that case. Apart, and with this at most a
    /// quarter of `max_mapping_bytes` (16 MiB by default), the smaller classes keep to page-sized
    /// mappings, and a large block's mappings go back whole once it is freed.
    /// The price is paid where sizes cross the line from step to step (a training loop's
    /// activations): free memory on one side does not serve the other without an unmap and a
    /// map, so such a workload misses more and reserves more. Measured in docs/workloads.md
    /// (2026-12-07, `own_range_16`).
    pub own_range_from: usize,
    /// With growable segments, a request of the larger classes that is a whole number of pages
    /// takes the free block of its stream at the lowest address that fits (address-ordered first
    /// fit) rather than the smallest one (best fit); other requests keep best fit, which leaves
    /// the smallest holes. Blocks of whole pages then pack at the start of the stream's range, and
    /// the memory that large transient blocks free at its end stays in whole mappings, which a
    /// trim can give back: where best fit cuts a serving engine's KV-cache page (2 MiB) from a
    /// freed prefill buffer's place, which may be the smallest free block, and pins that
    /// buffer's whole mapping. Sizes that are not whole pages leave parts of pages wherever they
    /// go, so for them the smallest hole is the better choice. Off by default (not yet measured on
    /// the GPU; over the fake backend in docs/workloads.md, 2026-12-07, `lowest_pages`). The
    /// search looks at every free block of the stream's pool large enough, where best fit looks
    /// at one.
    pub lowest_for_whole_pages: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            small_max: 1 << 20,
            small_segment: 2 << 20,
            large_segment: 20 << 20,
            own_segment_from: 10 << 20,
            granularity: 2 << 20,
            small_segment_divisor: 32,
            small_fit_divisor: 4,
            large_fit_slack: 2 << 20,
            front_depth: 8,
            front_max_bytes: 256 << 20,
            front_max_block: 1 << 20,
            front_large_slot: true,
            cross_stream_waits: true,
            release_idle_on_miss: true,
            live_slack_percent: 4,
            expandable_segments: true,
            max_mapping_bytes: 64 << 20,
            map_ahead_bytes: 64 << 20,
            own_range_from: 0,
            lowest_for_whole_pages: false,
        }
    }
}

impl Config {
    /// Parameters for speed over a tight reserve, as PyTorch's allocator chooses: whole
    /// `small_segment`s, and no idle segment released on a miss (a miss above the high-water
    /// mark then costs one `cudaMalloc`, never a `cudaFree` that waits for the whole device).
    /// The reserve keeps every size ever cached until [`empty_cache`](crate::CachingAllocator::empty_cache)
    /// or an out-of-memory retry releases it.
    pub fn throughput() -> Self {
        Self { small_segment_divisor: 0, release_idle_on_miss: false, ..Self::default() }
    }

    /// Why these parameters cannot work, if they cannot.
    pub fn check(&self) -> Result<(), &'static str> {
        let sizes = [self.small_max, self.small_segment, self.large_segment, self.own_segment_from, self.granularity];
        if sizes.iter().any(|&s| s == 0 || !s.is_multiple_of(MIN_BLOCK)) {
            return Err("caching allocator sizes must be non-zero multiples of 512");
        }
        if self.small_max > self.small_segment {
            return Err("small_max must fit in small_segment");
        }
        if self.live_slack_percent > 100 {
            return Err("live_slack_percent above 100");
        }
        if self.front_depth > u16::MAX as usize {
            return Err("front_depth above 65535");
        }
        Ok(())
    }

    /// The pool serving `class`.
    #[inline]
    pub(super) fn pool_of(&self, class: SizeClass) -> Pool {
        if class.bytes() <= self.small_max {
            Pool::Small
        } else if self.own_range_from > 0 && self.expandable_segments && class.bytes() >= self.own_range_from {
            Pool::Huge
        } else {
            Pool::Large
        }
    }

    /// The size of the segments `pool` grows by, holding `pool_reserved` bytes (a request larger
    /// than it gets a segment of its own size).
    pub(super) fn segment_target(&self, pool: Pool, pool_reserved: usize) -> usize {
        match pool {
            Pool::Small if self.small_segment_divisor > 0 => {
                let share = (pool_reserved / self.small_segment_divisor).clamp(MIN_BLOCK, self.small_segment);
                (1 << share.ilog2()).max(MIN_BLOCK)
            }
            Pool::Small => self.small_segment,
            Pool::Large | Pool::Huge => self.large_segment,
        }
    }

    /// Whether a free block of `size` bytes may serve a request of `bytes` (at most `size`) in
    /// `pool`, whose segments are `target` bytes now.
    #[inline]
    pub(super) fn may_cut(&self, pool: Pool, target: usize, size: usize, bytes: usize) -> bool {
        let rest = size - bytes;
        size <= target
            || match pool {
                Pool::Small => self.small_fit_divisor == 0 || rest <= bytes / self.small_fit_divisor,
                Pool::Large | Pool::Huge => rest <= self.large_fit_slack,
            }
    }

    /// The largest new mapping for a miss that maps `run` bytes (0: a page); see
    /// [`Config::max_mapping_bytes`].
    pub(super) fn largest_new_mapping(&self, run: usize) -> usize {
        if run >= self.max_mapping_bytes / 4 { self.max_mapping_bytes } else { 0 }
    }

    /// The reserve a miss may grow to without releasing anything, `allocated` bytes being out
    /// then (the request included): [`Config::live_slack_percent`] above them.
    pub(super) fn live_budget(&self, allocated: usize) -> usize {
        allocated.saturating_add(allocated / 100 * self.live_slack_percent)
    }

    /// Bytes of a new segment for `class` in a pool whose segments are `target` bytes now, or
    /// `None` when rounding overflows.
    pub(super) fn segment_bytes(&self, class: SizeClass, target: usize) -> Option<usize> {
        let bytes = class.bytes();
        if bytes <= self.small_max {
            Some(target.max(bytes))
        } else if bytes < self.own_segment_from {
            Some(target.max(bytes.checked_next_multiple_of(self.granularity)?))
        } else {
            bytes.checked_next_multiple_of(self.granularity)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::size_class::class_of;
    use super::*;

    /// The segment a request gets in a pool holding `pool_reserved` bytes.
    fn segment(config: &Config, bytes: usize, pool_reserved: usize) -> usize {
        let class = class_of(bytes).unwrap();
        config.segment_bytes(class, config.segment_target(config.pool_of(class), pool_reserved)).unwrap()
    }

    #[test]
    fn the_throughput_parameters_take_whole_small_segments_and_release_nothing_on_a_miss() {
        let config = Config::throughput();
        assert_eq!(config.check(), Ok(()));
        assert!(!config.release_idle_on_miss);
        // A first small request, in an empty pool, gets a whole small segment.
        assert_eq!(segment(&config, 4096, 0), config.small_segment);
        assert!(segment(&Config::default(), 4096, 0) < config.small_segment);
    }

    #[test]
    fn segments_follow_the_request_size() {
        let config = Config::default();
        let full = 1 << 30; // a small pool this large grows by whole small segments
        assert_eq!(segment(&config, 4096, full), 2 << 20);
        assert_eq!(segment(&config, 1 << 20, full), 2 << 20);
        assert_eq!(segment(&config, (1 << 20) + 1, 0), 20 << 20);
        assert_eq!(segment(&config, 9 << 20, 0), 20 << 20);
        assert_eq!(segment(&config, 10 << 20, 0), 10 << 20);
        assert_eq!(segment(&config, 64 << 20, 0), 64 << 20);
        assert_eq!(segment(&config, (10 << 20) + 1, 0), 12 << 20); // class 10.5 MiB, rounded to 2 MiB
        assert_eq!(config.pool_of(class_of(1 << 20).unwrap()), Pool::Small);
        assert_eq!(config.pool_of(class_of((1 << 20) + 1).unwrap()), Pool::Large);
        let coarse = Config { granularity: 1 << (usize::BITS - 2), ..Config::default() };
        assert_eq!(coarse.segment_bytes(class_of((3 << (usize::BITS - 2)) + 1).unwrap(), 20 << 20), None);
    }

    #[test]
    fn classes_from_own_range_from_up_get_a_pool_of_their_own_over_growable_segments() {
        let pool = |config: &Config, bytes: usize| config.pool_of(class_of(bytes).unwrap());
        let apart = Config { own_range_from: 16 << 20, ..Config::default() };
        assert_eq!(pool(&apart, 16 << 20), Pool::Huge);
        assert_eq!(pool(&apart, 15 << 20), Pool::Large);
        assert_eq!(pool(&apart, 4096), Pool::Small);
        assert_eq!(pool(&Config::default(), 1 << 30), Pool::Large, "off by default");
        let whole = Config { expandable_segments: false, ..apart.clone() };
        assert_eq!(pool(&whole, 1 << 30), Pool::Large, "whole segments have no ranges to keep apart");
        let below_small = Config { own_range_from: 512, ..Config::default() };
        assert_eq!(pool(&below_small, 4096), Pool::Small, "the small pool comes first");
    }

    #[test]
    fn small_segments_grow_with_the_small_pool() {
        let config = Config::default();
        assert_eq!(segment(&config, 4096, 0), 4096, "an empty pool grows by the request");
        assert_eq!(segment(&config, 100, 0), 512);
        assert_eq!(segment(&config, 4096, 1 << 20), 32 << 10, "a thirty-second of the pool");
        assert_eq!(segment(&config, 4096, 3 << 20), 64 << 10, "rounded down to a power of two");
        assert_eq!(segment(&config, 200 << 10, 1 << 20), 200 << 10, "at least the request");
        assert_eq!(segment(&config, 4096, 64 << 20), 2 << 20, "at most small_segment");
        let fixed = Config { small_segment_divisor: 0, ..Config::default() };
        assert_eq!(segment(&fixed, 4096, 0), 2 << 20);
    }

    #[test]
    fn blocks_larger_than_their_pools_segments_serve_only_close_requests() {
        let config = Config::default();
        let small = config.segment_target(Pool::Small, 1 << 20); // 32 KiB segments
        assert!(config.may_cut(Pool::Small, small, 32 << 10, 512), "a segment-sized block serves anything");
        assert!(config.may_cut(Pool::Small, small, 100 << 10, 80 << 10), "a rest of a quarter of the request");
        assert!(!config.may_cut(Pool::Small, small, 101 << 10, 80 << 10));
        let large = config.segment_target(Pool::Large, 0);
        assert!(config.may_cut(Pool::Large, large, 20 << 20, 2 << 20));
        assert!(config.may_cut(Pool::Large, large, 66 << 20, 64 << 20));
        assert!(!config.may_cut(Pool::Large, large, 66 << 20, (62 << 20) - 512), "a rest above 2 MiB");
        let any = Config { small_fit_divisor: 0, large_fit_slack: usize::MAX, ..Config::default() };
        assert!(any.may_cut(Pool::Small, small, 1 << 20, 512) && any.may_cut(Pool::Large, large, 1 << 30, 512));
    }

    #[test]
    fn bad_parameters_are_named() {
        assert!(Config::default().check().is_ok());
        assert!(Config { granularity: 1000, ..Config::default() }.check().is_err());
        assert!(Config { small_max: 4 << 20, ..Config::default() }.check().is_err());
    }
}
