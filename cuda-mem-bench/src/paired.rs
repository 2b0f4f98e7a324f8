//! Same-process, interleaved comparisons (the `paired` benchmark): a cuda-mem batch and its
//! baseline batch alternate within one process, so both see the same process state, CPU placement
//! and driver state. Two processes of the same program differ by more than any wrapper costs on
//! sub-µs and pinned rows; alternating the two sides sample by sample cancels that drift.
//!
//! Output: one JSON object per line, `{"key","baseline","base_us","ours_us","k","samples"}`, plus
//! `base_api_us`, `ours_api_us`, `base_api_calls`, `ours_api_calls` in profiled runs.

use crate::api_time::ApiTotals;
use crate::rows::{MIB, Row, alloc};
use crate::stats::{TARGET_RATIO, median};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// The baseline label of rows compared with the in-process raw C++ batches.
pub const RAW: &str = "raw C++";
/// Target for adaptors against the resource they wrap (against raw C++: [`TARGET_RATIO`]).
pub const ADAPTOR_TARGET: f64 = 1.05;
/// Target for [`CACHE_ROWS`]: faster than the raw batch.
pub const CACHE_TARGET: f64 = 1.0;
const CACHE_NOTE: &str = " Rows `device_cache_*` time a cache that keeps freed blocks instead of making the \
                          raw calls: their ratio is their share of the raw time, and they must beat it (≤ 1).";

/// Memset nodes in the graph of each [`GRAPH_ROWS`] row.
pub const GRAPH_NODES: u32 = 32;
const GRAPH_NOTE: &str = " Rows `graph_launch_*` time K launches of one executable graph and one synchronize \
                          (each side captures and instantiates its own graph of the same memset nodes on its own \
                          buffer, once): cuda-mem's `GraphExec::run` against `cudaGraphLaunch` in C++ \
                          (`reference/graph_batches.h`). Their ratio is the cost of a launch through cuda-mem.";

/// Graph launches (`GraphExec::run` queuing K launches, then one synchronize) against the C++
/// reference's `cudaGraphLaunch` loop on a graph of the same [`GRAPH_NODES`] memsets of a buffer
/// of the row's bytes. Judged against raw C++: [`TARGET_RATIO`].
pub const GRAPH_ROWS: [Row; 1] = [alloc("graph_launch_small", 4096, 200, 50)];

/// `DeviceCache` hot pairs (alloc + drop, one stream and size, one synchronize per batch), each with
/// the raw row whose batch (retaining pool, no synchronize per pair) it replaces rather than wraps:
/// its ratio is its share of the raw time ([`CACHE_TARGET`]).
pub const CACHE_ROWS: [(Row, &str); 3] = [
    (alloc("device_cache_pair_4k", 4096, 2000, 50), "async_retain_nosync_4k"),
    (alloc("device_cache_pair_1m", MIB, 2000, 50), "async_retain_nosync_1m"),
    (alloc("device_cache_pair_64m", 64 * MIB, 2000, 50), "async_retain_nosync_64m"),
];

/// The baseline's and cuda-mem's batch times, one per sample in the order taken, and (profiled
/// runs only) the time inside CUDA calls during each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Interleaved {
    pub base: Vec<Duration>,
    pub ours: Vec<Duration>,
    pub base_api: Vec<ApiTotals>,
    pub ours_api: Vec<ApiTotals>,
}

/// Runs one untimed warm-up batch of each side, then `samples` batches of each, alternating
/// which side goes first (base-ours, ours-base, ...); `batch(true)` runs a baseline batch,
/// `batch(false)` a cuda-mem one. With `probe` (cumulative time inside CUDA calls,
/// [`crate::api_time::totals`]) also records the part of each batch spent inside CUDA.
pub fn interleave<E>(
    samples: u32,
    probe: Option<&dyn Fn() -> ApiTotals>,
    mut batch: impl FnMut(bool) -> Result<Duration, E>,
) -> Result<Interleaved, E> {
    batch(true)?;
    batch(false)?;
    let mut out = Interleaved::default();
    for base in (0..samples).flat_map(|s| [s % 2 == 0, s % 2 == 1]) {
        let before = probe.map(|p| p());
        let time = batch(base)?;
        let (times, api) = if base { (&mut out.base, &mut out.base_api) } else { (&mut out.ours, &mut out.ours_api) };
        times.push(time);
        if let (Some(p), Some(before)) = (probe, before) {
            api.push(p() - before);
        }
    }
    Ok(out)
}

/// Where one operation's time goes on each side (baseline, cuda-mem) of a profiled row: µs
/// inside CUDA calls and CUDA calls per operation, medians over the samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ApiSplit {
    pub inside_us: (f64, f64),
    pub calls: (f64, f64),
}

/// One compared row: its key, the baseline ([`RAW`] or another row's key), each side's median µs
/// per operation, operations per batch, samples per side, and the split of profiled runs.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedRow {
    pub key: String,
    pub baseline: String,
    pub base_us: f64,
    pub ours_us: f64,
    pub k: u32,
    pub samples: u32,
    pub api: Option<ApiSplit>,
}

impl PairedRow {
    /// Builds the row from interleaved batches of `k` operations (median µs per operation).
    pub fn from_times(key: &str, baseline: &str, k: u32, times: &Interleaved) -> Option<Self> {
        let per_op =
            |d: &[Duration]| median(&d.iter().map(|t| t.as_secs_f64() * 1e6 / f64::from(k)).collect::<Vec<_>>());
        let api = |t: &[ApiTotals]| -> Option<(f64, f64)> {
            let inside: Vec<Duration> = t.iter().map(|a| a.inside).collect();
            Some((per_op(&inside)?, median(&t.iter().map(|a| a.calls as f64 / f64::from(k)).collect::<Vec<_>>())?))
        };
        let split = api(&times.base_api).zip(api(&times.ours_api));
        let split = split.map(|(base, ours)| ApiSplit { inside_us: (base.0, ours.0), calls: (base.1, ours.1) });
        Some(Self {
            key: key.into(),
            baseline: baseline.into(),
            base_us: per_op(&times.base)?,
            ours_us: per_op(&times.ours)?,
            k,
            samples: u32::try_from(times.ours.len()).ok()?,
            api: split,
        })
    }

    /// cuda-mem / baseline (above 1 is slower).
    pub fn ratio(&self) -> f64 {
        self.ours_us / self.base_us
    }

    /// The target of this kind of row.
    pub fn target(&self) -> f64 {
        match (self.baseline == RAW, self.is_cache()) {
            (true, true) => CACHE_TARGET,
            (true, false) => TARGET_RATIO,
            (false, _) => ADAPTOR_TARGET,
        }
    }

    /// True for a row of [`CACHE_ROWS`].
    pub fn is_cache(&self) -> bool {
        CACHE_ROWS.iter().any(|(row, _)| row.key == self.key)
    }

    /// True for a row of [`GRAPH_ROWS`].
    pub fn is_graph(&self) -> bool {
        GRAPH_ROWS.iter().any(|row| row.key == self.key)
    }

    /// True when within its target.
    pub fn met(&self) -> bool {
        self.ratio() <= self.target()
    }

    /// The JSON line the benchmark prints.
    pub fn to_line(&self) -> String {
        let mut line = json!({
            "key": self.key, "baseline": self.baseline, "base_us": self.base_us,
            "ours_us": self.ours_us, "k": self.k, "samples": self.samples,
        });
        if let Some(a) = &self.api {
            line["base_api_us"] = json!(a.inside_us.0);
            line["ours_api_us"] = json!(a.inside_us.1);
            line["base_api_calls"] = json!(a.calls.0);
            line["ours_api_calls"] = json!(a.calls.1);
        }
        line.to_string()
    }

    /// The baseline as the report shows it.
    fn baseline_cell(&self) -> String {
        if self.baseline == RAW { RAW.to_string() } else { format!("`{}`", self.baseline) }
    }
}

/// Parses the benchmark's output (lines that are not JSON objects with a "key", such as a
/// harness banner, are skipped).
pub fn parse(text: &str) -> Result<BTreeMap<String, PairedRow>, String> {
    let mut rows = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let Ok(Value::Object(o)) = serde_json::from_str::<Value>(line.trim()) else { continue };
        let Some(key) = o.get("key").and_then(Value::as_str) else { continue };
        let num = |name: &str| o.get(name).and_then(Value::as_f64).ok_or(format!("line {}: no {name}", index + 1));
        let pair = |base, ours| Some((num(base).ok()?, num(ours).ok()?));
        let row = PairedRow {
            key: key.into(),
            baseline: o.get("baseline").and_then(Value::as_str).unwrap_or(RAW).into(),
            base_us: num("base_us")?,
            ours_us: num("ours_us")?,
            k: num("k")? as u32,
            samples: num("samples")? as u32,
            api: pair("base_api_us", "ours_api_us")
                .zip(pair("base_api_calls", "ours_api_calls"))
                .map(|(inside_us, calls)| ApiSplit { inside_us, calls }),
        };
        if !(row.base_us > 0.0 && row.ours_us > 0.0) {
            return Err(format!("line {}: row {key} has a non-positive time", index + 1));
        }
        rows.insert(key.to_string(), row);
    }
    Ok(rows)
}

/// Keys of the rows of `text` (the benchmark's output) that missed their target, in key order.
pub fn missed_keys(text: &str) -> Result<Vec<String>, String> {
    Ok(parse(text)?.into_values().filter(|r| !r.met()).map(|r| r.key).collect())
}

/// The report section.
pub fn markdown(rows: &BTreeMap<String, PairedRow>) -> String {
    let cache_note = if rows.values().any(PairedRow::is_cache) { CACHE_NOTE } else { "" };
    let graph_note = if rows.values().any(PairedRow::is_graph) { GRAPH_NOTE } else { "" };
    let note = format!("{cache_note}{graph_note}");
    let mut out = format!(
        "## Same process, interleaved\n\n\
         The `paired` benchmark runs each cuda-mem batch and its baseline batch alternately in one process \
         (one warm-up batch each, then base-ours, ours-base, ...; same K, median µs per operation). The raw \
         C++ baseline is the reference program's own code (`reference/alloc_batches.h`, `copy_batches.h`, \
         `read_batches.cuh`), linked into the benchmark and run on the same buffers and streams. This removes the difference between two processes, which on the H200 hosts is \
         larger than any wrapper's cost, so it is the ratio the targets are judged by: ≤ 1.02 against raw \
         C++, ≤ 1.05 for adaptors against the resource they wrap.{note}\n\n\
         | row | baseline | baseline µs | cuda-mem µs | ratio | target |\n|---|---|---:|---:|---:|---|\n",
    );
    for r in rows.values() {
        let verdict =
            if r.met() { format!("≤ {} met", r.target()) } else { format!("**≤ {} missed** ⚠", r.target()) };
        let faster = if r.is_cache() && r.met() { format!(", {:.1}× faster", 1.0 / r.ratio()) } else { String::new() };
        let (key, baseline, ratio) = (&r.key, r.baseline_cell(), r.ratio());
        let _ = writeln!(
            out,
            "| `{key}` | {baseline} | {:.3} | {:.3} | {ratio:.3} | {verdict}{faster} |",
            r.base_us, r.ours_us
        );
    }
    let missed: Vec<&str> = rows.values().filter(|r| !r.met()).map(|r| r.key.as_str()).collect();
    let _ = writeln!(
        out,
        "\n**Summary:** {} rows, {} within target{}.\n",
        rows.len(),
        rows.len() - missed.len(),
        if missed.is_empty() { String::new() } else { format!("; missed: {}", missed.join(", ")) }
    );
    out
}

/// The profile section: each side's time per operation split into inside CUDA calls and
/// outside (the wrapper's or the C++ loop's own code), from a `paired --api-time` run.
pub fn api_markdown(rows: &BTreeMap<String, PairedRow>) -> String {
    let mut out = String::from(
        "## Where the time goes (CUPTI, a separate profiled run)\n\n\
         `paired --api-time` repeats the interleaved comparison with CUPTI callbacks on every driver and \
         runtime call, and splits each side's time per operation into time inside CUDA calls and time \
         outside them. The wrapper's own work (argument checks, error mapping, drop glue) can only be \
         outside; the driver's work is inside. Callbacks add their own cost to both sides alike, so these \
         times are longer than the judged ones above.\n\n\
         | row | baseline | calls/op (base / cuda-mem) | inside µs (base / cuda-mem) | outside µs (base / cuda-mem) | outside difference ns | ratio |\n\
         |---|---|---|---|---|---:|---:|\n",
    );
    for r in rows.values() {
        let Some(a) = &r.api else { continue };
        let (base_out, ours_out) = (r.base_us - a.inside_us.0, r.ours_us - a.inside_us.1);
        let _ = writeln!(
            out,
            "| `{}` | {} | {:.2} / {:.2} | {:.3} / {:.3} | {base_out:.3} / {ours_out:.3} | {:+.0} | {:.3} |",
            r.key,
            r.baseline_cell(),
            a.calls.0,
            a.calls.1,
            a.inside_us.0,
            a.inside_us.1,
            (ours_out - base_out) * 1e3,
            r.ratio()
        );
    }
    out
}

/// The section for results.json.
pub fn json(rows: &BTreeMap<String, PairedRow>) -> Value {
    let rows = rows.values().map(|r| {
        json!({
            "key": r.key, "baseline": r.baseline, "base_us": r.base_us, "ours_us": r.ours_us,
            "ratio": r.ratio(), "target": r.target(), "met": r.met(), "k": r.k, "samples": r.samples,
            "api": r.api.map(|a| json!({
                "base_inside_us": a.inside_us.0, "ours_inside_us": a.inside_us.1,
                "base_calls": a.calls.0, "ours_calls": a.calls.1,
            })),
        })
    });
    Value::Array(rows.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_warms_up_both_sides_alternates_and_probes_each_batch() {
        let log = std::cell::RefCell::new(Vec::new());
        let batch = |base: bool| -> Result<Duration, ()> {
            log.borrow_mut().push(if base { "b" } else { "o" });
            Ok(Duration::from_micros(log.borrow().len() as u64))
        };
        // 3 calls and 40 µs inside CUDA per batch, on either side.
        let probe = || {
            let n = log.borrow().len() as u64;
            ApiTotals { inside: Duration::from_micros(40 * n), calls: 3 * n }
        };
        let times = interleave(3, Some(&probe), batch).unwrap();
        assert_eq!(*log.borrow(), ["b", "o", "b", "o", "o", "b", "b", "o"]);
        // Warm-ups (1, 2) are dropped; then b=3 o=4, o=5 b=6, b=7 o=8.
        let us = |d: &[Duration]| d.iter().map(|t| t.as_micros()).collect::<Vec<_>>();
        assert_eq!((us(&times.base), us(&times.ours)), (vec![3, 6, 7], vec![4, 5, 8]));
        let row = PairedRow::from_times("pool_odd_16441", RAW, 2, &times).unwrap();
        assert_eq!(row.api, Some(ApiSplit { inside_us: (20.0, 20.0), calls: (1.5, 1.5) }));
        assert_eq!(interleave(5, None, |base| if base { Ok(Duration::ZERO) } else { Err("boom") }), Err("boom"));
    }

    #[test]
    fn rows_are_judged_by_kind_and_bad_lines_refused() {
        let row = PairedRow {
            key: "malloc_4k".into(),
            baseline: RAW.into(),
            base_us: 60.0,
            ours_us: 63.0,
            k: 200,
            samples: 30,
            api: None,
        };
        let within = PairedRow { key: "malloc_1m".into(), ours_us: 60.6, ..row.clone() };
        let adaptor =
            PairedRow { key: "resource_stats_pool_1m".into(), baseline: "resource_pool_1m".into(), ..within.clone() };
        let text =
            format!("Running benches/paired.rs\n\n{}", [&row, &within, &adaptor].map(PairedRow::to_line).join("\n"));
        assert_eq!(parse(&text).unwrap()["malloc_4k"], row);
        assert_eq!(missed_keys(&text).unwrap(), ["malloc_4k"], "1.05 misses 1.02; 1.01 meets both targets");
        let cache = PairedRow { key: "device_cache_pair_1m".into(), base_us: 0.65, ours_us: 0.045, ..row.clone() };
        let slow_cache = PairedRow { key: "device_cache_pair_4k".into(), ours_us: 0.66, ..cache.clone() };
        assert_eq!((cache.met(), slow_cache.met(), cache.target()), (true, false, CACHE_TARGET));
        let section = markdown(&parse(&[&cache, &slow_cache].map(PairedRow::to_line).join("\n")).unwrap());
        assert!(section.contains("| 0.069 | ≤ 1 met, 14.4× faster |"), "{section}");
        assert!(section.contains("must beat it") && section.contains("missed: device_cache_pair_4k"));
        assert!(parse("{\"key\":\"a\",\"base_us\":0,\"ours_us\":1,\"k\":1,\"samples\":1}").is_err());
        assert!(parse("{\"key\":\"a\",\"ours_us\":1,\"k\":1,\"samples\":1}").unwrap_err().contains("no base_us"));
    }

    #[test]
    fn graph_launch_rows_are_judged_against_raw_cpp_at_the_raw_target() {
        assert_eq!(GRAPH_ROWS.map(|r| r.key), ["graph_launch_small"]);
        assert!(GRAPH_ROWS.iter().all(|r| r.bytes == 4096 && r.k >= 100 && r.samples >= 10));
        assert!(
            GRAPH_ROWS.iter().all(|g| crate::rows::row(g.key).is_none() && CACHE_ROWS.iter().all(|c| c.0.key != g.key))
        );
        let row = PairedRow {
            key: "graph_launch_small".into(),
            baseline: RAW.into(),
            base_us: 2.0,
            ours_us: 2.03,
            k: 200,
            samples: 100,
            api: None,
        };
        let slow = PairedRow { ours_us: 2.05, ..row.clone() };
        assert!(row.is_graph() && !row.is_cache());
        assert_eq!((row.target(), row.met(), slow.met()), (TARGET_RATIO, true, false));
        let section = markdown(&parse(&row.to_line()).unwrap());
        assert!(
            section.contains("| `graph_launch_small` | raw C++ | 2.000 | 2.030 | 1.015 | ≤ 1.02 met |"),
            "{section}"
        );
        assert!(section.contains("`GraphExec::run` against `cudaGraphLaunch`") && !section.contains("must beat it"));
        let missed = markdown(&parse(&slow.to_line()).unwrap());
        assert!(missed.contains("| 1.025 | **≤ 1.02 missed** ⚠ |") && missed.contains("missed: graph_launch_small"));
        let plain = markdown(&parse(&PairedRow { key: "malloc_4k".into(), ..row }.to_line()).unwrap());
        assert!(!plain.contains("graph_launch"), "{plain}");
    }
}
