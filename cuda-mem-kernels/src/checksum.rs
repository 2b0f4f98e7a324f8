//! Checksum of u32 data on the device, with its CPU mirror: verifies data without copying it back.

use crate::ffi;
use crate::launch::queue_reduce;
use cuda_mem::{DeviceSliceMut, DeviceSource, Result, StreamScope};

/// Queues a kernel that writes the checksum of `data` (see [`checksum_cpu`]) to `out`, which
/// must hold exactly one element (else [`InvalidArgument`](cuda_mem::ErrorKind::InvalidArgument)).
/// `out` is zeroed on the stream first, so it holds the checksum once the scope ends.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, Stream};
/// use cuda_mem_kernels::{checksum_cpu, checksum_u32};
/// let host: Vec<u32> = (0..1_000_000).collect();
/// let data = DeviceBuffer::from_slice(&host)?;
/// let mut sum = DeviceBuffer::<u64>::zeroed(1)?;
/// let mut out = sum.as_mut_slice();
/// let stream = Stream::non_blocking()?;
/// stream.scope(|s| checksum_u32(s, data.as_slice(), &mut out))??;
/// assert_eq!(sum.to_vec()?, [checksum_cpu(&host)]);
/// # Ok(()) }
/// ```
pub fn checksum_u32<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    data: impl DeviceSource<'scope, u32>,
    out: &mut DeviceSliceMut<'v, u64>,
) -> Result<()> {
    // SAFETY: the checksum kernel reads only [0, n) of the data and writes only `out` (which its
    // wrapper zeroes first).
    unsafe { queue_reduce(scope, (ffi::cmk_checksum_u32, "checksum_u32"), data, 1, out) }
}

/// The checksum [`checksum_u32`] computes: the sum over `i` of `data[i] * (2i + 1)`, wrapping
/// modulo 2^64. The odd weights make it position-dependent (swapping two different elements
/// changes it) while the sum can be accumulated in any order.
///
/// ```
/// use cuda_mem_kernels::checksum_cpu;
/// assert_eq!(checksum_cpu(&[]), 0);
/// assert_eq!(checksum_cpu(&[5, 7]), 5 * 1 + 7 * 3);
/// assert_ne!(checksum_cpu(&[5, 7]), checksum_cpu(&[7, 5]));
/// ```
pub fn checksum_cpu(data: &[u32]) -> u64 {
    data.iter()
        .zip(0u64..)
        .fold(0u64, |acc, (&x, i)| acc.wrapping_add(u64::from(x).wrapping_mul(i.wrapping_mul(2).wrapping_add(1))))
}

#[cfg(test)]
mod tests {
    use super::checksum_cpu;

    #[test]
    fn checksum_weights_each_position_with_an_odd_number() {
        assert_eq!(checksum_cpu(&[]), 0);
        assert_eq!(checksum_cpu(&[1]), 1);
        assert_eq!(checksum_cpu(&[1, 1, 1]), 1 + 3 + 5);
        assert_eq!(checksum_cpu(&[0, 0, 10]), 50);
        // Sum of (2i + 1) for i < n is n^2.
        assert_eq!(checksum_cpu(&[1; 1000]), 1_000_000);
    }

    #[test]
    fn checksum_wraps_modulo_2_pow_64() {
        let max = u64::from(u32::MAX);
        assert_eq!(checksum_cpu(&[u32::MAX; 2]), max + 3 * max);
        // Enough large elements to overflow: the mirror must wrap, like the device's u64 atomics.
        let data = vec![u32::MAX; 1 << 17];
        let n = data.len() as u128;
        let exact = u128::from(u32::MAX) * n * n;
        assert_eq!(checksum_cpu(&data), exact as u64);
        assert!(exact > u128::from(u64::MAX));
    }

    #[test]
    fn checksum_sees_moved_and_changed_elements() {
        let data: Vec<u32> = (0..4096u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        let base = checksum_cpu(&data);
        let mut swapped = data.clone();
        swapped.swap(10, 20);
        assert_ne!(checksum_cpu(&swapped), base);
        let mut flipped = data.clone();
        flipped[4095] ^= 1;
        assert_ne!(checksum_cpu(&flipped), base);
        assert_ne!(checksum_cpu(&data[1..]), base);
    }
}
