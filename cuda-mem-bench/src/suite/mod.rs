//! The main job's report: every section of `./run --bench OUT` (each in its own folder under
//! `OUT`, written by the bundle's run script), with the peers measured in the same run, joined
//! into `report.md`, `results.json` (one row per figure, under a stable key) and SVG plots.
//!
//! | section | raw files (folder `OUT/<section>/`) | parsed by |
//! |---|---|---|
//! | `paired` | `report/results.json` of the wrapper report (`report` binary) | [`paired`] |
//! | `cache`, `threads` | `cache_pairs.jsonl`, `torch.jsonl`, `torch_mt.jsonl`, `rmm.jsonl` | [`pairs`] |
//! | `workloads`, `training` | `cuda_mem.jsonl`, `rmm.jsonl`, `torch*.jsonl`; `training.jsonl` | [`corpus`] |
//! | `graphs`, `async`, `staged`, `snapshot`, `nccl` | the example's output (`*.txt`, `*.jsonl`) | [`programs`] |
//! | `sleep` | `sleep_wake.jsonl`, `torch_sleep_wake.jsonl` | [`sleep`] |
//!
//! Every section folder may hold `section.json` (`{"seconds":…,"rc":…}`, written by the run
//! script) and, per peer that could not run, `<peer>.missing` (one line: why). A peer's rows then
//! say so and the report still builds.
//!
//! Ratios follow the wrapper report's convention: cuda-mem's cost over the peer's (time over
//! time, or the peer's rate over cuda-mem's), so below 1 is cuda-mem ahead; `speedup` in
//! `results.json` is its inverse.

pub mod corpus;
pub mod markdown;
pub mod paired;
pub mod pairs;
pub mod programs;
pub mod same_call;
pub mod sleep;
pub mod svg;

use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The sections, in the order the run script runs them and the report lists them.
pub const SECTIONS: [&str; 11] =
    ["paired", "cache", "threads", "workloads", "training", "graphs", "async", "staged", "snapshot", "nccl", "sleep"];

/// What `results.json` names its format: the figure check tells this report from older ones by it.
pub const FORMAT: &str = "cuda-mem-bench-suite/1";

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
}

/// One figure of the report: cuda-mem's value beside one peer's, measured in the same run.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Stable across reports: what is measured, with the peer when a figure has more than one.
    pub key: String,
    pub section: &'static str,
    /// What the row measures, in words.
    pub what: String,
    /// The unit of both values (`us`, `ns`, `ms`, `GB/s`, `M/s`, `requests/s`, `x`).
    pub unit: &'static str,
    pub better: Better,
    pub cuda_mem: Option<f64>,
    pub peer: String,
    pub peer_value: Option<f64>,
    /// The peer's version, or where it ran (`same process`).
    pub peer_version: String,
    /// `measured`, or why a value is missing.
    pub status: String,
    /// The raw file(s) the row comes from, relative to the run's folder.
    pub source: String,
}

impl Row {
    /// cuda-mem's cost over the peer's: below 1 is cuda-mem ahead.
    pub fn ratio(&self) -> Option<f64> {
        let (ours, peer) = (self.cuda_mem?, self.peer_value?);
        let ratio = match self.better {
            Better::Lower => ours / peer,
            Better::Higher => peer / ours,
        };
        ratio.is_finite().then_some(ratio)
    }

    fn to_json(&self) -> Value {
        json!({
            "key": self.key,
            "section": self.section,
            "what": self.what,
            "unit": self.unit,
            "better": if self.better == Better::Lower { "lower" } else { "higher" },
            "cuda_mem": self.cuda_mem,
            "peer": self.peer,
            "peer_value": self.peer_value,
            "ratio": self.ratio(),
            // The same comparison the other way round (how many times cuda-mem is ahead), for
            // docs that say "N× faster".
            "speedup": self.ratio().map(|r| 1.0 / r),
            "peer_version": self.peer_version,
            "status": self.status,
            "source": self.source,
        })
    }
}

/// A peer's measurement as a section reads it: its value and version, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub enum Peer {
    Measured {
        value: f64,
        version: String,
    },
    /// Why the peer has no value in this run (`not measured: …`).
    Missing(String),
    /// No peer has this operation: the row stands alone.
    NotApplicable(String),
}

/// Builds rows for one section with the section's name, folder and the reasons its peers are
/// missing.
#[derive(Debug)]
pub struct SectionInput<'a> {
    pub name: &'static str,
    pub dir: &'a Path,
}

impl SectionInput<'_> {
    /// The text of a raw file, or empty when the section did not write it.
    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// Why a peer did not run (`<peer>.missing`), or that it left no rows.
    pub fn missing(&self, peer_file: &str) -> String {
        let stem = peer_file.split('.').next().unwrap_or(peer_file);
        // The run script logs each program's exit code last in `<stem>.log`.
        let log = std::fs::read_to_string(self.dir.join(format!("{stem}.log"))).unwrap_or_default();
        let exit = log.lines().filter_map(|l| l.strip_prefix("== exit code ")).next_back().filter(|c| *c != "0");
        match std::fs::read_to_string(self.dir.join(format!("{stem}.missing"))) {
            Ok(why) => format!("not measured: {}", why.trim()),
            Err(_) if exit.is_some() => {
                format!("not measured: {stem} exited {} (see {stem}.log)", exit.unwrap_or_default())
            }
            Err(_) if self.dir.join(peer_file).is_file() => format!("not measured: no such row in {peer_file}"),
            Err(_) => format!("not measured: no {peer_file} in this run"),
        }
    }

    /// A row of cuda-mem against one peer.
    #[allow(clippy::too_many_arguments)]
    pub fn row(
        &self,
        key: String,
        what: String,
        unit: &'static str,
        better: Better,
        ours: Option<f64>,
        peer: &str,
        theirs: Peer,
        source: &str,
    ) -> Row {
        let (peer_value, peer_version, status) = match theirs {
            Peer::Measured { value, version } => (Some(value), version, "measured".to_string()),
            Peer::Missing(why) => (None, String::new(), why),
            Peer::NotApplicable(why) => (None, String::new(), format!("measured; no peer: {why}")),
        };
        let status = match ours {
            None => self.missing(source.split(", ").next().unwrap_or(source)),
            Some(_) => status,
        };
        Row {
            key,
            section: self.name,
            what,
            unit,
            better,
            cuda_mem: ours,
            peer: peer.to_string(),
            peer_value,
            peer_version,
            status,
            source: source.to_string(),
        }
    }
}

/// JSON objects of a JSON-lines text (other lines left out).
pub fn json_lines(text: &str) -> impl Iterator<Item = Value> + '_ {
    text.lines().filter(|l| l.trim_start().starts_with('{')).filter_map(|l| serde_json::from_str(l).ok())
}

/// How a section ran: its folder's `section.json`, if the run script wrote one.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    pub section: &'static str,
    pub seconds: Option<f64>,
    pub rc: Option<i64>,
    pub started: String,
    /// The commit of the bundle that ran it.
    pub commit: String,
}

/// The whole report.
#[derive(Debug, Clone)]
pub struct Suite {
    pub date: String,
    pub device: String,
    pub ran: Vec<Ran>,
    pub rows: Vec<Row>,
}

/// Reads every section folder present under `raw`.
pub fn collect(raw: &Path, date: &str) -> Suite {
    let mut ran = Vec::new();
    let mut rows = Vec::new();
    let mut device = String::new();
    for name in SECTIONS {
        let dir = raw.join(name);
        if !dir.is_dir() {
            continue;
        }
        let input = SectionInput { name, dir: &dir };
        let meta =
            std::fs::read_to_string(dir.join("section.json")).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok());
        let field = |k: &str| meta.as_ref().and_then(|m| m.get(k)).cloned().unwrap_or(Value::Null);
        if device.is_empty() {
            device = field("gpu").as_str().unwrap_or_default().to_string();
        }
        ran.push(Ran {
            section: name,
            seconds: field("seconds").as_f64(),
            rc: field("rc").as_i64(),
            started: field("started").as_str().unwrap_or_default().to_string(),
            commit: field("commit").as_str().unwrap_or_default().to_string(),
        });
        rows.extend(match name {
            "paired" => paired::rows(&input),
            "cache" => pairs::cache_rows(&input),
            "threads" => pairs::thread_rows(&input),
            "workloads" => corpus::replay_rows(&input),
            "training" => corpus::training_rows(&input),
            "graphs" => programs::graph_rows(&input),
            "async" => programs::async_rows(&input),
            "staged" => programs::staged_rows(&input),
            "snapshot" => programs::snapshot_rows(&input),
            "nccl" => programs::nccl_rows(&input),
            "sleep" => sleep::sleep_rows(&input),
            _ => unreachable!("section {name}"),
        });
    }
    Suite { date: date.to_string(), device, ran, rows }
}

impl Suite {
    /// The bundles' commits, each once, in section order (sections may come from several calls).
    pub fn commits(&self) -> Vec<&str> {
        let mut commits: Vec<&str> = Vec::new();
        for ran in self.ran.iter().filter(|r| !r.commit.is_empty()) {
            if !commits.contains(&ran.commit.as_str()) {
                commits.push(&ran.commit);
            }
        }
        commits
    }

    /// `results.json`: the format, the date, how each section ran, one object per row.
    pub fn results_json(&self) -> Value {
        json!({
            "format": FORMAT,
            "date": self.date,
            "device": self.device,
            "commit": self.commits().join(", "),
            "ratio_convention": "cuda-mem's cost over the peer's (time / time, or the peer's rate / cuda-mem's): below 1 is cuda-mem ahead",
            "sections": self.ran.iter().map(|r| json!({"section": r.section, "started": r.started, "seconds": r.seconds, "rc": r.rc, "commit": r.commit})).collect::<Vec<_>>(),
            "rows": self.rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        })
    }

    /// Writes `report.md`, `results.json` and the plots into `out`; returns the files written.
    pub fn write(&self, out: &Path) -> std::io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(out)?;
        let mut written = Vec::new();
        let mut put = |name: &str, text: String| -> std::io::Result<()> {
            let path = out.join(name);
            std::fs::write(&path, text)?;
            written.push(path);
            Ok(())
        };
        let json = serde_json::to_string_pretty(&self.results_json()).expect("rows serialize");
        put("results.json", json + "\n")?;
        let plots = svg::plots(&self.rows);
        for (name, text) in &plots {
            put(name, text.clone())?;
        }
        let names: Vec<&str> = plots.iter().map(|(n, _)| n.as_str()).collect();
        put("report.md", markdown::report(self, &names))?;
        Ok(written)
    }
}
