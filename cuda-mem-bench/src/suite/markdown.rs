//! `report.md`: how each section ran, then one table per section, every row with its key (an
//! anchor docs link to), cuda-mem's value, the peer's, their ratio and the peer's version.

use super::{Row, SECTIONS, Suite};
use std::fmt::Write;

/// Each section's title in the report.
pub fn title(section: &str) -> &'static str {
    match section {
        "paired" => "Wrapper rows against raw CUDA C++ and cudarc (`paired`)",
        "cache" => "Caching allocators: DeviceCache and PinnedPool pairs",
        "threads" => "Thread scaling: 1 MiB pairs, a stream per thread",
        "workloads" => "Workload corpus: time and memory of whole allocation traces",
        "training" => "PyTorch training step and memory through the allocator",
        "graphs" => "CUDA graphs: a decode step captured and replayed",
        "async" => "Async server and data loader",
        "staged" => "Staged copies of pageable memory",
        "snapshot" => "Memory snapshot",
        "nccl" => "NCCL all-reduce over cuda-mem memory",
        "sleep" => "Sleep and wake: tagged memory given back and restored at the same addresses",
        _ => "other",
    }
}

/// A value with four significant digits (plain decimals, no exponent).
pub fn figure(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    let digits = (3 - value.abs().log10().floor() as i32).max(0) as usize;
    format!("{value:.digits$}")
}

fn cell(value: Option<f64>) -> String {
    value.map_or("–".into(), figure)
}

fn table(rows: &[&Row]) -> String {
    let mut out = String::from(
        "| key | what | cuda-mem | peer | peer's value | ratio | peer version | status |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let ratio = r.ratio().map_or("–".into(), figure);
        let _ = writeln!(
            out,
            "| <a id=\"{k}\"></a>`{k}` | {} | {} | {} | {} | {ratio} | {} | {} |",
            r.what,
            r.cuda_mem.map_or("–".into(), |v| format!(
                "{} {}",
                figure(v),
                if r.unit == "us" { "µs" } else { r.unit }
            )),
            r.peer,
            cell(r.peer_value),
            r.peer_version,
            r.status,
            k = r.key
        );
    }
    out
}

pub fn report(suite: &Suite, plots: &[&str]) -> String {
    let mut out = String::new();
    let device = if suite.device.is_empty() { "device not recorded".to_string() } else { suite.device.clone() };
    let _ = writeln!(out, "# cuda-mem benchmark report, {} ({device})\n", suite.date);
    let commit = match suite.commits().as_slice() {
        [] => "not recorded".to_string(),
        [one] => format!("commit `{one}`"),
        many => format!(
            "commits {} (each section's below)",
            many.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
        ),
    };
    let _ = writeln!(
        out,
        "Measured by `./run --bench OUT --only SECTIONS` of the bundle (or `cargo xtask bench`) at {commit}; \
         generated from the raw outputs by `bench_report` (`cuda_mem_bench::suite`). Every row holds cuda-mem's \
         value and one peer's, measured in the same run; `results.json` holds the same rows under the same keys. \
         Ratio: cuda-mem's cost over the peer's (time over time, or the peer's rate over cuda-mem's), so below 1 is \
         cuda-mem ahead. Compare ratios, not absolute values, across runs: host speed drifts between device calls.\n"
    );
    let _ = writeln!(
        out,
        "## Sections run\n\n| section | started (UTC) | seconds | exit code | rows | commit |\n|---|---|---|---|---|---|"
    );
    for ran in &suite.ran {
        let rows = suite.rows.iter().filter(|r| r.section == ran.section).count();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {rows} | {} |",
            ran.section,
            if ran.started.is_empty() { "–" } else { &ran.started },
            ran.seconds.map_or("–".into(), |s| format!("{s:.0}")),
            ran.rc.map_or("–".into(), |c| c.to_string()),
            if ran.commit.is_empty() { "–" } else { &ran.commit },
        );
    }
    let missing: Vec<&str> = SECTIONS.iter().copied().filter(|s| !suite.ran.iter().any(|r| r.section == *s)).collect();
    if !missing.is_empty() {
        let _ = writeln!(out, "\nNot in this report: {}.", missing.join(", "));
    }
    if !plots.is_empty() {
        let _ = writeln!(out, "\n## Plots\n");
        for plot in plots {
            let _ = writeln!(out, "![{}]({plot})\n", plot.trim_end_matches(".svg"));
        }
    }
    for ran in &suite.ran {
        let rows: Vec<&Row> = suite.rows.iter().filter(|r| r.section == ran.section).collect();
        let _ = writeln!(out, "\n## {}\n", title(ran.section));
        out.push_str(&table(&rows));
    }
    out.push_str(&super::same_call::section(suite));
    out
}
