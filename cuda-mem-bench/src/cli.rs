//! The `report` binary's flags and its one job: read the inputs, write the outputs.

use crate::inputs::{self, Samples};
use crate::rows::{Peer, ROWS, group_id};
use crate::{claims, join, paired, plots, render};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Usage text of `report`.
pub const USAGE: &str = "\
usage: report --raw RAW.jsonl --criterion DIR [--cudarc DIR] [--raw-rerun RAW2.jsonl]
              [--paired PAIRED.jsonl] [--paired-api PROFILED.jsonl] --out DIR [--date YYYY-MM-DD]
       report --raw-reference-path

Joins the raw CUDA C++ rows (raw_reference's output) with criterion's samples (DIR is criterion's
output folder, $CRITERION_HOME or target/criterion: the cuda-mem rows are its groups alloc,
bandwidth, kernel, managed, the direct-FFI diagnostic rows ffi-alloc; cudarc's are cudarc-alloc,
...; --cudarc may name the same folder) and
writes DIR/report.md, DIR/results.json, DIR/latency.svg and DIR/bandwidth.svg. --raw-rerun names
a second run of raw_reference (e.g. after the benchmark): its ratio to the first is shown as each
row's noise floor. --paired names the output of the `paired` benchmark (cuda-mem and raw C++
interleaved in one process): its ratios are the ones the targets are judged by where present.
--paired-api names the output of `paired --api-time` (the same, profiled through CUPTI): it adds
a section that splits each side's time into inside and outside CUDA calls.

--raw-reference-path prints where the build put the raw_reference executable.";

/// Parsed flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Write the report.
    Report(Options),
    /// Print the raw_reference path.
    RawReferencePath,
    /// Print the usage.
    Help,
}

/// Inputs and outputs of one report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The C++ program's output.
    pub raw: PathBuf,
    /// Criterion's folder with the cuda-mem groups.
    pub criterion: PathBuf,
    /// Criterion's folder with the cudarc groups.
    pub cudarc: Option<PathBuf>,
    /// A second run of the C++ program, for the noise floor.
    pub raw_rerun: Option<PathBuf>,
    /// The `paired` benchmark's output.
    pub paired: Option<PathBuf>,
    /// The output of `paired --api-time`.
    pub paired_api: Option<PathBuf>,
    /// Where to write.
    pub out: PathBuf,
    /// Report date; today (UTC) when absent.
    pub date: Option<String>,
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut args = args.into_iter();
    let (mut raw, mut criterion, mut cudarc, mut out, mut date, mut rerun, mut paired, mut paired_api) =
        (None, None, None, None, None, None, None, None);
    while let Some(flag) = args.next() {
        let slot = match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--raw-reference-path" => return Ok(Command::RawReferencePath),
            "--raw" => &mut raw,
            "--criterion" => &mut criterion,
            "--cudarc" => &mut cudarc,
            "--raw-rerun" => &mut rerun,
            "--paired" => &mut paired,
            "--paired-api" => &mut paired_api,
            "--out" => &mut out,
            "--date" => &mut date,
            other => return Err(format!("unknown argument {other:?}")),
        };
        *slot = Some(args.next().ok_or_else(|| format!("{flag} needs a value"))?);
    }
    let missing = |name: &str| format!("{name} is required");
    Ok(Command::Report(Options {
        raw: raw.ok_or_else(|| missing("--raw"))?.into(),
        criterion: criterion.ok_or_else(|| missing("--criterion"))?.into(),
        cudarc: cudarc.map(PathBuf::from),
        raw_rerun: rerun.map(PathBuf::from),
        paired: paired.map(PathBuf::from),
        paired_api: paired_api.map(PathBuf::from),
        out: out.ok_or_else(|| missing("--out"))?.into(),
        date,
    }))
}

fn load_peer(dir: &Path, peer: Peer) -> Result<BTreeMap<String, Samples>, String> {
    let mut found = BTreeMap::new();
    for row in ROWS {
        if let Some(samples) = inputs::read_samples(dir, &group_id(row.section, peer), row.key)? {
            found.insert(row.key.to_string(), samples);
        }
    }
    Ok(found)
}

fn read_raw(path: &Path) -> Result<inputs::RawRun, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    inputs::parse_raw(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn write(path: &Path, contents: &str) -> Result<(), String> {
    std::fs::write(path, contents).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Reads the inputs and writes report.md, results.json and the plots; returns report.md's path.
pub fn run(options: &Options) -> Result<PathBuf, String> {
    let raw = read_raw(&options.raw)?;
    let ours = load_peer(&options.criterion, Peer::CudaMem)?;
    let cudarc = match &options.cudarc {
        Some(dir) => load_peer(dir, Peer::Cudarc)?,
        None => BTreeMap::new(),
    };
    if raw.rows.is_empty() && ours.is_empty() {
        return Err(format!(
            "nothing to report: {} has no rows and {} has no cuda-mem samples",
            options.raw.display(),
            options.criterion.display()
        ));
    }
    let mut rows = join::join(&raw, &ours, &cudarc, crate::BENCH_HAS_KERNEL_ROWS);
    join::add_ffi(&mut rows, &load_peer(&options.criterion, Peer::Ffi)?);
    if let Some(rerun) = &options.raw_rerun {
        join::add_rerun(&mut rows, &read_raw(rerun)?);
    }
    let read_paired = |file: &Option<PathBuf>| match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            paired::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
        }
        None => Ok(BTreeMap::new()),
    };
    let paired = read_paired(&options.paired)?;
    let profiled = read_paired(&options.paired_api)?;
    join::add_paired(&mut rows, &paired);
    let claims = claims::check(&raw);
    std::fs::create_dir_all(&options.out).map_err(|e| format!("creating {}: {e}", options.out.display()))?;
    let mut plot_files = Vec::new();
    for (name, svg) in [("latency.svg", plots::latency_svg(&rows)?), ("bandwidth.svg", plots::bandwidth_svg(&rows)?)] {
        write(&options.out.join(name), &svg)?;
        plot_files.push(name.to_string());
    }
    let report = render::Report {
        date: options.date.clone().unwrap_or_else(crate::date::today),
        env: raw.env.as_ref(),
        rows: &rows,
        claims: &claims,
        claim_rows: render::claim_rows(&raw),
        with_cudarc: options.cudarc.is_some(),
        with_rerun: options.raw_rerun.is_some(),
        plots: plot_files,
    };
    let feature_results = crate::features::evaluate(&raw, &crate::features::load(&options.criterion)?);
    let mut json = render::json(&report);
    json["features"] = crate::features::json(&feature_results);
    json["paired"] = paired::json(&paired);
    json["paired_api"] = paired::json(&profiled);
    let json = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    write(&options.out.join("results.json"), &json)?;
    let md_path = options.out.join("report.md");
    let mut markdown = render::markdown(&report);
    let mut features_md = crate::features::markdown(&feature_results);
    if !paired.is_empty() {
        features_md.push_str(&paired::markdown(&paired));
    }
    if profiled.values().any(|r| r.api.is_some()) {
        features_md.push_str(&paired::api_markdown(&profiled));
    }
    match markdown.find("## Claims checked") {
        Some(at) => markdown.insert_str(at, &features_md),
        None => markdown.push_str(&features_md),
    }
    write(&md_path, &markdown)?;
    Ok(md_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_parse_and_report_what_is_missing() {
        let cmd = parse(args(&["--raw", "r.jsonl", "--criterion", "c", "--out", "o", "--cudarc", "c"])).unwrap();
        let Command::Report(o) = cmd else { panic!("expected a report") };
        assert_eq!((o.raw, o.cudarc, o.date), (PathBuf::from("r.jsonl"), Some(PathBuf::from("c")), None));
        assert_eq!(parse(args(&["--raw", "r"])).unwrap_err(), "--criterion is required");
        assert_eq!(parse(args(&["--raw"])).unwrap_err(), "--raw needs a value");
        assert!(parse(args(&["--bogus"])).unwrap_err().contains("unknown argument"));
        assert_eq!(parse(args(&["--raw-reference-path"])).unwrap(), Command::RawReferencePath);
        assert_eq!(parse(args(&["-h"])).unwrap(), Command::Help);
    }

    #[test]
    fn end_to_end_on_synthetic_inputs() {
        let dir = std::env::temp_dir().join(format!("cuda-mem-bench-cli-{}", std::process::id()));
        let criterion = dir.join("criterion");
        let sample = |group: &str, key: &str, ns: f64| {
            let path = inputs::sample_path(&criterion, group, key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(
                path,
                format!("{{\"sampling_mode\":\"Flat\",\"iters\":[1.0,1.0,1.0],\"times\":[{ns},{ns},{ns}]}}"),
            )
            .unwrap();
        };
        sample("alloc", "malloc_4k", 12.0e6);
        sample("cudarc-alloc", "malloc_host_4k", 40.0e6);
        std::fs::create_dir_all(&dir).unwrap();
        let raw = dir.join("raw.jsonl");
        std::fs::write(
            &raw,
            "{\"key\":\"env\",\"device\":\"NVIDIA H200\",\"driver\":\"13.0\",\"runtime\":\"13.0\",\"cc\":\"9.0\"}\n\
             {\"key\":\"malloc_4k\",\"value\":60,\"unit\":\"us\",\"detail\":\"d\",\"k\":200,\"samples\":30}\n\
             {\"key\":\"malloc_host_4k\",\"value\":780,\"unit\":\"us\",\"detail\":\"d\",\"k\":50,\"samples\":20}\n",
        )
        .unwrap();
        // In the same process malloc_4k was within 1.5% of raw C++.
        std::fs::write(
            dir.join("paired.jsonl"),
            "{\"key\":\"malloc_4k\",\"baseline\":\"raw C++\",\"base_us\":60,\"ours_us\":60.9,\"k\":200,\"samples\":30}\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("paired-api.jsonl"),
            "{\"key\":\"malloc_4k\",\"baseline\":\"raw C++\",\"base_us\":61,\"ours_us\":62,\"k\":200,\"samples\":30,\
             \"base_api_us\":59,\"ours_api_us\":59.9,\"base_api_calls\":2,\"ours_api_calls\":2}\n",
        )
        .unwrap();
        let options = Options {
            raw,
            criterion: criterion.clone(),
            cudarc: Some(criterion),
            raw_rerun: Some(dir.join("raw.jsonl")),
            paired: Some(dir.join("paired.jsonl")),
            paired_api: Some(dir.join("paired-api.jsonl")),
            out: dir.join("out"),
            date: Some("2026-11-29".into()),
        };
        let md_path = run(&options).unwrap();
        let md = std::fs::read_to_string(md_path).unwrap();
        assert!(md.contains("| `malloc_4k` | 60.0 | 60.0 | 1.000 | — | — | 1.000 | 1.015 |"), "{md}");
        assert!(md.contains("## Same process, interleaved"));
        // 2 µs outside the calls on the raw side, 2.1 on ours: +100 ns.
        assert!(
            md.contains("| `malloc_4k` | raw C++ | 2.00 / 2.00 | 59.000 / 59.900 | 2.000 / 2.100 | +100 | 1.016 |"),
            "{md}"
        );
        assert!(md.contains("| `malloc_host_4k` | 780 | — | — | 800 | 1.026 | 1.000 | — |"), "{md}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("out/results.json")).unwrap()).unwrap();
        assert_eq!(json["date"], "2026-11-29");
        assert_eq!(json["paired"][0]["key"], "malloc_4k");
        assert_eq!(json["paired_api"][0]["api"]["ours_calls"], 2.0);
        assert!(std::fs::read_to_string(dir.join("out/latency.svg")).unwrap().contains("<svg"));
        assert!(dir.join("out/bandwidth.svg").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
