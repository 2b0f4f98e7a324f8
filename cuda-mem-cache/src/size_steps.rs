//! The rounding both caching pools' size classes use above their small sizes: every power of two
//! is cut into equal steps, so a request wastes at most one step and a block of a step serves
//! every request that rounds to it.

/// Rounds `bytes` (above `1 << min_shift`) up to the next of `steps_per_doubling` (a power of two,
/// at most `1 << min_shift`) equal steps of its power of two. Returns how many steps lie between `1 << min_shift` and the rounded size,
/// and that size; `None` when the size would overflow `usize`.
#[inline]
pub(crate) fn round_up(bytes: usize, min_shift: u32, steps_per_doubling: usize) -> Option<(usize, usize)> {
    debug_assert!(steps_per_doubling.is_power_of_two() && steps_per_doubling.trailing_zeros() <= min_shift);
    let shift = usize::BITS - 1 - bytes.leading_zeros(); // floor(log2(bytes)) >= min_shift
    let base = 1usize << shift;
    // Steps are powers of two: shifts, not divisions (this runs on every allocation).
    let step_shift = shift - steps_per_doubling.trailing_zeros();
    let steps = (bytes - base + (1 << step_shift) - 1) >> step_shift; // up to the next power of two
    let rounded = base.checked_add(steps << step_shift)?;
    Some(((shift - min_shift) as usize * steps_per_doubling + steps, rounded))
}
