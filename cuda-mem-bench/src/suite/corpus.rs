//! The `workloads` and `training` sections: the workload corpus replayed by cuda-mem's
//! `DeviceCache` (the `workloads` example) and by the peers' replayers (`workloads/rmm_replay`,
//! `workloads/torch_replay.py`, native and with expandable segments), and the PyTorch training
//! loop through each allocator (`workloads/run_training.sh`), whose recorded trace the training
//! section replays the same way.

use super::{Better, Peer, Row, SectionInput, json_lines};
use crate::workload_table::{self, Replay};
use serde_json::Value;

/// The cuda-mem allocator each figure is taken from (the cache with its default parameters).
pub const OURS: &str = "cuda_mem_cache_default";

/// The replay peers: allocator name, words, file. The first is the headline row's peer.
pub const REPLAY_PEERS: [(&str, &str, &str); 7] = [
    ("torch_native", "PyTorch CUDACachingAllocator", "torch.jsonl"),
    ("torch_expandable", "PyTorch, expandable segments", "torch_exp.jsonl"),
    ("rmm_pool", "RMM pool", "rmm.jsonl"),
    ("rmm_binning", "RMM binning", "rmm.jsonl"),
    ("rmm_arena", "RMM arena", "rmm.jsonl"),
    ("cuda_async", "RMM cuda_async", "rmm.jsonl"),
    ("cuda_pool_raw", "cudaMallocFromPoolAsync (raw)", "rmm.jsonl"),
];

/// The `version` field of the first row of `allocator` in `text`.
fn version_of(text: &str, allocator: &str) -> Option<String> {
    json_lines(text)
        .find(|v| v.get("allocator").and_then(Value::as_str) == Some(allocator))?
        .get("version")?
        .as_str()
        .map(str::to_string)
}

/// The figures of one replay row: (suffix, words, unit, value).
fn figures(r: Option<&Replay>) -> [(&'static str, &'static str, &'static str, Option<f64>); 3] {
    [
        ("ns_per_op", "ns per operation (second pass)", "ns", r.map(|r| r.ns_per_op)),
        ("reserved_over_live", "peak reserved / peak live", "x", r.map(|r| r.reserved_over_live)),
        ("misses", "misses in the second pass", "count", r.and_then(|r| r.misses.map(|m| m as f64))),
    ]
}

pub fn replay_rows(input: &SectionInput) -> Vec<Row> {
    let files = ["cuda_mem.jsonl", "torch.jsonl", "torch_exp.jsonl", "rmm.jsonl"];
    let texts: Vec<(&str, String)> = files.iter().map(|f| (*f, input.read(f))).collect();
    let text_of = |file: &str| texts.iter().find(|(f, _)| *f == file).map_or("", |(_, t)| t.as_str());
    let all: Vec<Replay> = texts.iter().flat_map(|(_, t)| workload_table::replays(t)).collect();
    let mut workloads: Vec<&str> = Vec::new();
    for r in all.iter().filter(|r| r.allocator == OURS) {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let find =
        |workload: &str, allocator: &str| all.iter().find(|r| r.workload == workload && r.allocator == allocator);
    let mut rows = Vec::new();
    for workload in workloads {
        let ours = figures(find(workload, OURS));
        for (i, (allocator, words, file)) in REPLAY_PEERS.into_iter().enumerate() {
            let theirs = figures(find(workload, allocator));
            for ((suffix, what, unit, value), (_, _, _, peer_value)) in ours.iter().zip(theirs) {
                let key = match i {
                    0 => format!("workload_{workload}_{suffix}"),
                    _ => format!("workload_{workload}_{suffix}_vs_{allocator}"),
                };
                let peer = match peer_value {
                    Some(v) => Peer::Measured {
                        value: v,
                        version: version_of(text_of(file), allocator).unwrap_or_else(|| "version not printed".into()),
                    },
                    None => Peer::Missing(input.missing(file)),
                };
                rows.push(input.row(
                    key,
                    format!("workload {workload}: {what}, DeviceCache (default parameters)"),
                    unit,
                    Better::Lower,
                    *value,
                    words,
                    peer,
                    &format!("cuda_mem.jsonl, {file}"),
                ));
            }
        }
    }
    rows
}

pub fn training_rows(input: &SectionInput) -> Vec<Row> {
    let text = input.read("training.jsonl");
    let runs = workload_table::training_runs(&text);
    let torch_version = json_lines(&text).find_map(|v| v.get("torch")?.as_str().map(|t| format!("torch {t}")));
    let run = |allocator: &str| runs.iter().find(|r| r.allocator == allocator);
    let ours = runs.iter().find(|r| r.allocator.starts_with("cuda_mem"));
    let figures = |r: Option<&workload_table::TrainingRun>| {
        [
            (
                "step_ms",
                "step time (median over its processes of each one's median), ms",
                "ms",
                r.map(|r| r.step_ms_median),
            ),
            (
                "reserved_over_allocated",
                "peak reserved / peak allocated",
                "x",
                r.map(|r| r.peak_reserved as f64 / r.peak_allocated as f64),
            ),
        ]
    };
    let mut rows = Vec::new();
    for (i, (allocator, words)) in
        [("torch_native", "PyTorch CUDACachingAllocator"), ("torch_expandable", "PyTorch, expandable segments")]
            .into_iter()
            .enumerate()
    {
        for ((suffix, what, unit, value), (_, _, _, theirs)) in figures(ours).into_iter().zip(figures(run(allocator))) {
            let key = match i {
                0 => format!("training_loop_{suffix}"),
                _ => format!("training_loop_{suffix}_vs_{allocator}"),
            };
            let peer = match theirs {
                Some(v) => Peer::Measured {
                    value: v,
                    version: torch_version.clone().unwrap_or_else(|| "version not printed".into()),
                },
                None => Peer::Missing(input.missing("training.jsonl")),
            };
            rows.push(input.row(
                key,
                format!("PyTorch training loop (GPT-like, variable shapes): {what}, cuda-mem's allocator"),
                unit,
                Better::Lower,
                value,
                words,
                peer,
                "training.jsonl",
            ));
        }
    }
    // The loop's recorded trace, replayed by every allocator in the same section.
    rows.extend(replay_rows(input));
    rows
}
