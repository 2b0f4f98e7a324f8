//! The `report` binary's flags and its one job: read the inputs, write the outputs.

use crate::inputs;
use crate::{features, join, paired, plots, render};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Usage text of `report`.
pub const USAGE: &str = "\
usage: report --date YYYY-MM-DD --raw RAW.jsonl --criterion DIR [--raw-rerun RAW2.jsonl]
              [--paired PAIRED.jsonl] [--paired-api PROFILED.jsonl] --out DIR

Joins raw_reference's rows with criterion's samples (DIR: criterion's output folder) and writes
DIR/report.md, DIR/results.json, DIR/latency.svg and DIR/bandwidth.svg. --raw-rerun: a second run
of raw_reference, each row's noise floor. --paired: the `paired` benchmark's output, the ratios the
targets are judged by. --paired-api: `paired --api-time`'s output, time inside and outside CUDA
calls. `cargo xtask bench` and the bundle's `run --bench` pass today's date.";

/// Inputs and outputs of one report: the flags of [`USAGE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub date: String,
    pub raw: PathBuf,
    pub criterion: PathBuf,
    pub raw_rerun: Option<PathBuf>,
    pub paired: Option<PathBuf>,
    pub paired_api: Option<PathBuf>,
    pub out: PathBuf,
}

/// Parses the arguments after the program name; `Ok(None)` asks for the usage.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
    let mut args = args.into_iter();
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--date" | "--raw" | "--criterion" | "--raw-rerun" | "--paired" | "--paired-api" | "--out" => {
                let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
                values.insert(flag, value);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let required = |flag: &str| values.get(flag).cloned().ok_or_else(|| format!("{flag} is required"));
    let optional = |flag: &str| values.get(flag).map(PathBuf::from);
    Ok(Some(Options {
        date: required("--date")?,
        raw: required("--raw")?.into(),
        criterion: required("--criterion")?.into(),
        out: required("--out")?.into(),
        raw_rerun: optional("--raw-rerun"),
        paired: optional("--paired"),
        paired_api: optional("--paired-api"),
    }))
}

/// `parse` of the file at `path`, or of nothing when there is no path.
fn parsed<T>(path: Option<&Path>, parse: fn(&str) -> Result<T, String>) -> Result<T, String> {
    parse(&path.map(inputs::read).transpose()?.unwrap_or_default())
        .map_err(|e| format!("{}: {e}", path.unwrap_or(Path::new("")).display()))
}

/// Reads the inputs and writes report.md, results.json and the plots; returns report.md's path.
pub fn run(options: &Options) -> Result<PathBuf, String> {
    let raw = parsed(Some(&options.raw), inputs::parse_raw)?;
    let rerun = options.raw_rerun.as_deref().map(|path| parsed(Some(path), inputs::parse_raw)).transpose()?;
    let criterion = inputs::read_criterion(&options.criterion)?;
    if raw.rows.is_empty() && criterion.is_empty() {
        return Err(format!(
            "nothing to report: {} has no rows and {} no samples",
            options.raw.display(),
            options.criterion.display()
        ));
    }
    let paired = parsed(options.paired.as_deref(), paired::parse)?;
    let report = render::Report {
        date: options.date.clone(),
        rows: join::join(&raw, rerun.as_ref(), &criterion, &paired),
        features: features::evaluate(&raw, &criterion),
        with_rerun: rerun.is_some(),
        env: raw.env,
        paired,
        profiled: parsed(options.paired_api.as_deref(), paired::parse)?,
    };
    let out = &options.out;
    std::fs::create_dir_all(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let json = serde_json::to_string_pretty(&render::json(&report)).map_err(|e| e.to_string())?;
    for (name, text) in [
        ("latency.svg", plots::latency_svg(&report.rows)?),
        ("bandwidth.svg", plots::bandwidth_svg(&report.rows)?),
        ("results.json", json),
        ("report.md", render::markdown(&report)),
    ] {
        std::fs::write(out.join(name), text).map_err(|e| format!("writing {}: {e}", out.join(name).display()))?;
    }
    Ok(out.join("report.md"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::feature_row;
    use crate::rows::{Row, Unit, row};
    use serde_json::Value;

    #[test]
    fn flags_parse_and_report_what_is_missing() {
        let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let options = parse(args(&["--date", "d", "--raw", "r", "--criterion", "c", "--out", "o", "--paired", "p"]));
        let options = options.unwrap().unwrap();
        assert_eq!((options.raw_rerun, options.paired), (None, Some(PathBuf::from("p"))));
        assert_eq!(parse(args(&["--date", "d", "--raw", "r"])).unwrap_err(), "--criterion is required");
        assert_eq!(parse(args(&["--raw"])).unwrap_err(), "--raw needs a value");
        assert!(parse(args(&["--cudarc", "c"])).unwrap_err().contains("unknown argument"));
        assert_eq!(parse(args(&["-h"])), Ok(None));
    }

    macro_rules! committed {
        ($file:literal) => {
            include_str!(concat!("../../docs/bench/2026-11-29-h200/", $file))
        };
    }

    /// One criterion sample of one batch whose figure is `value`.
    fn sample(criterion: &Path, group: &str, row: &Row, value: f64) {
        let seconds = match row.unit {
            Unit::Micros => value / 1e6,
            Unit::GigabytesPerSecond => row.bytes as f64 / value / 1e9,
        };
        let dir = criterion.join(group).join(row.key).join("new");
        std::fs::create_dir_all(&dir).unwrap();
        let ns = seconds * 1e9 * f64::from(row.k);
        std::fs::write(dir.join("sample.json"), format!("{{\"iters\":[1.0],\"times\":[{ns:?}]}}")).unwrap();
    }

    /// Equal, numbers within 1e-9 relative (the samples above went through a division).
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
            }
            (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y)),
            (Value::Object(x), Value::Object(y)) => x.keys().eq(y.keys()) && x.iter().all(|(k, v)| same(v, &y[k])),
            _ => a == b,
        }
    }

    /// The committed report of 2026-11-29 comes out again from its committed inputs and the
    /// criterion figures its results.json kept: the same rows, results.json and plots. Its claims
    /// section judged an outside document and is no longer the report's (docs/seed-claims.md).
    #[test]
    fn the_committed_report_renders_again() {
        let dir = std::env::temp_dir().join(format!("cuda-mem-bench-report-{}", std::process::id()));
        let criterion = dir.join("criterion");
        let mut results: Value = serde_json::from_str(committed!("results.json")).unwrap();
        for r in results["rows"].as_array().unwrap() {
            let row = row(r["key"].as_str().unwrap()).unwrap();
            for (field, group) in [("cuda_mem", ""), ("cudarc", "cudarc-"), ("ffi", "ffi-")] {
                if let Some(value) = r[field].as_f64() {
                    sample(&criterion, &format!("{group}{}", row.section.name()), row, value);
                }
            }
        }
        for f in results["features"].as_array().unwrap() {
            let row = feature_row(f["key"].as_str().unwrap()).unwrap();
            sample(&criterion, "features", row, f["cuda_mem"].as_f64().unwrap());
        }
        let inputs = [
            ("raw.jsonl", committed!("raw.jsonl")),
            ("raw-rerun.jsonl", committed!("raw-rerun.jsonl")),
            ("paired.jsonl", committed!("paired.jsonl")),
            ("paired-api.jsonl", committed!("paired-api.jsonl")),
        ];
        for (name, text) in inputs {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let options = Options {
            date: "2026-11-29".into(),
            raw: dir.join("raw.jsonl"),
            criterion,
            raw_rerun: Some(dir.join("raw-rerun.jsonl")),
            paired: Some(dir.join("paired.jsonl")),
            paired_api: Some(dir.join("paired-api.jsonl")),
            out: dir.join("report"),
        };
        let markdown = std::fs::read_to_string(run(&options).unwrap()).unwrap();
        let committed = committed!("report.md");
        let claims = committed.find("## Claims checked").unwrap()..committed.find("\n## Plots").unwrap();
        let expected = [&committed[..claims.start], &committed[claims.end..]].concat();
        for (n, (line, want)) in markdown.lines().zip(expected.lines()).enumerate() {
            assert_eq!(line, want, "report.md line {}", n + 1);
        }
        assert_eq!(markdown, expected);
        let written = std::fs::read_to_string(dir.join("report/results.json")).unwrap();
        let map = results.as_object_mut().unwrap();
        map.remove("claims");
        map.remove("claim_rows");
        assert!(same(&serde_json::from_str(&written).unwrap(), &results), "results.json differs");
        // plotters' histogram keeps its bars in a HashMap: their order in the SVG varies.
        let svg = |text: &str| text.lines().map(str::to_string).collect::<std::collections::BTreeSet<_>>();
        for (name, text) in [("latency.svg", committed!("latency.svg")), ("bandwidth.svg", committed!("bandwidth.svg"))]
        {
            assert!(svg(&inputs::read(&dir.join("report").join(name)).unwrap()) == svg(text), "{name} differs");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
