//! The `paired` section: the wrapper report (`report` binary: raw CUDA C++, criterion with
//! cudarc, and the same-process comparison) as rows of the main report. Its `results.json` is
//! read from `paired/report/`.

use super::{Better, Peer, Row, SectionInput};
use serde_json::Value;

/// The cudarc version the criterion benchmark is built with (`Cargo.toml` pins it).
pub const CUDARC: &str = "cudarc 0.19.10";

fn better(unit: &str) -> Better {
    if unit == "GB/s" { Better::Higher } else { Better::Lower }
}

fn unit_of(unit: &str) -> &'static str {
    match unit {
        "GB/s" => "GB/s",
        _ => "us",
    }
}

fn measured(value: Option<f64>, version: &str) -> Peer {
    match value {
        Some(value) => Peer::Measured { value, version: version.to_string() },
        None => Peer::Missing("not measured: no value in report/results.json".into()),
    }
}

pub fn rows(input: &SectionInput) -> Vec<Row> {
    let file = "report/results.json";
    let text = input.read(file);
    let Ok(report) = serde_json::from_str::<Value>(&text) else {
        return vec![input.row(
            "paired".into(),
            "the wrapper report (raw CUDA C++, cudarc, same-process pairs)".into(),
            "us",
            Better::Lower,
            None,
            "raw CUDA C++",
            Peer::Missing(input.missing("report/results.json")),
            file,
        )];
    };
    let list = |k: &str| report.get(k).and_then(Value::as_array).cloned().unwrap_or_default();
    let text_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    let mut rows = Vec::new();
    let details: Vec<Value> = list("rows");
    for p in list("paired") {
        let key = text_of(&p, "key");
        let detail =
            details.iter().find(|r| text_of(r, "key") == key).map(|r| text_of(r, "raw_detail")).unwrap_or_default();
        rows.push(input.row(
            format!("paired_{key}"),
            format!("{key} ({detail}): µs per operation, cuda-mem and the reference's C++ interleaved in one process"),
            "us",
            Better::Lower,
            num(&p, "ours_us"),
            "raw CUDA C++ (same process)",
            measured(num(&p, "base_us"), "same process"),
            file,
        ));
    }
    for r in details.iter().filter(|r| num(r, "cudarc").is_some()) {
        let (key, unit) = (text_of(r, "key"), text_of(r, "unit"));
        rows.push(input.row(
            format!("cudarc_{key}"),
            format!("{key} ({}), criterion, {unit}", text_of(r, "raw_detail")),
            unit_of(&unit),
            better(&unit),
            num(r, "cuda_mem"),
            "cudarc (driver API)",
            measured(num(r, "cudarc"), &format!("{CUDARC} (same executable)")),
            file,
        ));
    }
    for f in list("features") {
        let (key, unit) = (text_of(&f, "key"), text_of(&f, "unit"));
        rows.push(input.row(
            format!("feature_{key}"),
            format!("{key} against {}, {unit}", text_of(&f, "baseline")),
            unit_of(&unit),
            better(&unit),
            num(&f, "cuda_mem"),
            &format!("baseline row {}", text_of(&f, "baseline")),
            measured(num(&f, "baseline_value"), "same run"),
            file,
        ));
    }
    rows
}
