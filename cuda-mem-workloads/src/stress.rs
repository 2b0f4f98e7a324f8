//! The operations of the `stress` example's threads, as a deterministic schedule: the example
//! runs them against every family, and the caching allocator's replay test derives the pool
//! family's allocations from the same schedule, so the log the example writes and the events
//! the test replays cannot drift apart.

/// What one step of a stress thread does. Indices point into the caller's list of live buffers,
/// which the caller keeps as the schedule does: a new buffer (`Allocate`, `Copy`) is pushed at
/// the end, and `Free` removes with `Vec::swap_remove`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // every variant's `stream` is the index of the stream the step runs on
pub enum StressOp {
    /// Allocate `len` elements from `family`, filled from `fill_seed`.
    Allocate { stream: usize, family: usize, len: usize, fill_seed: u64 },
    /// Read back live buffer `index` and check its contents.
    Verify { stream: usize, index: usize },
    /// Copy live buffer `index` into a new buffer of its family and length.
    Copy { stream: usize, index: usize },
    /// Free live buffer `index`.
    Free { stream: usize, index: usize },
    /// Nothing (the drawn operation needed buffers that are not there).
    Idle { stream: usize },
}

/// A stress thread's operations: an endless iterator of [`StressOp`]s over `streams` streams and
/// `families` allocation families, the same for the same `thread_seed`. Allocations stop while
/// [`StressSchedule::MAX_LIVE`] buffers are live (copies do not, so a few more may be).
///
/// ```
/// use cuda_mem_workloads::stress::{StressOp, StressSchedule};
/// let mut live = 0usize;
/// for op in StressSchedule::new(1, 4, 6).take(1000) {
///     match op {
///         StressOp::Allocate { .. } => {
///             assert!(live < StressSchedule::MAX_LIVE);
///             live += 1;
///         }
///         StressOp::Copy { index, .. } => {
///             assert!(index < live);
///             live += 1;
///         }
///         StressOp::Free { index, .. } => {
///             assert!(index < live);
///             live -= 1;
///         }
///         StressOp::Verify { index, .. } => assert!(index < live),
///         StressOp::Idle { .. } => {}
///     }
/// }
/// ```
#[derive(Debug, Clone)]
pub struct StressSchedule {
    state: u64,
    streams: u64,
    families: u64,
    live: usize,
}

impl StressSchedule {
    /// Live buffers at which allocations stop.
    pub const MAX_LIVE: usize = 32;
    /// Largest allocation, in elements.
    pub const MAX_LEN: usize = 64 << 10;

    /// The schedule of the thread with `thread_seed` (the example's threads use their index plus
    /// one), over `streams` streams and `families` families (both at least 1).
    pub fn new(thread_seed: u64, streams: usize, families: usize) -> Self {
        Self {
            state: 0x9E37_79B9_7F4A_7C15 ^ thread_seed,
            streams: streams.max(1) as u64,
            families: families.max(1) as u64,
            live: 0,
        }
    }

    /// xorshift: deterministic, no dependency.
    fn next_u64(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

impl Iterator for StressSchedule {
    type Item = StressOp;

    fn next(&mut self) -> Option<StressOp> {
        let stream = self.below(self.streams) as usize;
        let live = self.live;
        let op = match self.below(10) {
            0..=3 if live < Self::MAX_LIVE => {
                let family = self.below(self.families) as usize;
                let len = 1 + self.below(Self::MAX_LEN as u64) as usize;
                let fill_seed = self.next_u64();
                self.live += 1;
                StressOp::Allocate { stream, family, len, fill_seed }
            }
            4..=6 if live > 0 => StressOp::Verify { stream, index: self.below(live as u64) as usize },
            7 if live >= 2 => {
                self.live += 1;
                StressOp::Copy { stream, index: self.below(live as u64) as usize }
            }
            _ if live > 0 => {
                self.live -= 1;
                StressOp::Free { stream, index: self.below(live as u64) as usize }
            }
            _ => StressOp::Idle { stream },
        };
        Some(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_others_differ() {
        let first: Vec<StressOp> = StressSchedule::new(1, 4, 6).take(500).collect();
        assert_eq!(first, StressSchedule::new(1, 4, 6).take(500).collect::<Vec<_>>());
        assert_ne!(first, StressSchedule::new(2, 4, 6).take(500).collect::<Vec<_>>());
    }

    #[test]
    fn indices_stay_within_the_live_buffers_and_every_kind_of_step_occurs() {
        let (mut live, mut kinds) = (0usize, [0usize; 5]);
        for op in StressSchedule::new(7, 3, 5).take(20_000) {
            match op {
                StressOp::Allocate { stream, family, len, .. } => {
                    assert!(stream < 3 && family < 5 && (1..=StressSchedule::MAX_LEN).contains(&len));
                    assert!(live < StressSchedule::MAX_LIVE, "an allocation with {live} buffers live");
                    live += 1;
                    kinds[0] += 1;
                }
                StressOp::Verify { index, .. } => {
                    assert!(index < live);
                    kinds[1] += 1;
                }
                StressOp::Copy { index, .. } => {
                    assert!(index < live && live >= 2);
                    live += 1;
                    kinds[2] += 1;
                }
                StressOp::Free { index, .. } => {
                    assert!(index < live);
                    live -= 1;
                    kinds[3] += 1;
                }
                StressOp::Idle { .. } => kinds[4] += 1,
            }
        }
        assert!(kinds[..4].iter().all(|&n| n > 0), "{kinds:?}");
    }
}
