//! The workload corpus's table for `docs/workloads.md`: the JSON lines of the `workloads` example
//! (cuda-mem), `workloads/rmm_replay` and `workloads/torch_replay.py` (the peers), measured in one
//! device call, joined into one Markdown table per workload; and the training loop's rows
//! (`workloads/run_training.sh`). Regenerated from the committed raw files by
//! `cargo run -p cuda-mem-bench --bin workload_table -- DIR`; a test keeps the doc in step.

use serde_json::Value;
use std::fmt::Write;

/// One replay of one workload by one allocator.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    pub workload: String,
    pub allocator: String,
    pub ns_per_op: f64,
    pub reserved_over_live: f64,
    pub misses: Option<u64>,
    pub allocations: Option<u64>,
}

/// The training loop through one allocator: every process of it in one results file.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingRun {
    pub allocator: String,
    /// Processes run (`run_training.sh`'s rounds).
    pub runs: usize,
    /// The median over the processes of each one's median step (the mean of the middle two for
    /// an even count).
    pub step_ms_median: f64,
    /// The fastest and slowest process's median step.
    pub step_ms_range: (f64, f64),
    /// The most any process reserved and allocated at its peak.
    pub peak_reserved: u64,
    pub peak_allocated: u64,
}

/// The replays in `text` (JSON lines; other lines and error rows are left out).
pub fn replays(text: &str) -> Vec<Replay> {
    rows(text)
        .filter_map(|row| {
            Some(Replay {
                workload: row.get("workload")?.as_str()?.to_string(),
                allocator: row.get("allocator")?.as_str()?.to_string(),
                ns_per_op: row.get("ns_per_op")?.as_f64()?,
                reserved_over_live: row.get("reserved_over_live")?.as_f64()?,
                misses: row.get("misses_pass2").and_then(Value::as_u64),
                allocations: row.get("allocations_pass2").and_then(Value::as_u64),
            })
        })
        .collect()
}

/// The training runs in `text` (JSON lines of `torch_training.py`), one per allocator in the
/// order met, each over all of that allocator's lines.
pub fn training_runs(text: &str) -> Vec<TrainingRun> {
    let mut by_allocator: Vec<(String, Vec<f64>, u64, u64)> = Vec::new();
    for row in rows(text) {
        let parsed = (|| {
            let allocator = row.get("allocator")?.as_str()?.to_string();
            let step = row.get("step_ms_median")?.as_f64()?;
            Some((
                allocator,
                step,
                row.get("peak_reserved_bytes")?.as_u64()?,
                row.get("peak_allocated_bytes")?.as_u64()?,
            ))
        })();
        let Some((allocator, step, reserved, allocated)) = parsed else { continue };
        match by_allocator.iter_mut().find(|(name, ..)| *name == allocator) {
            Some((_, steps, most_reserved, most_allocated)) => {
                steps.push(step);
                *most_reserved = (*most_reserved).max(reserved);
                *most_allocated = (*most_allocated).max(allocated);
            }
            None => by_allocator.push((allocator, vec![step], reserved, allocated)),
        }
    }
    by_allocator
        .into_iter()
        .map(|(allocator, mut steps, peak_reserved, peak_allocated)| {
            steps.sort_by(f64::total_cmp);
            let n = steps.len();
            let step_ms_median = if n % 2 == 1 { steps[n / 2] } else { (steps[n / 2 - 1] + steps[n / 2]) / 2.0 };
            TrainingRun {
                allocator,
                runs: n,
                step_ms_median,
                step_ms_range: (steps[0], steps[n - 1]),
                peak_reserved,
                peak_allocated,
            }
        })
        .collect()
}

fn rows(text: &str) -> impl Iterator<Item = Value> + '_ {
    text.lines().filter(|l| l.trim_start().starts_with('{')).filter_map(|l| serde_json::from_str(l).ok())
}

/// Whether an allocator row is cuda-mem's (the rest are peers).
fn is_ours(allocator: &str) -> bool {
    allocator.starts_with("cuda_mem")
}

/// The Markdown tables: one per workload (in the order met), rows as met, with each row's time
/// over the fastest peer's.
pub fn replay_table(replays: &[Replay]) -> String {
    let mut out = String::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in replays {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    for workload in workloads {
        let rows: Vec<&Replay> = replays.iter().filter(|r| r.workload == workload).collect();
        let fastest_peer =
            rows.iter().filter(|r| !is_ours(&r.allocator)).map(|r| r.ns_per_op).fold(f64::INFINITY, f64::min);
        let _ = writeln!(out, "**{workload}**\n");
        let _ = writeln!(
            out,
            "| allocator | ns per op | ÷ fastest peer | peak reserved / peak live | misses after warm-up |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        for r in rows {
            let ratio =
                if fastest_peer.is_finite() { format!("{:.2}", r.ns_per_op / fastest_peer) } else { "–".into() };
            let misses = match (r.misses, r.allocations) {
                (Some(m), Some(a)) if a > 0 => format!("{m} ({:.2}%)", 100.0 * m as f64 / a as f64),
                _ => "not counted".into(),
            };
            let name = if is_ours(&r.allocator) { format!("**{}**", r.allocator) } else { r.allocator.clone() };
            let _ = writeln!(out, "| {name} | {:.0} | {ratio} | {:.3} | {misses} |", r.ns_per_op, r.reserved_over_live);
        }
        out.push('\n');
    }
    out
}

/// The training loop's table: step time against the native allocator's, peak reserved over
/// peak allocated.
pub fn training_table(runs: &[TrainingRun]) -> String {
    let native = runs.iter().find(|r| r.allocator == "torch_native").map(|r| r.step_ms_median);
    let mut out = String::from(
        "| allocator | processes | step (ms, median of the processes' medians) | fastest–slowest process | ÷ native | peak reserved (MiB) | peak allocated (MiB) | reserved / allocated |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let ratio = native.map_or("–".into(), |n| format!("{:.3}", r.step_ms_median / n));
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1}–{:.1} | {ratio} | {} | {} | {:.3} |",
            r.allocator,
            r.runs,
            r.step_ms_median,
            r.step_ms_range.0,
            r.step_ms_range.1,
            r.peak_reserved >> 20,
            r.peak_allocated >> 20,
            r.peak_reserved as f64 / r.peak_allocated as f64
        );
    }
    out
}

/// Both tables from the raw files of one results folder: `cuda_mem.jsonl`, `rmm.jsonl`,
/// `torch.jsonl`, `torch_exp.jsonl` (replays) and `training.jsonl` (the loop); missing files
/// are left out.
pub fn tables_of(dir: &std::path::Path) -> String {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let mut all = Vec::new();
    for name in ["cuda_mem.jsonl", "rmm.jsonl", "torch.jsonl", "torch_exp.jsonl"] {
        all.extend(replays(&read(name)));
    }
    let mut out = replay_table(&all);
    let runs = training_runs(&read("training.jsonl"));
    if !runs.is_empty() {
        out.push_str("**training loop in PyTorch** (`run_training.sh`)\n\n");
        out.push_str(&training_table(&runs));
    }
    out
}

/// The markers around a generated part of `docs/workloads.md`, named `tag` (`""` for the main
/// tables).
pub fn markers(tag: &str) -> (String, String) {
    let tag = if tag.is_empty() { String::new() } else { format!(" {tag}") };
    (format!("<!-- workload-table{tag}: begin -->"), format!("<!-- workload-table{tag}: end -->"))
}

/// `doc` with the text between the markers named `tag` replaced by `tables`; `None` without
/// those markers.
pub fn with_tables(doc: &str, tag: &str, tables: &str) -> Option<String> {
    let (begin, end) = markers(tag);
    let start = doc.find(&begin)? + begin.len();
    let stop = doc[start..].find(&end)? + start;
    Some(format!("{}\n{}{}", &doc[..start], tables, &doc[stop..]))
}

/// The committed results the doc quotes, relative to the workspace root, with their markers' tags:
/// the corpus, and the PyTorch training loop with its recorded trace (two sections of the report).
pub const RESULTS: [(&str, &str); 2] =
    [("docs/bench/2026-12-07-h100/raw/workloads", ""), ("docs/bench/2026-12-07-h100/raw/training", "training")];

#[cfg(test)]
mod tests {
    use super::*;

    const ROWS: &str = r#"{"workload":"churn","allocator":"cuda_mem_cache_default","ns_per_op":91.2,"reserved_over_live":1.2617,"misses_pass2":23,"allocations_pass2":100013}
not json
{"workload":"churn","allocator":"rmm_binning","ns_per_op":252.6,"reserved_over_live":2.838,"misses_pass2":0,"allocations_pass2":100013}
{"workload":"churn","allocator":"cuda_async","ns_per_op":1200.7,"reserved_over_live":1.74,"misses_pass2":null,"allocations_pass2":100013}
{"workload":"churn","allocator":"rmm_arena","error":"out of memory"}"#;

    #[test]
    fn rows_are_read_and_errors_left_out() {
        let r = replays(ROWS);
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].misses, r[2].misses), (Some(23), None));
    }

    #[test]
    fn the_table_divides_by_the_fastest_peer() {
        let table = replay_table(&replays(ROWS));
        assert!(table.contains("| **cuda_mem_cache_default** | 91 | 0.36 | 1.262 | 23 (0.02%) |"), "{table}");
        assert!(table.contains("| rmm_binning | 253 | 1.00 | 2.838 | 0 (0.00%) |"), "{table}");
        assert!(table.contains("| cuda_async | 1201 | 4.75 | 1.740 | not counted |"), "{table}");
    }

    #[test]
    fn the_training_table_compares_with_native() {
        let runs = training_runs(
            r#"{"allocator":"torch_native","step_ms_median":100.0,"peak_reserved_bytes":2097152,"peak_allocated_bytes":1048576}
{"allocator":"cuda_mem","step_ms_median":101.0,"peak_reserved_bytes":1048576,"peak_allocated_bytes":1048576}"#,
        );
        let table = training_table(&runs);
        assert!(table.contains("| cuda_mem | 1 | 101.0 | 101.0–101.0 | 1.010 | 1 | 1 | 1.000 |"), "{table}");
        assert!(table.contains("| torch_native | 1 | 100.0 | 100.0–100.0 | 1.000 | 2 | 1 | 2.000 |"), "{table}");
    }

    #[test]
    fn several_processes_of_an_allocator_give_their_median_and_range() {
        let line = |allocator: &str, step: f64, reserved: u64| {
            format!(
                r#"{{"allocator":"{allocator}","step_ms_median":{step},"peak_reserved_bytes":{reserved},"peak_allocated_bytes":1048576}}"#
            )
        };
        let text = [
            line("torch_native", 20.0, 2 << 20),
            line("cuda_mem", 19.0, 1 << 20),
            line("torch_native", 18.0, 2 << 20),
            line("cuda_mem", 23.0, 3 << 20),
            line("torch_native", 19.0, 2 << 20),
            line("cuda_mem", 21.0, 1 << 20),
            line("torch_native", 30.0, 2 << 20),
        ]
        .join("\n");
        let runs = training_runs(&text);
        assert_eq!(runs.len(), 2);
        let (native, ours) = (&runs[0], &runs[1]);
        assert_eq!((native.allocator.as_str(), native.runs, native.step_ms_median), ("torch_native", 4, 19.5));
        assert_eq!(native.step_ms_range, (18.0, 30.0));
        assert_eq!((ours.runs, ours.step_ms_median, ours.step_ms_range), (3, 21.0, (19.0, 23.0)));
        assert_eq!(ours.peak_reserved, 3 << 20, "the most any process reserved");
        let table = training_table(&runs);
        assert!(table.contains("| cuda_mem | 3 | 21.0 | 19.0–23.0 | 1.077 | 3 | 1 | 3.000 |"), "{table}");
    }

    #[test]
    fn the_doc_quotes_the_committed_results() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
        let doc = std::fs::read_to_string(root.join("docs/workloads.md")).expect("docs/workloads.md");
        for (dir, tag) in RESULTS {
            let tables = tables_of(&root.join(dir));
            assert!(tables.contains("rmm_"), "{dir} holds the raw results");
            assert_eq!(
                with_tables(&doc, tag, &tables).as_deref(),
                Some(doc.as_str()),
                "docs/workloads.md is stale: run `cargo run -p cuda-mem-bench --bin workload_table -- {dir} --doc docs/workloads.md {tag}`"
            );
        }
    }
}
