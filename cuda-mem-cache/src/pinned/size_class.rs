//! Size classes of the pinned caching pool: four per power of two (1, 1.25, 1.5 and 1.75 × 2^k),
//! so a request wastes at most 25% and a freed block serves every request of its class.

/// The smallest block; smaller requests share it.
pub const MIN_BLOCK: usize = 4096;
const MIN_SHIFT: u32 = MIN_BLOCK.trailing_zeros();
const STEPS_PER_DOUBLING: usize = 4;

/// Number of classes: enough for any block size representable in `usize`.
pub const NUM_CLASSES: usize = (usize::BITS - MIN_SHIFT) as usize * STEPS_PER_DOUBLING + 1;

/// A size class: its index and the bytes a block of it holds. Only [`class_of`] makes one, so
/// the two always agree and the index is below [`NUM_CLASSES`]:
/// ```compile_fail,E0451
/// let _ = cuda_mem_cache::pinned::PinnedClass { index: 1000, bytes: 1 };
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedClass {
    index: usize,
    bytes: usize,
}

impl PinnedClass {
    /// Its position among the classes, below [`NUM_CLASSES`].
    #[inline]
    pub fn index(self) -> usize {
        self.index
    }

    /// Bytes of a block of the class.
    #[inline]
    pub fn bytes(self) -> usize {
        self.bytes
    }
}

/// The class serving `bytes`, or `None` when the rounded size would overflow `usize`.
pub fn class_of(bytes: usize) -> Option<PinnedClass> {
    if bytes <= MIN_BLOCK {
        return Some(PinnedClass { index: 0, bytes: MIN_BLOCK });
    }
    let (index, bytes) = crate::size_steps::round_up(bytes, MIN_SHIFT, STEPS_PER_DOUBLING)?;
    Some(PinnedClass { index, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_requests_share_the_minimum_block() {
        for bytes in [0, 1, 100, 4095, 4096] {
            assert_eq!(class_of(bytes), Some(PinnedClass { index: 0, bytes: 4096 }));
        }
    }

    #[test]
    fn classes_step_by_quarters_of_a_power_of_two() {
        assert_eq!(class_of(4097).unwrap().bytes(), 5120);
        assert_eq!(class_of(5120).unwrap().bytes(), 5120);
        assert_eq!(class_of(5121).unwrap().bytes(), 6144);
        assert_eq!(class_of(8192).unwrap(), PinnedClass { index: 4, bytes: 8192 });
        assert_eq!(class_of(1 << 20).unwrap().bytes(), 1 << 20);
        assert_eq!(class_of((1 << 20) + 1).unwrap().bytes(), (1 << 20) + (1 << 18));
        assert_eq!(class_of(64 << 20).unwrap().bytes(), 64 << 20);
        assert_eq!(class_of(67_121_209).unwrap().bytes(), 80 << 20);
    }

    #[test]
    fn every_size_fits_its_class_with_at_most_a_quarter_wasted_and_indices_are_monotonic() {
        let mut previous = class_of(0).unwrap();
        let mut bytes = 1usize;
        while bytes < (1 << 40) {
            for probe in [bytes - 1, bytes, bytes + 1, bytes + bytes / 3] {
                let class = class_of(probe).unwrap();
                assert!(class.bytes >= probe.max(1));
                assert!(class.index < NUM_CLASSES);
                if probe > MIN_BLOCK {
                    assert!(class.bytes - probe <= probe / 4, "{probe} -> {}", class.bytes);
                }
                // Same index, same bytes: a freed block fits every request of its class.
                assert_eq!(class_of(class.bytes).unwrap(), class);
            }
            let class = class_of(bytes).unwrap();
            assert!(class.index >= previous.index);
            previous = class;
            bytes = bytes * 3 / 2 + 1;
        }
    }

    #[test]
    fn sizes_near_usize_max_do_not_overflow() {
        assert!(class_of(usize::MAX).is_none());
        let top = class_of(1usize << (usize::BITS - 1)).unwrap();
        assert_eq!(top.index, NUM_CLASSES - 1 - STEPS_PER_DOUBLING);
        assert!(top.index < NUM_CLASSES);
    }
}
