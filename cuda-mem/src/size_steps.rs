//! The rounding both caching pools' size classes use above their small sizes: every power of two
//! is cut into equal steps, so a request wastes at most one step and a block of a step serves
//! every request that rounds to it.

/// Rounds `bytes` (above `1 << min_shift`) up to the next of `steps_per_doubling` equal steps of
/// its power of two. Returns how many steps lie between `1 << min_shift` and the rounded size,
/// and that size; `None` when the size would overflow `usize`.
#[inline]
pub(crate) fn round_up(bytes: usize, min_shift: u32, steps_per_doubling: usize) -> Option<(usize, usize)> {
    let shift = usize::BITS - 1 - bytes.leading_zeros(); // floor(log2(bytes)) >= min_shift
    let base = 1usize << shift;
    let step = base / steps_per_doubling;
    let steps = (bytes - base).div_ceil(step); // up to steps_per_doubling: the next power of two
    let rounded = base.checked_add(steps * step)?;
    Some(((shift - min_shift) as usize * steps_per_doubling + steps, rounded))
}
