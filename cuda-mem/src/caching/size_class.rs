//! Size classes of the device caching allocator: 512-byte steps up to 8 KiB, then sixteen classes
//! per power of two. Rounding wastes less than a sixteenth of any request above 8 KiB (under 512
//! bytes below), and a block of a class serves every request of that class, which is what lets
//! the per-thread front cache reuse blocks by class alone.

/// The smallest block and the granularity of every block and segment size.
pub const MIN_BLOCK: usize = 512;
const STEPS_PER_DOUBLING: usize = 16;
/// Up to here classes step by `MIN_BLOCK`; above, by a sixteenth of the power of two below.
const LINEAR_END: usize = MIN_BLOCK * STEPS_PER_DOUBLING;
const LINEAR_SHIFT: u32 = LINEAR_END.trailing_zeros();

/// Number of classes: enough for any size representable in `usize`.
pub const NUM_CLASSES: usize = STEPS_PER_DOUBLING + (usize::BITS - LINEAR_SHIFT) as usize * STEPS_PER_DOUBLING;

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
        let j = i - STEPS_PER_DOUBLING;
        let shift = LINEAR_SHIFT + u32::try_from(j / STEPS_PER_DOUBLING).ok()?;
        let base = 1usize.checked_shl(shift)?;
        let steps = j % STEPS_PER_DOUBLING + 1;
        let bytes = base.checked_add(steps * (base / STEPS_PER_DOUBLING))?;
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
    let (steps, bytes) = crate::size_steps::round_up(bytes, LINEAR_SHIFT, STEPS_PER_DOUBLING)?;
    let index = STEPS_PER_DOUBLING - 1 + steps;
    Some(SizeClass { index: index as u16, bytes })
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
        assert_eq!(class_of((1 << 20) + 1).unwrap().bytes(), (1 << 20) + (1 << 16));
        assert_eq!(class_of(64 << 20).unwrap().bytes(), 64 << 20);
        assert_eq!(class_of((64 << 20) + 1).unwrap().bytes(), 68 << 20);
    }

    #[test]
    fn every_size_fits_with_under_a_sixteenth_wasted_and_indices_round_trip() {
        let mut previous = class_of(0).unwrap();
        let mut bytes = 1usize;
        while bytes < (1 << 50) {
            for probe in [bytes - 1, bytes, bytes + 1, bytes + bytes / 3] {
                let class = class_of(probe).unwrap();
                assert!(class.bytes() >= probe.max(1));
                assert_eq!(class.bytes() % MIN_BLOCK, 0);
                assert!(usize::from(class.index()) < NUM_CLASSES);
                if probe > LINEAR_END {
                    assert!((class.bytes() - probe) * 16 < probe, "{probe} -> {}", class.bytes());
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
