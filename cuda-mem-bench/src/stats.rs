//! The arithmetic both sides share: medians, figures and ratios.

use crate::inputs::Samples;
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

/// The row's figure from criterion's samples, computed as the C++ program computes its own: the
/// median over samples of time / (iterations × K), as µs per operation or GB/s (1 GB = 1e9 bytes).
pub fn figure(row: &Row, samples: &Samples) -> Option<f64> {
    let per_op: Vec<f64> =
        samples.times.iter().zip(&samples.iters).map(|(&ns, &n)| ns / 1e9 / (n * f64::from(row.k))).collect();
    let seconds = median(&per_op)?;
    Some(match row.unit {
        Unit::Micros => seconds * 1e6,
        Unit::GigabytesPerSecond => row.bytes as f64 / seconds / 1e9,
    })
}

/// Ours relative to raw, so that above 1 always means slower: time ratio for µs rows,
/// `raw_bw / our_bw` for GB/s rows. `None` when either figure is missing or not positive.
pub fn ratio(unit: Unit, raw: Option<f64>, ours: Option<f64>) -> Option<f64> {
    let (raw, ours) = (raw?, ours?);
    (raw > 0.0 && ours > 0.0).then(|| match unit {
        Unit::Micros => ours / raw,
        Unit::GigabytesPerSecond => raw / ours,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::row;

    #[test]
    fn medians_figures_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!((median(&[]), median(&[1.0, f64::NAN])), (None, None));
        // Batches of 200 pairs in 12.0, 12.3 (two batches: 24.6) and 13.0 ms: median 61.5 µs per pair.
        let s = Samples { iters: vec![1.0, 2.0, 1.0], times: vec![12.0e6, 24.6e6, 13.0e6] };
        assert!((figure(row("malloc_4k").unwrap(), &s).unwrap() - 61.5).abs() < 1e-9);
        // GB/s figures: the committed report's test (crate::cli).
        assert_eq!(ratio(Unit::Micros, Some(100.0), Some(101.0)), Some(1.01));
        assert!((ratio(Unit::GigabytesPerSecond, Some(55.0), Some(50.0)).unwrap() - 1.1).abs() < 1e-12);
        assert_eq!((ratio(Unit::Micros, None, Some(1.0)), ratio(Unit::Micros, Some(0.0), Some(1.0))), (None, None));
    }
}
