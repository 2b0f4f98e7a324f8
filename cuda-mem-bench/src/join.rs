//! Joining the C++ rows with criterion's samples by key.

use crate::inputs::{RawRun, Samples};
use crate::paired::PairedRow;
use crate::rows::{ROWS, Row, Section, Unit};
use crate::stats;
use std::collections::BTreeMap;

/// A figure computed from criterion's samples exactly as the C++ program computes its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// µs per operation or GB/s.
    pub value: f64,
    /// Number of samples.
    pub samples: usize,
    /// Largest iteration count of a sample (1 when each sample was exactly one batch of K).
    pub max_iters: f64,
}

/// The figure of `row` from its criterion samples: median over samples of time / (iters × K).
pub fn measured(row: &Row, samples: &Samples) -> Option<Measured> {
    let per_op = stats::per_op_seconds(&samples.times, &samples.iters, row.k);
    let median = stats::median(&per_op)?;
    Some(Measured {
        value: stats::figure(row, median),
        samples: per_op.len(),
        max_iters: samples.iters.iter().copied().fold(0.0, f64::max),
    })
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRow {
    /// The catalogue entry.
    pub row: &'static Row,
    /// The C++ program's figure.
    pub raw: Option<f64>,
    /// The C++ program's description of what it measured.
    pub raw_detail: Option<String>,
    /// cuda-mem's figure.
    pub cuda_mem: Option<f64>,
    /// cudarc's figure.
    pub cudarc: Option<f64>,
    /// cuda-mem relative to raw (> 1 is slower).
    pub ratio: Option<f64>,
    /// cudarc relative to raw (> 1 is slower).
    pub cudarc_ratio: Option<f64>,
    /// A second run of the C++ program relative to the first (same convention): the noise floor
    /// of the row between two processes, when a rerun was supplied.
    pub rerun_ratio: Option<f64>,
    /// The same operations through `cuda_mem::sys` in the benchmark process (diagnostic rows).
    pub ffi: Option<f64>,
    /// cuda-mem relative to those direct calls (> 1 is slower): the wrapper's own cost.
    pub ffi_ratio: Option<f64>,
    /// cuda-mem relative to the raw C++ batches run interleaved in the benchmark process (the
    /// `paired` benchmark; > 1 is slower).
    pub paired_ratio: Option<f64>,
    /// Anything a reader should know (plan mismatches, missing data).
    pub notes: Vec<String>,
}

impl ReportRow {
    /// The unit of the row.
    pub fn unit(&self) -> Unit {
        self.row.unit()
    }

    /// The ratio the target is judged by: the same-process interleaved one where it was
    /// measured (it is free of differences between two processes), else the two-process one.
    pub fn judged_ratio(&self) -> Option<f64> {
        self.paired_ratio.or(self.ratio)
    }

    /// True when cuda-mem is more than 2% slower than raw CUDA by [`ReportRow::judged_ratio`].
    pub fn flagged(&self) -> bool {
        stats::over_target(self.judged_ratio())
    }
}

/// Joins by key, in catalogue order. `ours` and `cudarc` map keys to criterion samples.
pub fn join(
    raw: &RawRun,
    ours: &BTreeMap<String, Samples>,
    cudarc: &BTreeMap<String, Samples>,
    kernels_available: bool,
) -> Vec<ReportRow> {
    ROWS.iter()
        .map(|row| {
            let mut notes = Vec::new();
            let raw_row = raw.rows.get(row.key);
            if let Some(r) = raw_row {
                if r.unit != row.unit().as_str() {
                    notes.push(format!("raw unit is {:?}, expected {:?}", r.unit, row.unit().as_str()));
                }
                if r.k.is_some_and(|k| k != row.k) || r.samples.is_some_and(|s| s != row.samples) {
                    notes.push(format!(
                        "raw program used K={:?}, samples={:?}; the catalogue says K={}, samples={}",
                        r.k, r.samples, row.k, row.samples
                    ));
                }
            } else {
                notes.push("not in the raw output".into());
            }
            let ours_measured = ours.get(row.key).and_then(|s| measured(row, s));
            match &ours_measured {
                Some(m) if m.max_iters > 1.0 => notes.push(format!(
                    "criterion ran up to {} batches per sample (expected 1); figure still per operation",
                    m.max_iters
                )),
                Some(_) => {}
                None if row.needs_kernel && !kernels_available => {
                    notes.push("cuda-mem side missing: needs cuda-mem-kernels' streaming-read launcher".into())
                }
                None => notes.push("no cuda-mem samples".into()),
            }
            let raw_value = raw_row.map(|r| r.value);
            let cuda_mem = ours_measured.map(|m| m.value);
            let cudarc_value = cudarc.get(row.key).and_then(|s| measured(row, s)).map(|m| m.value);
            ReportRow {
                row,
                raw: raw_value,
                raw_detail: raw_row.map(|r| r.detail.clone()),
                cuda_mem,
                cudarc: cudarc_value,
                ratio: stats::ratio(row.unit(), raw_value, cuda_mem),
                cudarc_ratio: stats::ratio(row.unit(), raw_value, cudarc_value),
                rerun_ratio: None,
                ffi: None,
                ffi_ratio: None,
                paired_ratio: None,
                notes,
            }
        })
        .collect()
}

/// Adds the noise floor: a second run of the C++ program relative to the first.
pub fn add_rerun(rows: &mut [ReportRow], rerun: &RawRun) {
    for row in rows {
        row.rerun_ratio = stats::ratio(row.unit(), row.raw, rerun.rows.get(row.row.key).map(|r| r.value));
    }
}

/// Adds the direct-FFI figures measured in the benchmark process and cuda-mem's ratio to them.
pub fn add_ffi(rows: &mut [ReportRow], ffi: &BTreeMap<String, Samples>) {
    for row in rows {
        row.ffi = ffi.get(row.row.key).and_then(|s| measured(row.row, s)).map(|m| m.value);
        row.ffi_ratio = stats::ratio(row.unit(), row.ffi, row.cuda_mem);
    }
}

/// Adds the same-process ratios of the `paired` benchmark (rows compared with raw C++ only).
pub fn add_paired(rows: &mut [ReportRow], paired: &BTreeMap<String, PairedRow>) {
    for row in rows {
        row.paired_ratio = paired.get(row.row.key).filter(|p| p.baseline == crate::paired::RAW).map(PairedRow::ratio);
    }
}

/// The report rows of one section.
pub fn in_section(rows: &[ReportRow], section: Section) -> impl Iterator<Item = &ReportRow> {
    rows.iter().filter(move |r| r.row.section == section)
}

/// The row with this key.
pub fn find<'a>(rows: &'a [ReportRow], key: &str) -> Option<&'a ReportRow> {
    rows.iter().find(|r| r.row.key == key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::parse_raw;

    fn flat(times_ns: &[f64]) -> Samples {
        Samples { iters: vec![1.0; times_ns.len()], times: times_ns.to_vec() }
    }

    #[test]
    fn joins_by_key_with_the_same_median_as_the_cpp_program() {
        let raw = parse_raw(
            "{\"key\":\"malloc_4k\",\"value\":60.0,\"unit\":\"us\",\"detail\":\"d\",\"k\":200,\"samples\":30}\n\
             {\"key\":\"h2d_pinned\",\"value\":55.0,\"unit\":\"GB/s\",\"detail\":\"d\",\"k\":1,\"samples\":30}",
        )
        .unwrap();
        let mut ours = BTreeMap::new();
        // Batches of 200 pairs: 12.0, 12.3 and 13.0 ms -> median 12.3 ms / 200 = 61.5 µs.
        ours.insert("malloc_4k".to_string(), flat(&[12.0e6, 13.0e6, 12.3e6]));
        // 256 MiB in 5 ms -> 53.687 GB/s.
        ours.insert("h2d_pinned".to_string(), flat(&[5.0e6]));
        let mut cudarc = BTreeMap::new();
        cudarc.insert("malloc_4k".to_string(), flat(&[24.0e6]));
        let rows = join(&raw, &ours, &cudarc, false);
        assert_eq!(rows.len(), ROWS.len());

        let malloc = find(&rows, "malloc_4k").unwrap();
        assert!((malloc.cuda_mem.unwrap() - 61.5).abs() < 1e-9);
        assert!((malloc.ratio.unwrap() - 61.5 / 60.0).abs() < 1e-12);
        assert!(malloc.flagged());
        assert!((malloc.cudarc_ratio.unwrap() - 2.0).abs() < 1e-12);
        assert!(malloc.notes.is_empty(), "{:?}", malloc.notes);

        let h2d = find(&rows, "h2d_pinned").unwrap();
        let ours_bw = 268_435_456.0 / 5e-3 / 1e9;
        assert!((h2d.ratio.unwrap() - 55.0 / ours_bw).abs() < 1e-12);
        assert!(h2d.flagged());
        assert_eq!(h2d.cudarc, None);

        let kernel = find(&rows, "read_device_1g").unwrap();
        assert_eq!((kernel.raw, kernel.cuda_mem, kernel.ratio), (None, None, None));
        assert!(kernel.notes.iter().any(|n| n.contains("cuda-mem-kernels")));
        assert_eq!(in_section(&rows, Section::Kernel).count(), 2);

        let mut rows = rows;
        let mut ffi = BTreeMap::new();
        ffi.insert("malloc_4k".to_string(), flat(&[12.0e6])); // 60 µs
        add_ffi(&mut rows, &ffi);
        let malloc = find(&rows, "malloc_4k").unwrap();
        assert_eq!(malloc.ffi, Some(60.0));
        assert!((malloc.ffi_ratio.unwrap() - 61.5 / 60.0).abs() < 1e-12);
        assert_eq!(find(&rows, "h2d_pinned").unwrap().ffi_ratio, None);
    }

    #[test]
    fn plan_mismatches_and_multi_batch_samples_are_noted() {
        let raw =
            parse_raw("{\"key\":\"d2d\",\"value\":2000,\"unit\":\"GB/s\",\"detail\":\"\",\"k\":5,\"samples\":30}")
                .unwrap();
        let mut ours = BTreeMap::new();
        // Two batches of K=10 copies per sample.
        ours.insert("d2d".to_string(), Samples { iters: vec![2.0, 2.0], times: vec![2.6e6, 2.6e6] });
        let rows = join(&raw, &ours, &BTreeMap::new(), true);
        let d2d = find(&rows, "d2d").unwrap();
        assert!(d2d.notes.iter().any(|n| n.contains("K=Some(5)")));
        assert!(d2d.notes.iter().any(|n| n.contains("2 batches")));
        // 2.6 ms / 20 copies = 130 µs per 256 MiB copy.
        assert!((d2d.cuda_mem.unwrap() - 268_435_456.0 / 130e-6 / 1e9).abs() < 1e-6);
        let rerun = parse_raw("{\"key\":\"d2d\",\"value\":1900,\"unit\":\"GB/s\",\"detail\":\"\"}").unwrap();
        let mut rows = rows;
        add_rerun(&mut rows, &rerun);
        let d2d = find(&rows, "d2d").unwrap();
        assert!((d2d.rerun_ratio.unwrap() - 2000.0 / 1900.0).abs() < 1e-12);
        assert_eq!(find(&rows, "malloc_4k").unwrap().rerun_ratio, None);
        let fault = find(&rows, "managed_first_read_fault_1g").unwrap();
        assert!(fault.notes.iter().any(|n| n == "no cuda-mem samples"));
    }
}
