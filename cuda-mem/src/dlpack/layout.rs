//! The layout of an imported tensor: its extents and element strides, checked with overflow-free
//! arithmetic so that every element it names lies inside the span the producer described (and
//! inside the address space), whatever the strides (transposed, stepped, broadcast with stride 0,
//! or reversed with negative strides).

use super::invalid;
use crate::error::Result;

/// Extents and element strides of a non-empty tensor, with the span they reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) shape: Vec<usize>,
    pub(crate) strides: Vec<i64>,
    /// The lowest element offset any index reaches (0 unless a stride is negative).
    pub(crate) lowest: i64,
    /// The highest element offset any index reaches.
    pub(crate) highest: i64,
}

impl Layout {
    /// Checks `strides` against `shape` for elements of `elem_size` bytes whose index 0 is at
    /// `address`: every reachable offset, in elements and in bytes, is computed without overflow,
    /// and the bytes from the lowest to the end of the highest element lie inside the address
    /// space. Extents of 1 may carry any stride (it is never multiplied by more than 0).
    pub(crate) fn checked(shape: &[usize], strides: &[i64], elem_size: usize, address: usize) -> Result<Self> {
        let op = || format!("shape {shape:?} with strides {strides:?}");
        let overflow = || invalid("strides and shape reach offsets beyond what int64 holds", op());
        let (mut lowest, mut highest) = (0i64, 0i64);
        for (&extent, &stride) in shape.iter().zip(strides) {
            let last = i64::try_from(extent.saturating_sub(1)).map_err(|_| overflow())?;
            let reach = last.checked_mul(stride).ok_or_else(overflow)?;
            if reach < 0 {
                lowest = lowest.checked_add(reach).ok_or_else(overflow)?;
            } else {
                highest = highest.checked_add(reach).ok_or_else(overflow)?;
            }
        }
        let size = i64::try_from(elem_size).map_err(|_| overflow())?;
        let below = lowest.checked_mul(size).ok_or_else(overflow)?.unsigned_abs();
        let above = highest.checked_add(1).and_then(|h| h.checked_mul(size)).ok_or_else(overflow)?;
        let inside = address.checked_sub(usize::try_from(below).map_err(|_| overflow())?).is_some()
            && address.checked_add(usize::try_from(above).map_err(|_| overflow())?).is_some();
        if !inside {
            return Err(invalid("strides and shape reach outside the address space", op()));
        }
        Ok(Self { shape: shape.to_vec(), strides: strides.to_vec(), lowest, highest })
    }

    /// True when the strides are the compact row-major ones (extents of 1 may have any stride).
    pub(crate) fn is_compact(&self) -> bool {
        is_compact(&self.shape, &self.strides)
    }

    /// The dimension strided copies walk in one call: the longest one whose stride is positive
    /// and whose extent is above 1 (so its stride times its extent was checked), or `None` when
    /// there is none (each element is then copied on its own).
    pub(crate) fn copy_dimension(&self) -> Option<usize> {
        (0..self.shape.len())
            .filter(|&d| self.strides[d] > 0 && self.shape[d] > 1)
            .max_by_key(|&d| (self.shape[d], usize::MAX - d))
    }

    /// Each run a strided copy makes, in row-major order of the other dimensions' indices:
    /// `(element offset in the tensor, element offset in the row-major host copy)`.
    pub(crate) fn runs(&self, along: Option<usize>) -> Runs<'_> {
        Runs { layout: self, along, index: vec![0; self.shape.len()], done: self.shape.contains(&0) }
    }

    /// The row-major (host) stride of dimension `d`, in elements.
    pub(crate) fn host_stride(&self, d: usize) -> usize {
        self.shape[d + 1..].iter().product()
    }
}

/// True when `strides` are the row-major ones of `shape` (extents of 1 may have any stride).
fn is_compact(shape: &[usize], strides: &[i64]) -> bool {
    let mut expected: i64 = 1;
    for (&extent, &stride) in shape.iter().zip(strides).rev() {
        if extent != 1 && stride != expected {
            return false;
        }
        expected = expected.saturating_mul(extent as i64);
    }
    true
}

/// The starts of a strided copy's runs (see [`Layout::runs`]).
pub(crate) struct Runs<'a> {
    layout: &'a Layout,
    /// The dimension each run covers whole (its index stays 0), if any.
    along: Option<usize>,
    index: Vec<usize>,
    done: bool,
}

impl Iterator for Runs<'_> {
    type Item = (i64, usize);

    fn next(&mut self) -> Option<(i64, usize)> {
        if self.done {
            return None;
        }
        let Layout { shape, strides, .. } = self.layout;
        // Within the checked span: each term is at most (extent - 1) * stride, whose sum fits.
        let device = self.index.iter().zip(strides).map(|(&i, &s)| i as i64 * s).sum();
        let host = (0..shape.len()).map(|d| self.index[d] * self.layout.host_stride(d)).sum();
        // Advance the odometer, innermost first, skipping the dimension runs cover.
        self.done = true;
        for d in (0..shape.len()).rev() {
            if Some(d) == self.along {
                continue;
            }
            self.index[d] += 1;
            if self.index[d] < shape[d] {
                self.done = false;
                break;
            }
            self.index[d] = 0;
        }
        Some((device, host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn spans_cover_transposes_steps_broadcasts_and_reversals() {
        let t = Layout::checked(&[3, 4], &[1, 3], 4, 4096).unwrap();
        assert_eq!((t.lowest, t.highest, t.is_compact()), (0, 11, false));
        let stepped = Layout::checked(&[2, 3], &[8, 2], 4, 4096).unwrap();
        assert_eq!((stepped.lowest, stepped.highest), (0, 12));
        let broadcast = Layout::checked(&[1000], &[0], 8, 4096).unwrap();
        assert_eq!((broadcast.lowest, broadcast.highest), (0, 0));
        let reversed = Layout::checked(&[5], &[-1], 2, 4096).unwrap();
        assert_eq!((reversed.lowest, reversed.highest), (-4, 0));
        assert!(Layout::checked(&[2, 3], &[3, 1], 4, 0).unwrap().is_compact());
        assert!(Layout::checked(&[1, 3], &[99, 1], 4, 0).unwrap().is_compact());
    }

    #[test]
    fn forged_strides_are_typed_errors_never_wrapped_offsets() {
        let cases: [(&[usize], &[i64], usize); 4] = [
            (&[3], &[i64::MAX], 4),                              // the reach overflows int64
            (&[2, 2], &[i64::MAX / 2 + 1, i64::MAX / 2 + 1], 1), // the sum overflows
            (&[2], &[i64::MAX / 4], 8),                          // the byte offset overflows
            (&[3], &[i64::MIN / 2], 1),                          // the negative reach passes the address
        ];
        for (shape, strides, size) in cases {
            let err = Layout::checked(shape, strides, size, 4096).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{shape:?} {strides:?}: {err}");
        }
        // Past the end of the address space, and below address 0.
        assert!(Layout::checked(&[2], &[1], 4, usize::MAX - 4).is_err());
        assert!(Layout::checked(&[3], &[-1], 4, 4).is_err());
        assert!(Layout::checked(&[2], &[-1], 4, 4).is_ok());
    }

    #[test]
    fn runs_visit_every_element_once_in_row_major_host_order() {
        // A transposed 3x4: runs along the longest positive dimension (the second, extent 4).
        let t = Layout::checked(&[3, 4], &[1, 3], 4, 4096).unwrap();
        let along = t.copy_dimension();
        assert_eq!(along, Some(1));
        let runs: Vec<_> = t.runs(along).collect();
        assert_eq!(runs, [(0, 0), (1, 4), (2, 8)]);
        // Without a run dimension every element is its own run; offsets match the strides.
        let every: Vec<_> = t.runs(None).collect();
        assert_eq!(every.len(), 12);
        assert_eq!(every[5], (1 + 3, 5)); // index (1, 1)
        let mut host: Vec<usize> = every.iter().map(|r| r.1).collect();
        host.sort_unstable();
        assert_eq!(host, (0..12).collect::<Vec<_>>());
        // No positive stride: no run dimension.
        assert_eq!(Layout::checked(&[4], &[0], 4, 64).unwrap().copy_dimension(), None);
        assert_eq!(Layout::checked(&[4, 2], &[-2, 0], 4, 64).unwrap().copy_dimension(), None);
        // A huge stride on an extent of 1 is never walked (its pitch was never checked).
        assert_eq!(Layout::checked(&[1, 4], &[i64::MAX, 0], 4, 64).unwrap().copy_dimension(), None);
        // Empty tensors have no runs.
        assert_eq!(Layout::checked(&[0, 3], &[3, 1], 4, 64).unwrap().runs(None).count(), 0);
        // Scalars have one.
        assert_eq!(Layout::checked(&[], &[], 4, 64).unwrap().runs(None).collect::<Vec<_>>(), [(0, 0)]);
    }
}
