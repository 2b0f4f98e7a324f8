//! `report.md` and `results.json`.

use crate::claims::{ClaimCheck, num};
use crate::inputs::Env;
use crate::join::{ReportRow, in_section};
use crate::rows::{CLAIM_ROWS, Section};
use crate::stats::TARGET_RATIO;
use serde_json::{Value, json};
use std::fmt::Write;

/// Everything one report is made of.
#[derive(Debug, Clone)]
pub struct Report<'a> {
    /// The date of the report (YYYY-MM-DD, UTC).
    pub date: String,
    /// The machine, from the C++ program.
    pub env: Option<&'a Env>,
    /// Joined rows, in catalogue order.
    pub rows: &'a [ReportRow],
    /// Claim verdicts.
    pub claims: &'a [ClaimCheck],
    /// The raw claim rows: key, value, detail.
    pub claim_rows: Vec<(&'static str, Option<(f64, String)>)>,
    /// Whether cudarc figures were supplied.
    pub with_cudarc: bool,
    /// Whether a second run of the C++ program was supplied (adds the noise-floor column).
    pub with_rerun: bool,
    /// Plot files written next to the report (file names).
    pub plots: Vec<String>,
}

fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_string(), num)
}

fn ratio_cell(ratio: Option<f64>, flag: bool) -> String {
    match ratio {
        Some(r) if flag && r > TARGET_RATIO => format!("**{r:.3}** ⚠"),
        Some(r) => format!("{r:.3}"),
        None => "—".into(),
    }
}

/// Renders `report.md`.
pub fn markdown(report: &Report<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# cuda-mem benchmark report\n");
    let _ = writeln!(out, "Date: {}  ", report.date);
    match report.env {
        Some(env) => {
            let _ = writeln!(
                out,
                "Device: {} (compute capability {}), driver CUDA {}, runtime CUDA {}",
                env.device, env.cc, env.driver, env.runtime
            );
        }
        None => out.push_str("Device: unknown (the raw output has no env line)\n"),
    }
    out.push_str(
        "\nEvery figure is the median over samples of (sample time / K) — each sample is K operations timed \
         with the host's monotonic clock after one warm-up sample — measured the same way by the raw CUDA C++ \
         program (`raw_reference`) and by the criterion benchmark (`families`) in the same run. Ratios are \
         ours / raw for µs rows and raw / ours for GB/s rows, so above 1 always means slower than raw CUDA; \
         cuda-mem rows above ",
    );
    let _ = writeln!(out, "{TARGET_RATIO} are flagged ⚠.");
    if report.rows.iter().any(|r| r.ffi.is_some()) {
        out.push_str(
            "The FFI column times the same runtime calls made directly through `cuda_mem::sys` inside the \
             benchmark process (criterion group `ffi-alloc`): cuda-mem/FFI is the wrapper's own cost, free of \
             differences between the two processes.\n",
        );
    }
    if report.with_rerun {
        out.push_str(
            "The noise column compares a second run of the C++ program with the first: a cuda-mem ratio \
             within that distance of 1 is not distinguishable from run-to-run variation.\n",
        );
    }
    out.push('\n');

    let flagged: Vec<&str> = report.rows.iter().filter(|r| r.flagged()).map(|r| r.row.key).collect();
    let compared = report.rows.iter().filter(|r| r.judged_ratio().is_some()).count();
    let _ = writeln!(
        out,
        "**Summary:** {compared} rows compared, {} within {TARGET_RATIO}× of raw CUDA{}{}.\n",
        compared - flagged.len(),
        if report.rows.iter().any(|r| r.paired_ratio.is_some()) {
            " (judged by the same-process interleaved ratio where it was measured, else by the two-process ratio)"
        } else {
            ""
        },
        if flagged.is_empty() { String::new() } else { format!("; over: {}", flagged.join(", ")) }
    );

    for section in Section::ALL {
        let _ = writeln!(out, "## {}\n", section.title());
        let mut header = "| row | raw C++ | cuda-mem | ratio cuda-mem/raw |".to_string();
        let mut rule = "|---|---:|---:|---:|".to_string();
        if report.with_cudarc {
            header += " cudarc | ratio cudarc/raw |";
            rule += "---:|---:|";
        }
        let with_ffi = in_section(report.rows, section).any(|r| r.ffi.is_some());
        if with_ffi {
            header += " Rust FFI (same process) | ratio cuda-mem/FFI |";
            rule += "---:|---:|";
        }
        if report.with_rerun {
            header += " raw rerun/raw (noise) |";
            rule += "---:|";
        }
        let with_paired = in_section(report.rows, section).any(|r| r.paired_ratio.is_some());
        if with_paired {
            header += " same process, interleaved |";
            rule += "---:|";
        }
        let _ = writeln!(out, "{header}\n{rule}");
        for row in in_section(report.rows, section) {
            let mut line = format!(
                "| `{}` | {} | {} | {} |",
                row.row.key,
                cell(row.raw),
                cell(row.cuda_mem),
                ratio_cell(row.ratio, row.paired_ratio.is_none())
            );
            if report.with_cudarc {
                let _ = write!(line, " {} | {} |", cell(row.cudarc), ratio_cell(row.cudarc_ratio, false));
            }
            if with_ffi {
                let _ = write!(line, " {} | {} |", cell(row.ffi), ratio_cell(row.ffi_ratio, false));
            }
            if report.with_rerun {
                let _ = write!(line, " {} |", ratio_cell(row.rerun_ratio, false));
            }
            if with_paired {
                let _ = write!(line, " {} |", ratio_cell(row.paired_ratio, true));
            }
            let _ = writeln!(out, "{line}");
        }
        let notes: Vec<String> = in_section(report.rows, section)
            .flat_map(|r| r.notes.iter().map(move |n| format!("- `{}`: {n}", r.row.key)))
            .collect();
        let details: Vec<String> = in_section(report.rows, section)
            .filter_map(|r| r.raw_detail.as_ref().map(|d| format!("- `{}`: {d}", r.row.key)))
            .collect();
        if !notes.is_empty() {
            let _ = writeln!(out, "\nNotes:\n{}", notes.join("\n"));
        }
        if !details.is_empty() {
            let _ = writeln!(
                out,
                "\n<details><summary>What each row measures</summary>\n\n{}\n\n</details>",
                details.join("\n")
            );
        }
        out.push('\n');
    }

    let _ = writeln!(out, "## Claims checked\n");
    out.push_str(
        "Claims of the source document (see docs/reference/yardsticks.md), with this run's raw CUDA figures.\n\n\
         | claim | verdict | measured in this run |\n|---|---|---|\n",
    );
    for claim in report.claims {
        let _ = writeln!(out, "| {} | {} | {} |", claim.claim, claim.verdict, claim.evidence.replace('|', "\\|"));
    }
    out.push_str("\nRaw claim rows (1 = the call succeeded):\n\n| row | value | result |\n|---|---:|---|\n");
    for (key, value) in &report.claim_rows {
        match value {
            Some((v, detail)) => {
                let _ = writeln!(out, "| `{key}` | {v} | {detail} |");
            }
            None => {
                let _ = writeln!(out, "| `{key}` | — | not run |");
            }
        }
    }
    if !report.plots.is_empty() {
        out.push_str("\n## Plots\n\n");
        for plot in &report.plots {
            let _ = writeln!(out, "![{plot}]({plot})\n");
        }
    }
    out
}

/// Renders `results.json`.
pub fn json(report: &Report<'_>) -> Value {
    let rows: Vec<Value> = report
        .rows
        .iter()
        .map(|r| {
            json!({
                "key": r.row.key,
                "section": r.row.section.name(),
                "unit": r.unit().as_str(),
                "k": r.row.k,
                "samples": r.row.samples,
                "bytes": r.row.bytes,
                "raw": r.raw,
                "cuda_mem": r.cuda_mem,
                "ratio": r.ratio,
                "cudarc": r.cudarc,
                "cudarc_ratio": r.cudarc_ratio,
                "raw_rerun_ratio": r.rerun_ratio,
                "ffi": r.ffi,
                "ffi_ratio": r.ffi_ratio,
                "paired_ratio": r.paired_ratio,
                "flagged": r.flagged(),
                "raw_detail": r.raw_detail,
                "notes": r.notes,
            })
        })
        .collect();
    let claims: Vec<Value> = report
        .claims
        .iter()
        .map(|c| json!({"claim": c.claim, "verdict": c.verdict.to_string(), "evidence": c.evidence}))
        .collect();
    let claim_rows: Vec<Value> = report
        .claim_rows
        .iter()
        .map(
            |(key, v)| json!({"key": key, "value": v.as_ref().map(|x| x.0), "detail": v.as_ref().map(|x| x.1.clone())}),
        )
        .collect();
    json!({
        "date": report.date,
        "env": report.env.map(|e| Value::Object(e.fields.clone())),
        "target_ratio": TARGET_RATIO,
        "ratio_convention": "us rows: cuda_mem / raw; GB/s rows: raw / cuda_mem (above 1 is slower)",
        "rows": rows,
        "claims": claims,
        "claim_rows": claim_rows,
    })
}

/// The raw claim rows in [`CLAIM_ROWS`] order.
pub fn claim_rows(raw: &crate::inputs::RawRun) -> Vec<(&'static str, Option<(f64, String)>)> {
    CLAIM_ROWS.iter().map(|&key| (key, raw.rows.get(key).map(|r| (r.value, r.detail.clone())))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::{Samples, parse_raw};
    use crate::join::join;
    use std::collections::BTreeMap;

    #[test]
    fn markdown_and_json_carry_rows_ratios_flags_and_claims() {
        let raw = parse_raw(
            "{\"key\":\"env\",\"device\":\"NVIDIA H200\",\"driver\":\"13.0\",\"runtime\":\"13.0\",\"cc\":\"9.0\"}\n\
             {\"key\":\"malloc_4k\",\"value\":60,\"unit\":\"us\",\"detail\":\"cudaMalloc + cudaFree\",\"k\":200,\"samples\":30}\n\
             {\"key\":\"claim_cross_stream_free\",\"value\":1,\"unit\":\"ok\",\"detail\":\"cudaSuccess\"}",
        )
        .unwrap();
        let mut ours = BTreeMap::new();
        ours.insert("malloc_4k".to_string(), Samples { iters: vec![1.0], times: vec![12.6e6] }); // 63 µs
        let mut cudarc = BTreeMap::new();
        cudarc.insert("malloc_4k".to_string(), Samples { iters: vec![1.0], times: vec![12.0e6] });
        let rows = join(&raw, &ours, &cudarc, false);
        let claims = crate::claims::check(&raw);
        let report = Report {
            date: "2026-11-29".into(),
            env: raw.env.as_ref(),
            rows: &rows,
            claims: &claims,
            claim_rows: claim_rows(&raw),
            with_cudarc: true,
            with_rerun: false,
            plots: vec!["latency.svg".into()],
        };
        let md = markdown(&report);
        assert!(md.contains("Date: 2026-11-29"));
        assert!(md.contains("Device: NVIDIA H200 (compute capability 9.0), driver CUDA 13.0, runtime CUDA 13.0"));
        assert!(md.contains("| `malloc_4k` | 60.0 | 63.0 | **1.050** ⚠ | 60.0 | 1.000 |"), "{md}");
        assert!(md.contains("over: malloc_4k"));
        assert!(md.contains("| `claim_cross_stream_free` | 1 | cudaSuccess |"));
        assert!(md.contains("## Claims checked"));
        assert!(md.contains("![latency.svg](latency.svg)"));
        let value = json(&report);
        assert_eq!(value["env"]["device"], "NVIDIA H200");
        let malloc = value["rows"].as_array().unwrap().iter().find(|r| r["key"] == "malloc_4k").unwrap();
        assert_eq!(malloc["flagged"], true);
        assert_eq!(malloc["raw"], 60.0);
        assert_eq!(value["claims"].as_array().unwrap().len(), 8);
    }
}
