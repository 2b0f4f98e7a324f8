//! Size classes of the device caching allocator: 512-byte steps up to 8 KiB; above, each power
//! of two is cut into equal steps of a sixteenth of it (a sixty-fourth from 1 MiB to 32 MiB),
//! but at most 2 MiB and at least a 512th of it. So rounding wastes under 512 bytes below 8 KiB,
//! under a sixteenth of a request up to 1 MiB (the sizes that come and go most, which the front
//! caches keep by class: few classes, each reused often) and under a sixty-fourth up to 32 MiB
//! (blocks the front caches' bins skip); above, large blocks round to whole 2 MiB pages, the
//! granularity of growable segments on current GPUs (a freed block then frees whole pages that
//! can move to other sizes and streams, where finer steps left partial pages on both sides and
//! raised the serving replay's reserve from 1.03 to 1.08 times live), wasting under 2 MiB
//! rather than a sixteenth of a tensor of hundreds of megabytes; from 1 GiB up, a 512th of the
//! power of two. A block of a class serves every request of that class, which is what lets the
//! per-thread front cache reuse blocks by class alone.

/// The smallest block and the granularity of every block and segment size.
pub const MIN_BLOCK: usize = 512;
const STEPS_PER_DOUBLING: usize = 16;
/// Up to here classes step by `MIN_BLOCK`; above, by a sixteenth of the power of two below.
const LINEAR_END: usize = MIN_BLOCK * STEPS_PER_DOUBLING;
const LINEAR_SHIFT: u32 = LINEAR_END.trailing_zeros();
/// The largest step while a 512th of the power of two is smaller.
const PAGE_STEP: usize = 2 << 20;
const FINEST_STEPS: usize = 512;
/// From 1 MiB to 32 MiB, the large blocks below a page step, a sixty-fourth: these blocks skip
/// the front caches' bins (whose hits want few classes), and a sixteenth wasted 2% of the bytes
/// of workloads made of them (churn, mixed) in rounding alone.
const FINE_SHIFTS: std::ops::Range<u32> = 20..25;
const FINE_STEPS: usize = 64;

/// log2 of the step of the sizes between `1 << shift` and twice that (`shift >= LINEAR_SHIFT`).
const fn step_shift(shift: u32) -> u32 {
    let steps = if shift >= FINE_SHIFTS.start && shift < FINE_SHIFTS.end { FINE_STEPS } else { STEPS_PER_DOUBLING };
    let coarse = shift - steps.trailing_zeros();
    let page = PAGE_STEP.trailing_zeros();
    let finest = shift.saturating_sub(FINEST_STEPS.trailing_zeros());
    let capped = if coarse < page { coarse } else { page };
    if capped > finest { capped } else { finest }
}

/// `START[shift]`: the index of the class of exactly `1 << shift` bytes, for `shift` from
/// `LINEAR_SHIFT` to `usize::BITS` (that last one is one past the largest class).
const START: [usize; usize::BITS as usize + 1] = {
    let mut start = [0; usize::BITS as usize + 1];
    start[LINEAR_SHIFT as usize] = STEPS_PER_DOUBLING - 1;
    let mut shift = LINEAR_SHIFT;
    while shift < usize::BITS {
        start[shift as usize + 1] = start[shift as usize] + (1 << (shift - step_shift(shift)));
        shift += 1;
    }
    start
};

/// Number of classes: enough for any size representable in `usize`.
pub const NUM_CLASSES: usize = START[usize::BITS as usize] + 1;
const _: () = assert!(NUM_CLASSES <= u16::MAX as usize);

/// A size class: its index and the bytes every block of it holds (a multiple of [`MIN_BLOCK`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SizeClass {
    index: u16,
    bytes: usize,
}

impl SizeClass {
    /// The index, dense from 0 (the smallest class) to `NUM_CLASSES - 1`.
    #[inline]
    pub fn index(self) -> u16 {
        self.index
    }

    /// Bytes of every block of this class.
    #[inline]
    pub fn bytes(self) -> usize {
        self.bytes
    }

    /// The class with this index, or `None` past the largest representable one.
    pub fn from_index(index: u16) -> Option<Self> {
        let i = usize::from(index);
        if i >= NUM_CLASSES {
            return None;
        }
        if i < STEPS_PER_DOUBLING {
            return Some(Self { index, bytes: (i + 1) * MIN_BLOCK });
        }
        // The doubling whose classes hold index `i`: the last start at or below it.
        let shift = (LINEAR_SHIFT..usize::BITS).rev().find(|&s| START[s as usize] <= i)?;
        let base = 1usize.checked_shl(shift)?;
        let steps = i - START[shift as usize];
        let bytes = base.checked_add(steps << step_shift(shift))?;
        Some(Self { index, bytes })
    }
}

/// The class serving `bytes` (0 is served like 1), or `None` when its size would overflow `usize`.
#[inline]
pub fn class_of(bytes: usize) -> Option<SizeClass> {
    if bytes <= LINEAR_END {
        let steps = bytes.div_ceil(MIN_BLOCK).max(1);
        return Some(SizeClass { index: (steps - 1) as u16, bytes: steps * MIN_BLOCK });
    }
    let shift = usize::BITS - 1 - bytes.leading_zeros(); // floor(log2(bytes)) >= LINEAR_SHIFT
    let step = step_shift(shift);
    // Steps are powers of two: shifts, not divisions (this runs on every allocation).
    let steps = (bytes - (1 << shift)).div_ceil(1 << step); // up to the next power of two
    let rounded = (1usize << shift).checked_add(steps << step)?;
    Some(SizeClass { index: (START[shift as usize] + steps) as u16, bytes: rounded })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_requests_step_by_512_bytes() {
        for (bytes, class) in [(0, 512), (1, 512), (512, 512), (513, 1024), (4096, 4096), (8191, 8192), (8192, 8192)] {
            assert_eq!(class_of(bytes).unwrap().bytes(), class, "{bytes}");
        }
        assert_eq!(class_of(8192).unwrap().index(), 15);
    }

    #[test]
    fn classes_step_by_sixteenths_of_a_power_of_two() {
        assert_eq!(class_of(8193).unwrap().bytes(), 8192 + 512);
        assert_eq!(class_of(16384).unwrap(), SizeClass { index: 31, bytes: 16384 });
        assert_eq!(class_of(16385).unwrap().bytes(), 16384 + 1024);
        assert_eq!(class_of(1 << 20).unwrap().bytes(), 1 << 20);
        assert_eq!(class_of((1 << 20) - 1).unwrap().bytes(), 1 << 20);
    }

    #[test]
    fn large_classes_step_by_64ths_then_by_pages_then_by_512ths() {
        assert_eq!(class_of((1 << 20) + 1).unwrap().bytes(), (1 << 20) + (16 << 10));
        assert_eq!(class_of((16 << 20) + 1).unwrap().bytes(), (16 << 20) + (256 << 10));
        assert_eq!(class_of((32 << 20) - 1).unwrap().bytes(), 32 << 20);
        assert_eq!(class_of((32 << 20) + 1).unwrap().bytes(), 34 << 20);
        assert_eq!(class_of((64 << 20) + 1).unwrap().bytes(), 66 << 20);
        assert_eq!(class_of((700 << 20) + 1).unwrap().bytes(), 702 << 20);
        assert_eq!(class_of((1 << 30) + 1).unwrap().bytes(), (1 << 30) + (2 << 20));
        assert_eq!(class_of((4 << 30) + 1).unwrap().bytes(), (4 << 30) + (8 << 20));
        // Consecutive classes across a change of step.
        let at = |bytes| class_of(bytes).unwrap().index();
        assert_eq!(at(32 << 20) + 1, at((32 << 20) + 1));
        assert_eq!(at(64 << 20) - at(32 << 20), 16);
        assert_eq!(at(128 << 20) - at(64 << 20), 32);
        assert_eq!(at(2 << 30) - at(1 << 30), 512);
    }

    #[test]
    fn every_size_fits_with_little_wasted_and_indices_round_trip() {
        let mut previous = class_of(0).unwrap();
        let mut bytes = 1usize;
        while bytes < (1 << 50) {
            for probe in [bytes - 1, bytes, bytes + 1, bytes + bytes / 3] {
                let class = class_of(probe).unwrap();
                assert!(class.bytes() >= probe.max(1));
                assert_eq!(class.bytes() % MIN_BLOCK, 0);
                assert!(usize::from(class.index()) < NUM_CLASSES);
                if probe > LINEAR_END {
                    let waste = class.bytes() - probe;
                    let steps = if (1 << 20..32 << 20).contains(&probe) { 64 } else { 16 };
                    assert!(
                        waste * steps < probe && waste < PAGE_STEP.max(probe / 256),
                        "{probe} -> {}",
                        class.bytes()
                    );
                } else {
                    assert!(class.bytes() - probe.max(1) < MIN_BLOCK);
                }
                // Same index, same bytes: a block fits every request of its class.
                assert_eq!(class_of(class.bytes()).unwrap(), class);
                assert_eq!(SizeClass::from_index(class.index()), Some(class));
            }
            let class = class_of(bytes).unwrap();
            assert!(class.index() >= previous.index());
            previous = class;
            bytes = bytes * 5 / 4 + 1;
        }
    }

    #[test]
    fn sizes_near_usize_max_do_not_overflow() {
        assert!(class_of(usize::MAX).is_none());
        let top = class_of(1usize << (usize::BITS - 1)).unwrap();
        assert!(usize::from(top.index()) < NUM_CLASSES);
        assert_eq!(SizeClass::from_index(top.index()), Some(top));
        assert_eq!(SizeClass::from_index(NUM_CLASSES as u16 - 1), None); // 2^64 does not fit
    }
}
