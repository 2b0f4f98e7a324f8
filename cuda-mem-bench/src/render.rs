//! `report.md` and `results.json`.

use crate::features::{self, FeatureResult};
use crate::join::ReportRow;
use crate::paired::{self, PairedRow};
use crate::rows::Section;
use crate::stats::TARGET_RATIO;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Everything one report is made of: its date (YYYY-MM-DD, from the caller), the machine (the C++
/// program's `env` line), the joined rows in catalogue order, whether a second C++ run was given
/// (the noise column), the feature rows, and the rows of `paired` and `paired --api-time`.
#[derive(Debug, Clone)]
pub struct Report {
    pub date: String,
    pub env: Option<Map<String, Value>>,
    pub rows: Vec<ReportRow>,
    pub with_rerun: bool,
    pub features: Vec<FeatureResult>,
    pub paired: BTreeMap<String, PairedRow>,
    pub profiled: BTreeMap<String, PairedRow>,
}

/// A figure with three significant digits (more for large values), no exponent; "—" if missing.
pub fn cell(value: Option<f64>) -> String {
    match value.map(|v| (v, v.abs())) {
        None => "—".into(),
        Some((v, m)) if m >= 100.0 => format!("{v:.0}"),
        Some((v, m)) if m >= 10.0 => format!("{v:.1}"),
        Some((v, m)) if m >= 1.0 => format!("{v:.2}"),
        Some((v, _)) => format!("{v:.3}"),
    }
}

/// A ratio with three decimals, bold and marked when `flag` is set and it is over the target.
fn ratio_cell(ratio: Option<f64>, flag: bool) -> String {
    match ratio {
        Some(r) if flag && r > TARGET_RATIO => format!("**{r:.3}** ⚠"),
        Some(r) => format!("{r:.3}"),
        None => "—".into(),
    }
}

/// The folded list of what each row measures (`lines`: one `- ...\n` per row).
pub fn details(lines: &str) -> String {
    format!("\n<details><summary>What each row measures</summary>\n\n{lines}\n</details>\n\n")
}

/// Renders `report.md`.
pub fn markdown(report: &Report) -> String {
    let env = |name: &str| report.env.as_ref().and_then(|e| e.get(name)?.as_str()).unwrap_or("unknown");
    let mut out = format!(
        "# cuda-mem benchmark report\n\nDate: {}  \nDevice: {} (compute capability {}), driver CUDA {}, runtime CUDA {}\n\n",
        report.date,
        env("device"),
        env("cc"),
        env("driver"),
        env("runtime")
    );
    let _ = writeln!(
        out,
        "Every figure is the median over samples of (sample time / K) — each sample is K operations timed \
         with the host's monotonic clock after one warm-up sample — measured the same way by the raw CUDA C++ \
         program (`raw_reference`) and by the criterion benchmark (`families`) in the same run. Ratios are \
         ours / raw for µs rows and raw / ours for GB/s rows, so above 1 always means slower than raw CUDA; \
         cuda-mem rows above {TARGET_RATIO} are flagged ⚠."
    );
    let any = |has: fn(&ReportRow) -> bool, section: Option<Section>| {
        report.rows.iter().filter(|r| section.is_none_or(|s| r.row.section == s)).any(has)
    };
    if any(|r| r.ffi.is_some(), None) {
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
    let flagged: Vec<&str> = report.rows.iter().filter(|r| r.flagged()).map(|r| r.row.key).collect();
    let compared = report.rows.iter().filter(|r| r.judged_ratio().is_some()).count();
    let _ = writeln!(
        out,
        "\n**Summary:** {compared} rows compared, {} within {TARGET_RATIO}× of raw CUDA{}{}.\n",
        compared - flagged.len(),
        if any(|r| r.paired_ratio.is_some(), None) {
            " (judged by the same-process interleaved ratio where it was measured, else by the two-process ratio)"
        } else {
            ""
        },
        if flagged.is_empty() { String::new() } else { format!("; over: {}", flagged.join(", ")) }
    );

    let with_cudarc = any(|r| r.cudarc.is_some(), None);
    for section in Section::ALL {
        let with_ffi = any(|r| r.ffi.is_some(), Some(section));
        let with_paired = any(|r| r.paired_ratio.is_some(), Some(section));
        let columns = [
            (with_cudarc, " cudarc | ratio cudarc/raw |", "---:|---:|"),
            (with_ffi, " Rust FFI (same process) | ratio cuda-mem/FFI |", "---:|---:|"),
            (report.with_rerun, " raw rerun/raw (noise) |", "---:|"),
            (with_paired, " same process, interleaved |", "---:|"),
        ];
        let (mut header, mut rule) =
            ("| row | raw C++ | cuda-mem | ratio cuda-mem/raw |".to_string(), "|---|---:|---:|---:|".to_string());
        for (shown, head, align) in columns {
            if shown {
                header += head;
                rule += align;
            }
        }
        let _ = writeln!(out, "## {}\n\n{header}\n{rule}", section.title());
        let (mut notes, mut measures) = (String::new(), String::new());
        for r in report.rows.iter().filter(|r| r.row.section == section) {
            let key = r.row.key;
            let _ = write!(
                out,
                "| `{key}` | {} | {} | {} |",
                cell(r.raw),
                cell(r.cuda_mem),
                ratio_cell(r.ratio(), r.paired_ratio.is_none())
            );
            let cells = [
                (with_cudarc, format!(" {} | {} |", cell(r.cudarc), ratio_cell(r.cudarc_ratio(), false))),
                (with_ffi, format!(" {} | {} |", cell(r.ffi), ratio_cell(r.ffi_ratio(), false))),
                (report.with_rerun, format!(" {} |", ratio_cell(r.rerun_ratio(), false))),
                (with_paired, format!(" {} |", ratio_cell(r.paired_ratio, true))),
            ];
            let cells: String = cells.into_iter().filter(|c| c.0).map(|c| c.1).collect();
            let _ = writeln!(out, "{cells}");
            r.notes.iter().for_each(|n| notes += &format!("\n- `{key}`: {n}"));
            if let Some(d) = &r.raw_detail {
                let _ = writeln!(measures, "- `{key}`: {d}");
            }
        }
        if !notes.is_empty() {
            let _ = writeln!(out, "\nNotes:{notes}");
        }
        out += &if measures.is_empty() { "\n".into() } else { details(&measures) };
    }
    out += &features::markdown(&report.features);
    if !report.paired.is_empty() {
        out += &paired::markdown(&report.paired);
    }
    if report.profiled.values().any(|r| r.api.is_some()) {
        out += &paired::api_markdown(&report.profiled);
    }
    out + "\n## Plots\n\n![latency.svg](latency.svg)\n\n![bandwidth.svg](bandwidth.svg)\n\n"
}

/// Renders `results.json`.
pub fn json(report: &Report) -> Value {
    let rows = report.rows.iter().map(|r| {
        json!({
            "key": r.row.key, "section": r.row.section.name(), "unit": r.row.unit.as_str(), "k": r.row.k,
            "samples": r.row.samples, "bytes": r.row.bytes, "raw": r.raw, "cuda_mem": r.cuda_mem,
            "ratio": r.ratio(), "cudarc": r.cudarc, "cudarc_ratio": r.cudarc_ratio(),
            "raw_rerun_ratio": r.rerun_ratio(), "ffi": r.ffi, "ffi_ratio": r.ffi_ratio(),
            "paired_ratio": r.paired_ratio, "flagged": r.flagged(), "raw_detail": r.raw_detail, "notes": r.notes,
        })
    });
    json!({
        "date": report.date,
        "env": report.env,
        "target_ratio": TARGET_RATIO,
        "ratio_convention": "us rows: cuda_mem / raw; GB/s rows: raw / cuda_mem (above 1 is slower)",
        "rows": rows.collect::<Vec<_>>(),
        "features": features::json(&report.features),
        "paired": paired::json(&report.paired),
        "paired_api": paired::json(&report.profiled),
    })
}
