//! The arithmetic both sides share: medians, per-operation times, figures and ratios.

use crate::rows::{Row, Unit};

/// The ratio above which a wrapper row is flagged: cuda-mem must stay within 2% of raw CUDA.
pub const TARGET_RATIO: f64 = 1.02;

/// The median (mean of the two middle values for an even count); `None` for no values or NaN.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    Some(if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 })
}

/// Seconds per operation of each criterion sample: `times[i]` (ns) covers `iters[i]` criterion
/// iterations of `k` operations each.
pub fn per_op_seconds(times_ns: &[f64], iters: &[f64], k: u32) -> Vec<f64> {
    times_ns.iter().zip(iters).map(|(&t, &n)| t / 1e9 / (n * f64::from(k))).collect()
}

/// The row's figure from the median seconds per operation: µs, or GB/s (1 GB = 1e9 bytes).
pub fn figure(row: &Row, median_seconds: f64) -> f64 {
    match row.unit() {
        Unit::Micros => median_seconds * 1e6,
        Unit::GigabytesPerSecond => row.bytes as f64 / median_seconds / 1e9,
    }
}

/// Ours relative to raw, so that above 1 always means slower: time ratio for µs rows,
/// `raw_bw / our_bw` for GB/s rows. `None` when either figure is missing or not positive.
pub fn ratio(unit: Unit, raw: Option<f64>, ours: Option<f64>) -> Option<f64> {
    let (raw, ours) = (raw?, ours?);
    if !(raw > 0.0 && ours > 0.0) {
        return None;
    }
    Some(match unit {
        Unit::Micros => ours / raw,
        Unit::GigabytesPerSecond => raw / ours,
    })
}

/// True when a ratio exceeds [`TARGET_RATIO`].
pub fn over_target(ratio: Option<f64>) -> bool {
    ratio.is_some_and(|r| r > TARGET_RATIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::row;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
        assert_eq!(median(&[7.0]), Some(7.0));
    }

    #[test]
    fn per_op_divides_by_iterations_and_batch() {
        // 2 samples: one batch of 200 ops in 20 ms; two batches of 200 in 50 ms.
        let per_op = per_op_seconds(&[20e6, 50e6], &[1.0, 2.0], 200);
        assert!((per_op[0] - 100e-6).abs() < 1e-12);
        assert!((per_op[1] - 125e-6).abs() < 1e-12);
    }

    #[test]
    fn figures_in_micros_and_gigabytes_per_second() {
        let malloc = row("malloc_4k").unwrap();
        assert!((figure(malloc, 62.5e-6) - 62.5).abs() < 1e-9);
        let h2d = row("h2d_pinned").unwrap();
        // 256 MiB in 5 ms = 53.687 GB/s.
        assert!((figure(h2d, 5e-3) - 268_435_456.0 / 5e-3 / 1e9).abs() < 1e-9);
    }

    #[test]
    fn ratios_mean_slower_above_one_for_both_units() {
        assert_eq!(ratio(Unit::Micros, Some(100.0), Some(101.0)), Some(1.01));
        let r = ratio(Unit::GigabytesPerSecond, Some(55.0), Some(50.0)).unwrap();
        assert!((r - 1.1).abs() < 1e-12);
        assert_eq!(ratio(Unit::Micros, None, Some(1.0)), None);
        assert_eq!(ratio(Unit::Micros, Some(0.0), Some(1.0)), None);
        assert!(over_target(Some(1.021)));
        assert!(!over_target(Some(1.02)));
        assert!(!over_target(None));
    }
}
