//! Joining the C++ rows with criterion's samples and the `paired` ratios by key.

use crate::inputs::{RawRun, Samples};
use crate::paired::{self, PairedRow};
use crate::rows::{Peer, ROWS, Row, group_id};
use crate::stats::{self, TARGET_RATIO};
use std::collections::BTreeMap;

/// One row of the report: the C++ program's figure and what it measured, a second C++ run's
/// figure (the noise floor), cuda-mem's, cudarc's and the direct FFI calls' figures, cuda-mem /
/// raw C++ interleaved in one process (`paired`), and anything a reader should know (missing
/// data). Ratios: above 1 is slower.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRow {
    pub row: &'static Row,
    pub raw: Option<f64>,
    pub raw_detail: Option<String>,
    pub rerun: Option<f64>,
    pub cuda_mem: Option<f64>,
    pub cudarc: Option<f64>,
    pub ffi: Option<f64>,
    pub paired_ratio: Option<f64>,
    pub notes: Vec<String>,
}

impl ReportRow {
    /// cuda-mem / raw C++, two processes.
    pub fn ratio(&self) -> Option<f64> {
        stats::ratio(self.row.unit, self.raw, self.cuda_mem)
    }

    /// cudarc / raw C++, two processes.
    pub fn cudarc_ratio(&self) -> Option<f64> {
        stats::ratio(self.row.unit, self.raw, self.cudarc)
    }

    /// The second C++ run / the first.
    pub fn rerun_ratio(&self) -> Option<f64> {
        stats::ratio(self.row.unit, self.raw, self.rerun)
    }

    /// cuda-mem / the same calls through FFI: the wrapper's own cost.
    pub fn ffi_ratio(&self) -> Option<f64> {
        stats::ratio(self.row.unit, self.ffi, self.cuda_mem)
    }

    /// The ratio the target is judged by: the same-process one where it was measured (free of
    /// differences between two processes), else the two-process one.
    pub fn judged_ratio(&self) -> Option<f64> {
        self.paired_ratio.or(self.ratio())
    }

    /// True when cuda-mem is more than 2% slower than raw CUDA by [`ReportRow::judged_ratio`].
    pub fn flagged(&self) -> bool {
        self.judged_ratio().is_some_and(|r| r > TARGET_RATIO)
    }
}

/// Every catalogue row with its figures: `criterion` holds samples by `group/key`, `paired` the
/// `paired` benchmark's rows (only those against raw C++ count here).
pub fn join(
    raw: &RawRun,
    rerun: Option<&RawRun>,
    criterion: &BTreeMap<String, Samples>,
    paired: &BTreeMap<String, PairedRow>,
) -> Vec<ReportRow> {
    let join_row = |row: &'static Row| {
        let samples = |peer| criterion.get(&format!("{}/{}", group_id(row.section, peer), row.key));
        let figure = |peer| stats::figure(row, samples(peer)?);
        let mut notes = Vec::new();
        let raw_row = raw.rows.get(row.key);
        // K and the sample count cannot differ: the C++ program's plans are written from ROWS.
        match raw_row {
            Some(r) if r.unit != row.unit.as_str() => {
                notes.push(format!("raw unit is {:?}, expected {:?}", r.unit, row.unit.as_str()))
            }
            Some(_) => {}
            None => notes.push("not in the raw output".into()),
        }
        match samples(Peer::CudaMem).map(|s| s.iters.iter().copied().fold(0.0, f64::max)) {
            Some(most) if most > 1.0 => notes.push(format!(
                "criterion ran up to {most} batches per sample (expected 1); figure still per operation"
            )),
            Some(_) => {}
            None => notes.push("no cuda-mem samples".into()),
        }
        ReportRow {
            row,
            raw: raw_row.map(|r| r.value),
            raw_detail: raw_row.map(|r| r.detail.clone()),
            rerun: rerun.and_then(|run| Some(run.rows.get(row.key)?.value)),
            cuda_mem: figure(Peer::CudaMem),
            cudarc: figure(Peer::Cudarc),
            ffi: figure(Peer::Ffi),
            paired_ratio: paired.get(row.key).filter(|p| p.baseline == paired::RAW).map(PairedRow::ratio),
            notes,
        }
    };
    ROWS.iter().map(join_row).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::parse_raw;

    #[test]
    fn unit_mismatches_and_missing_data_are_noted() {
        let raw = parse_raw("{\"key\":\"d2d\",\"value\":2000,\"unit\":\"us\",\"detail\":\"\"}").unwrap();
        let rerun = parse_raw("{\"key\":\"d2d\",\"value\":1900,\"unit\":\"GB/s\",\"detail\":\"\"}").unwrap();
        let mut criterion = BTreeMap::new();
        // Two batches of K=10 copies per sample: 2.6 ms / 20 copies = 130 µs per 256 MiB copy.
        criterion.insert("bandwidth/d2d".to_string(), Samples { iters: vec![2.0, 2.0], times: vec![2.6e6, 2.6e6] });
        let rows = join(&raw, Some(&rerun), &criterion, &BTreeMap::new());
        assert_eq!(rows.len(), ROWS.len());
        let d2d = rows.iter().find(|r| r.row.key == "d2d").unwrap();
        assert!(d2d.notes.iter().any(|n| n.contains("raw unit is \"us\"")), "{:?}", d2d.notes);
        assert!(d2d.notes.iter().any(|n| n.contains("2 batches")));
        assert!((d2d.cuda_mem.unwrap() - 268_435_456.0 / 130e-6 / 1e9).abs() < 1e-6);
        assert!((d2d.rerun_ratio().unwrap() - 2000.0 / 1900.0).abs() < 1e-12);
        assert!(!d2d.flagged() && d2d.ratio().unwrap() < 1.0);
        assert_eq!(rows[0].notes, ["not in the raw output", "no cuda-mem samples"]);
    }
}
