//! Rows for what cuda-mem adds beyond the families: the pinned caching pool, staged pageable
//! copies and the memory-resource adaptors. Each is measured in the benchmark process (criterion
//! group `features`, the method of every other row) and set against a baseline: a raw C++ row of
//! the same run, or, for an adaptor, the resource it wraps.

use crate::inputs::{RawRun, Samples};
use crate::rows::{MIB, Row, Section, Unit};
use crate::{render, stats};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::Write;

/// One feature row: its catalogue entry, its baseline's key (a raw C++ row, or for an `adaptor`
/// the feature row it wraps) and what one operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    pub row: Row,
    pub baseline: &'static str,
    pub adaptor: bool,
    pub what: &'static str,
}

const fn us(key: &'static str, k: u32, samples: u32, bytes: u64) -> Row {
    Row { key, section: Section::Features, unit: Unit::Micros, k, samples, bytes }
}

const fn gbs(key: &'static str, samples: u32, bytes: u64) -> Row {
    Row { key, section: Section::Features, unit: Unit::GigabytesPerSecond, k: 1, samples, bytes }
}

const fn raw(row: Row, baseline: &'static str, what: &'static str) -> Feature {
    Feature { row, baseline, adaptor: false, what }
}

const fn adaptor(key: &'static str, what: &'static str) -> Feature {
    Feature { row: us(key, 200, 50, MIB), baseline: "resource_pool_1m", adaptor: true, what }
}

const HIT: &str = "PinnedPool::alloc + drop, cache hit";
const TO_DEVICE: &str = "StagedCopier::copy_to_device from pageable memory";
const TO_HOST: &str = "StagedCopier::copy_to_host into pageable memory";

/// Every feature row, in report order.
pub const FEATURES: &[Feature] = &[
    raw(us("pinned_pool_hit_4k", 2000, 30, 4096), "malloc_host_4k", HIT),
    raw(us("pinned_pool_hit_1m", 2000, 30, MIB), "malloc_host_1m", HIT),
    raw(us("pinned_pool_hit_64m", 2000, 30, 64 * MIB), "malloc_host_64m", HIT),
    raw(gbs("staged_h2d_256m", 20, 256 * MIB), "h2d_pageable", TO_DEVICE),
    raw(gbs("staged_d2h_256m", 20, 256 * MIB), "d2h_pageable", TO_HOST),
    raw(
        gbs("staged_h2d_1g", 10, 1024 * MIB),
        "h2d_pageable",
        "StagedCopier::copy_to_device from pageable memory, 1 GiB",
    ),
    raw(gbs("staged_d2h_1g", 10, 1024 * MIB), "d2h_pageable", "StagedCopier::copy_to_host into pageable memory, 1 GiB"),
    raw(
        gbs("register_copy_unregister_h2d_256m", 10, 256 * MIB),
        "h2d_pageable",
        "cudaHostRegister + cudaMemcpy + cudaHostUnregister (RegisteredHost), for comparison",
    ),
    raw(
        us("resource_pool_1m", 200, 50, MIB),
        "async_retain_nosync_1m",
        "ResourceBuffer from a PoolResource (retaining pool) + drop, one synchronize per sample",
    ),
    adaptor("resource_stats_pool_1m", "the same through StatisticsResource"),
    adaptor("resource_limit_pool_1m", "the same through LimitingResource"),
    adaptor("resource_limit_stats_pool_1m", "the same through LimitingResource(StatisticsResource(..))"),
    adaptor("resource_tracking_pool_1m", "the same through TrackingResource (no backtraces)"),
];

/// The feature row with this key.
pub fn feature_row(key: &str) -> Option<&'static Row> {
    FEATURES.iter().map(|f| &f.row).find(|r| r.key == key)
}

/// A feature row's figure and its baseline's.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureResult {
    pub feature: &'static Feature,
    pub value: Option<f64>,
    pub baseline_value: Option<f64>,
}

impl FeatureResult {
    /// How many times faster than the baseline (< 1: slower).
    pub fn speedup(&self) -> Option<f64> {
        stats::ratio(self.feature.row.unit, self.value, self.baseline_value)
    }
}

/// Figures for every feature row and its baseline from criterion's samples (by `group/key`).
pub fn evaluate(raw: &RawRun, criterion: &BTreeMap<String, Samples>) -> Vec<FeatureResult> {
    let figure = |row: &Row| stats::figure(row, criterion.get(&format!("{}/{}", Section::Features.name(), row.key))?);
    let results = FEATURES.iter().map(|feature| {
        let baseline_value = match feature.adaptor {
            false => raw.rows.get(feature.baseline).map(|r| r.value),
            true => feature_row(feature.baseline).and_then(figure),
        };
        FeatureResult { feature, value: figure(&feature.row), baseline_value }
    });
    results.collect()
}

/// The report section.
pub fn markdown(results: &[FeatureResult]) -> String {
    let mut out = format!(
        "## {}\n\nMeasured in the benchmark process with the same method; the baseline is a raw C++ row of this \
         run, or (for adaptors) the unwrapped resource. Speed-up above 1 means faster than the baseline; \
         for adaptors, 1/speed-up is the adaptor's cost (target ≤ 1.05).\n\n\
         | row | unit | cuda-mem | baseline | baseline figure | speed-up |\n|---|---|---:|---|---:|---:|\n",
        Section::Features.title()
    );
    for r in results {
        let f = r.feature;
        let baseline = if f.adaptor { format!("`{}`", f.baseline) } else { format!("raw `{}`", f.baseline) };
        let speedup = r.speedup().map_or_else(|| "—".into(), |s| format!("{s:.2}×"));
        let (value, base) = (render::cell(r.value), render::cell(r.baseline_value));
        let _ =
            writeln!(out, "| `{}` | {} | {value} | {baseline} | {base} | {speedup} |", f.row.key, f.row.unit.as_str());
    }
    let whats: String = results.iter().map(|r| format!("- `{}`: {}\n", r.feature.row.key, r.feature.what)).collect();
    out + &render::details(&whats)
}

/// The section for results.json.
pub fn json(results: &[FeatureResult]) -> Value {
    let rows = results.iter().map(|r| {
        json!({
            "key": r.feature.row.key, "unit": r.feature.row.unit.as_str(), "cuda_mem": r.value,
            "baseline": r.feature.baseline, "baseline_value": r.baseline_value, "speedup": r.speedup(),
        })
    });
    Value::Array(rows.collect())
}
