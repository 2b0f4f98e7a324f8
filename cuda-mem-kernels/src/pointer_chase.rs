//! Pointer chase: one GPU thread follows `idx = ring[idx]` hop after hop. Every load waits for
//! the one before, so the time per hop is the memory's latency; over a ring much larger than the
//! caches, laid out as one random cycle ([`chase_ring`]), that is the latency of device memory,
//! of host memory through a mapped pinned buffer, or of managed memory.

use crate::ffi;
use crate::launch::{Launch, check, one_element};
use cuda_mem::{CudaError, DeviceSliceMut, DeviceSource, ErrorKind, Result, StreamScope};

/// The longest ring: indices are u32, so the ring's length must fit in one too.
pub const MAX_RING_LEN: usize = u32::MAX as usize;

/// Queues a one-thread kernel that starts at `start % ring.len()`, takes `steps` hops
/// `idx = ring[idx] % ring.len()`, and writes the final index to `out` (exactly one element).
/// [`chase_cpu`] computes the same index. Errors with
/// [`InvalidArgument`](cuda_mem::ErrorKind::InvalidArgument) for an empty ring, one longer than
/// [`MAX_RING_LEN`], or an `out` that is not one element.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, Event, Stream};
/// use cuda_mem_kernels::{chase_cpu, chase_ring, pointer_chase};
/// let ring = chase_ring(64 << 20, 42)?; // 256 MiB: far larger than the L2 cache
/// let device_ring = DeviceBuffer::from_slice(&ring)?;
/// let mut end_index = DeviceBuffer::<u32>::zeroed(1)?;
/// let mut out = end_index.as_mut_slice();
/// let stream = Stream::non_blocking()?;
/// let (start, end) = (Event::new()?, Event::new()?);
/// let hops = 100_000;
/// stream.scope(|s| -> cuda_mem::Result<()> {
///     start.record(s.stream())?;
///     pointer_chase(s, device_ring.as_slice(), 0, hops, &mut out)?;
///     end.record(s.stream())
/// })??;
/// let ns_per_hop = end.elapsed_since(&start)?.as_nanos() as f64 / hops as f64;
/// assert_eq!(end_index.to_vec()?, [chase_cpu(&ring, 0, hops).unwrap()]);
/// println!("{ns_per_hop:.0} ns per hop");
/// # Ok(()) }
/// ```
pub fn pointer_chase<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    ring: impl DeviceSource<'scope, u32>,
    start: u32,
    steps: u64,
    out: &mut DeviceSliceMut<'v, u32>,
) -> Result<()> {
    one_element("pointer_chase", out.len())?;
    let (ring_ptr, len) = scope.device_ptr(ring)?;
    let len = ring_len(len)?;
    let out_ptr = scope.device_ptr_mut(out)?;
    let launch = Launch::single_thread(scope)?;
    // SAFETY: `ring_ptr` addresses `len` (> 0) u32 and `out_ptr` one u32 of device-accessible
    // memory lent to the scope; every index is reduced modulo `len` before it is loaded.
    let code = unsafe { ffi::cmk_pointer_chase_u32(ring_ptr, len, start, steps, out_ptr, launch.stream) };
    check(code, || format!("launching pointer_chase over {len} elements for {steps} steps"))
}

fn ring_len(len: usize) -> Result<u32> {
    let operation = || format!("pointer chase over a ring of {len} elements");
    if len == 0 {
        return Err(CudaError::new(ErrorKind::InvalidArgument("the ring is empty"), operation()));
    }
    u32::try_from(len)
        .map_err(|_| CudaError::new(ErrorKind::InvalidArgument("the ring is longer than MAX_RING_LEN"), operation()))
}

/// The index [`pointer_chase`] ends at: `start % ring.len()` followed by `steps` hops
/// `idx = ring[idx] % ring.len()`. `None` for an empty ring.
///
/// ```
/// use cuda_mem_kernels::chase_cpu;
/// let ring = [2, 0, 1]; // 0 -> 2 -> 1 -> 0
/// assert_eq!(chase_cpu(&ring, 0, 1), Some(2));
/// assert_eq!(chase_cpu(&ring, 0, 2), Some(1));
/// assert_eq!(chase_cpu(&ring, 0, 3), Some(0));
/// assert_eq!(chase_cpu(&ring, 4, 0), Some(1)); // 4 % 3
/// assert_eq!(chase_cpu(&[], 0, 5), None);
/// ```
pub fn chase_cpu(ring: &[u32], start: u32, steps: u64) -> Option<u32> {
    // Indices are usize here and u32 on the device; ring.len() <= MAX_RING_LEN keeps them equal,
    // and longer rings (which the device refuses) are still chased without panicking.
    let len = ring.len();
    if len == 0 {
        return None;
    }
    let mut idx = start as usize % len;
    for _ in 0..steps {
        idx = ring[idx] as usize % len;
    }
    u32::try_from(idx).ok()
}

/// A ring of `len` indices that forms one cycle through every element in a random order
/// (Sattolo's algorithm), the same for the same `seed`: `ring[i]` is the element after `i`.
/// Random order defeats prefetchers and caches; one cycle means a chase of any length never
/// revisits an element before it has seen all of them. Errors with
/// [`InvalidArgument`](cuda_mem::ErrorKind::InvalidArgument) for `len > MAX_RING_LEN`.
///
/// ```
/// let ring = cuda_mem_kernels::chase_ring(1000, 7)?;
/// let (mut idx, mut hops) = (0, 0);
/// loop {
///     idx = ring[idx] as usize;
///     hops += 1;
///     if idx == 0 { break; }
/// }
/// assert_eq!(hops, 1000); // back at the start only after visiting everything
/// # Ok::<(), cuda_mem::CudaError>(())
/// ```
pub fn chase_ring(len: usize, seed: u64) -> Result<Vec<u32>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    ring_len(len)?;
    // Every index is below len <= u32::MAX, so the casts are exact.
    let mut ring: Vec<u32> = (0..len).map(|i| i as u32).collect();
    let mut rng = SplitMix64(seed);
    for i in (1..len).rev() {
        // Sattolo: swap with a strictly earlier element, which yields a single cycle.
        let j = rng.below(i as u64) as usize;
        ring.swap(i, j);
    }
    Ok(ring)
}

/// SplitMix64 (Steele, Lea and Flood): a tiny, well-mixed generator; enough for shuffling, and it
/// keeps the crate free of dependencies.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..bound` (bound > 0), by the multiply-high method (bias below 2^-32 here).
    fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(bound)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Follows the ring from 0 and returns how many hops it takes to come back.
    fn cycle_length(ring: &[u32]) -> usize {
        let mut seen = vec![false; ring.len()];
        let (mut idx, mut hops) = (0usize, 0usize);
        loop {
            assert!(!seen[idx], "element {idx} visited twice before returning to 0");
            seen[idx] = true;
            idx = ring[idx] as usize;
            hops += 1;
            if idx == 0 {
                return hops;
            }
        }
    }

    #[test]
    fn ring_is_one_cycle_through_every_element() {
        for len in [1, 2, 3, 10, 1023, 1 << 16, (1 << 20) + 7] {
            let ring = chase_ring(len, 0x5eed).unwrap();
            assert_eq!(ring.len(), len);
            assert_eq!(cycle_length(&ring), len, "len {len}");
            if len > 1 {
                assert!(ring.iter().enumerate().all(|(i, &next)| next as usize != i), "no fixed points");
            }
        }
        assert_eq!(chase_ring(1, 3).unwrap(), [0]);
        assert_eq!(chase_ring(2, 3).unwrap(), [1, 0]);
        assert!(chase_ring(0, 3).unwrap().is_empty());
    }

    #[test]
    fn ring_is_deterministic_per_seed_and_shuffled() {
        let a = chase_ring(4096, 1).unwrap();
        assert_eq!(a, chase_ring(4096, 1).unwrap());
        assert_ne!(a, chase_ring(4096, 2).unwrap());
        // Not the trivial successor ring i -> i + 1.
        let sequential = a.iter().enumerate().filter(|&(i, &next)| next as usize == (i + 1) % 4096).count();
        assert!(sequential < 16, "{sequential} sequential links");
    }

    #[test]
    fn rings_longer_than_u32_indices_are_refused_before_allocating() {
        let err = chase_ring(MAX_RING_LEN + 1, 0).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
        assert!(ring_len(0).is_err());
        assert_eq!(ring_len(5).unwrap(), 5);
        assert!(ring_len(MAX_RING_LEN + 1).is_err());
        assert_eq!(ring_len(MAX_RING_LEN).unwrap(), u32::MAX);
    }

    #[test]
    fn cpu_chase_follows_the_ring_and_reduces_indices() {
        let ring = chase_ring(1000, 9).unwrap();
        let mut idx = 0u32;
        for steps in 0..2500u64 {
            assert_eq!(chase_cpu(&ring, 0, steps), Some(idx));
            idx = ring[idx as usize];
        }
        // A full cycle returns to the start.
        assert_eq!(chase_cpu(&ring, 17, 1000), Some(17));
        // Out-of-range entries are reduced modulo the length, like on the device.
        assert_eq!(chase_cpu(&[7, 9, 5], 1, 1), Some(0)); // ring[1] = 9 -> 0
        assert_eq!(chase_cpu(&[7, 9, 5], 1, 2), Some(1)); // ring[0] = 7 -> 1
        assert_eq!(chase_cpu(&[0], u32::MAX, 3), Some(0));
    }
}
