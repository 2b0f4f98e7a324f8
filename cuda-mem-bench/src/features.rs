//! Rows for what cuda-mem adds beyond the families: the pinned caching pool, staged pageable
//! copies, and the memory-resource adaptors. Each is measured in the benchmark process (criterion
//! group `features`, same method as every other row) and set against a baseline: a raw C++ row
//! of the same run (how fast raw CUDA does the job), or another feature row (the adaptor's cost
//! over the resource it wraps).

use crate::inputs::{self, RawRun, Samples};
use crate::rows::{Row, Section, Unit};
use crate::stats;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// The criterion group of the feature rows.
pub const GROUP: &str = "features";

/// What a feature row is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// A row of the raw C++ program.
    Raw(&'static str),
    /// Another feature row (adaptor overhead).
    Feature(&'static str),
}

/// One feature row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureRow {
    /// Criterion function id.
    pub key: &'static str,
    /// Operations per sample.
    pub k: u32,
    /// Samples after one warm-up sample.
    pub samples: u32,
    /// Bytes one operation allocates or copies.
    pub bytes: u64,
    /// µs per operation or GB/s.
    pub unit: Unit,
    /// What it is compared with.
    pub baseline: Baseline,
    /// What one operation is.
    pub what: &'static str,
}

impl FeatureRow {
    /// The row as the shared measurement code sees it.
    pub fn as_row(&self) -> Row {
        let section = match self.unit {
            Unit::Micros => Section::Alloc,
            Unit::GigabytesPerSecond => Section::Bandwidth,
        };
        Row { key: self.key, section, k: self.k, samples: self.samples, bytes: self.bytes, needs_kernel: false }
    }
}

const MIB: u64 = 1 << 20;

const fn pair(key: &'static str, bytes: u64, baseline: Baseline, what: &'static str) -> FeatureRow {
    FeatureRow { key, k: 2000, samples: 30, bytes, unit: Unit::Micros, baseline, what }
}

const fn copy(key: &'static str, bytes: u64, samples: u32, baseline: &'static str, what: &'static str) -> FeatureRow {
    FeatureRow { key, k: 1, samples, bytes, unit: Unit::GigabytesPerSecond, baseline: Baseline::Raw(baseline), what }
}

/// Every feature row, in report order.
pub const FEATURE_ROWS: &[FeatureRow] = &[
    pair("pinned_pool_hit_4k", 4096, Baseline::Raw("malloc_host_4k"), "PinnedPool::alloc + drop, cache hit"),
    pair("pinned_pool_hit_1m", MIB, Baseline::Raw("malloc_host_1m"), "PinnedPool::alloc + drop, cache hit"),
    pair("pinned_pool_hit_64m", 64 * MIB, Baseline::Raw("malloc_host_64m"), "PinnedPool::alloc + drop, cache hit"),
    copy("staged_h2d_256m", 256 * MIB, 20, "h2d_pageable", "StagedCopier::copy_to_device from pageable memory"),
    copy("staged_d2h_256m", 256 * MIB, 20, "d2h_pageable", "StagedCopier::copy_to_host into pageable memory"),
    copy("staged_h2d_1g", 1024 * MIB, 10, "h2d_pageable", "StagedCopier::copy_to_device from pageable memory, 1 GiB"),
    copy("staged_d2h_1g", 1024 * MIB, 10, "d2h_pageable", "StagedCopier::copy_to_host into pageable memory, 1 GiB"),
    copy(
        "register_copy_unregister_h2d_256m",
        256 * MIB,
        10,
        "h2d_pageable",
        "cudaHostRegister + cudaMemcpy + cudaHostUnregister (RegisteredHost), for comparison",
    ),
    FeatureRow {
        key: "resource_pool_1m",
        k: 200,
        samples: 50,
        bytes: MIB,
        unit: Unit::Micros,
        baseline: Baseline::Raw("async_retain_nosync_1m"),
        what: "ResourceBuffer from a PoolResource (retaining pool) + drop, one synchronize per sample",
    },
    FeatureRow {
        key: "resource_stats_pool_1m",
        k: 200,
        samples: 50,
        bytes: MIB,
        unit: Unit::Micros,
        baseline: Baseline::Feature("resource_pool_1m"),
        what: "the same through StatisticsResource",
    },
    FeatureRow {
        key: "resource_limit_pool_1m",
        k: 200,
        samples: 50,
        bytes: MIB,
        unit: Unit::Micros,
        baseline: Baseline::Feature("resource_pool_1m"),
        what: "the same through LimitingResource",
    },
    FeatureRow {
        key: "resource_limit_stats_pool_1m",
        k: 200,
        samples: 50,
        bytes: MIB,
        unit: Unit::Micros,
        baseline: Baseline::Feature("resource_pool_1m"),
        what: "the same through LimitingResource(StatisticsResource(..))",
    },
    FeatureRow {
        key: "resource_tracking_pool_1m",
        k: 200,
        samples: 50,
        bytes: MIB,
        unit: Unit::Micros,
        baseline: Baseline::Feature("resource_pool_1m"),
        what: "the same through TrackingResource (no backtraces)",
    },
];

/// A feature row's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureResult {
    /// The catalogue entry.
    pub row: &'static FeatureRow,
    /// The feature's figure.
    pub value: Option<f64>,
    /// The baseline's figure.
    pub baseline_value: Option<f64>,
}

impl FeatureResult {
    /// How many times faster than the baseline (< 1: slower).
    pub fn speedup(&self) -> Option<f64> {
        let (ours, base) = (self.value?, self.baseline_value?);
        Some(match self.row.unit {
            Unit::Micros => base / ours,
            Unit::GigabytesPerSecond => ours / base,
        })
    }
}

/// Reads the feature samples from criterion's folder.
pub fn load(criterion_dir: &Path) -> Result<BTreeMap<String, Samples>, String> {
    let mut found = BTreeMap::new();
    for row in FEATURE_ROWS {
        if let Some(samples) = inputs::read_samples(criterion_dir, GROUP, row.key)? {
            found.insert(row.key.to_string(), samples);
        }
    }
    Ok(found)
}

/// Figures for every feature row and its baseline.
pub fn evaluate(raw: &RawRun, samples: &BTreeMap<String, Samples>) -> Vec<FeatureResult> {
    let figure = |row: &FeatureRow| {
        let s = samples.get(row.key)?;
        let median = stats::median(&stats::per_op_seconds(&s.times, &s.iters, row.k))?;
        Some(stats::figure(&row.as_row(), median))
    };
    FEATURE_ROWS
        .iter()
        .map(|row| {
            let baseline_value = match row.baseline {
                Baseline::Raw(key) => raw.rows.get(key).map(|r| r.value),
                Baseline::Feature(key) => FEATURE_ROWS.iter().find(|r| r.key == key).and_then(figure),
            };
            FeatureResult { row, value: figure(row), baseline_value }
        })
        .collect()
}

fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "—".into(), crate::claims::num)
}

/// The report section.
pub fn markdown(results: &[FeatureResult]) -> String {
    let mut out = String::from(
        "## Beyond raw CUDA: pinned pool, staged copies, resource adaptors\n\n\
         Measured in the benchmark process with the same method; the baseline is a raw C++ row of this \
         run, or (for adaptors) the unwrapped resource. Speed-up above 1 means faster than the baseline; \
         for adaptors, 1/speed-up is the adaptor's cost (target ≤ 1.05).\n\n\
         | row | unit | cuda-mem | baseline | baseline figure | speed-up |\n|---|---|---:|---|---:|---:|\n",
    );
    for r in results {
        let baseline = match r.row.baseline {
            Baseline::Raw(key) => format!("raw `{key}`"),
            Baseline::Feature(key) => format!("`{key}`"),
        };
        let speedup = r.speedup().map_or_else(|| "—".into(), |s| format!("{s:.2}×"));
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {baseline} | {} | {speedup} |",
            r.row.key,
            r.row.unit.as_str(),
            cell(r.value),
            cell(r.baseline_value)
        );
    }
    out.push_str("\n<details><summary>What each row measures</summary>\n\n");
    for r in results {
        let _ = writeln!(out, "- `{}`: {}", r.row.key, r.row.what);
    }
    out.push_str("\n</details>\n\n");
    out
}

/// The section for results.json.
pub fn json(results: &[FeatureResult]) -> Value {
    Value::Array(
        results
            .iter()
            .map(|r| {
                json!({
                    "key": r.row.key,
                    "unit": r.row.unit.as_str(),
                    "cuda_mem": r.value,
                    "baseline": match r.row.baseline { Baseline::Raw(k) | Baseline::Feature(k) => k },
                    "baseline_value": r.baseline_value,
                    "speedup": r.speedup(),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::RawRow;

    fn samples(ns_per_batch: f64) -> Samples {
        Samples { iters: vec![1.0; 3], times: vec![ns_per_batch; 3] }
    }

    #[test]
    fn speedups_against_raw_rows_and_against_other_features() {
        let mut raw = RawRun::default();
        let row =
            |value: f64| RawRow { value, unit: "us".into(), detail: String::new(), k: None, samples: None, what: None };
        raw.rows.insert("malloc_host_4k".into(), row(800.0));
        raw.rows.insert("h2d_pageable".into(), RawRow { unit: "GB/s".into(), ..row(7.0) });
        let mut found = BTreeMap::new();
        found.insert("pinned_pool_hit_4k".into(), samples(2000.0 * 200.0)); // 0.2 µs per op, K = 2000
        found.insert("staged_h2d_256m".into(), samples(256.0 * MIB as f64 / 35.0)); // 35 GB/s, K = 1
        found.insert("resource_pool_1m".into(), samples(200.0 * 1000.0)); // 1 µs
        found.insert("resource_stats_pool_1m".into(), samples(200.0 * 1040.0)); // 1.04 µs
        let results = evaluate(&raw, &found);
        let get = |key: &str| results.iter().find(|r| r.row.key == key).unwrap();
        assert!((get("pinned_pool_hit_4k").speedup().unwrap() - 4000.0).abs() < 1e-6);
        assert!((get("staged_h2d_256m").speedup().unwrap() - 5.0).abs() < 1e-6);
        assert!((1.0 / get("resource_stats_pool_1m").speedup().unwrap() - 1.04).abs() < 1e-9);
        assert_eq!(get("staged_d2h_256m").speedup(), None, "missing data stays missing");
        let md = markdown(&results);
        assert!(md.contains("| `pinned_pool_hit_4k` | us | 0.200 | raw `malloc_host_4k` | 800 | 4000.00× |"), "{md}");
        assert_eq!(json(&results).as_array().unwrap().len(), FEATURE_ROWS.len());
    }
}
