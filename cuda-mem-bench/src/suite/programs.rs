//! The sections whose programs print lines for people: `graphs` (`decode_graph`), `async`
//! (`async_server`, `loader`), `staged` (`staged_tuning`), `snapshot` (`snapshot_dump`), and
//! `nccl` (`allreduce`'s JSON lines beside `docs/reference/torch_allreduce.py`'s). Each figure is
//! read from the line that prints it; the baselines these programs measure in the same process
//! (eager launches, OS threads, blocking copies, the driver's pageable path, `cudaMallocHost`) are
//! the rows' peers, with PyTorch's pageable copies (`torch_copies.py`) beside the staged ones.

use super::{Better, Peer, Row, SectionInput, json_lines};
use serde_json::Value;

/// The number printed right before `marker` on `line` (`… N us queueing per step`).
pub fn number_before(line: &str, marker: &str) -> Option<f64> {
    let at = line.find(marker)?;
    line[..at].split_whitespace().next_back()?.trim_end_matches(',').parse().ok()
}

/// The number printed right after `marker` on `line` (`wall    N ms`).
pub fn number_after(line: &str, marker: &str) -> Option<f64> {
    let at = line.find(marker)? + marker.len();
    let word = line[at..].split_whitespace().next()?;
    word.trim_end_matches([',', ';', ')']).parse().ok()
}

fn line_starting<'a>(text: &'a str, start: &str) -> Option<&'a str> {
    text.lines().find(|l| l.trim_start().starts_with(start))
}

fn same_process(value: Option<f64>, input: &SectionInput, file: &str) -> Peer {
    match value {
        Some(value) => Peer::Measured { value, version: "same process".into() },
        None => Peer::Missing(input.missing(file)),
    }
}

pub fn graph_rows(input: &SectionInput) -> Vec<Row> {
    let text = input.read("decode_graph.txt");
    let torch = input.read("torch_graph.jsonl");
    let (eager, graph) = (line_starting(&text, "eager:"), line_starting(&text, "graph:"));
    let torch_row = |name: &str, field: &str| -> Peer {
        let value = json_lines(&torch)
            .find(|v| v.get("row").and_then(Value::as_str) == Some(name))
            .and_then(|v| v.get(field)?.as_f64());
        match value {
            Some(value) => Peer::Measured {
                value,
                version: super::pairs::torch_version(&torch).unwrap_or_else(|| "version not printed".into()),
            },
            None => Peer::Missing(input.missing("torch_graph.jsonl")),
        }
    };
    let mut rows = Vec::new();
    for (suffix, marker, words) in [
        ("queue_us_per_step", " us queueing per step", "CPU time to queue one decode step"),
        ("wall_us_per_step", " us wall per step", "wall time per decode step"),
    ] {
        let (ours_graph, ours_eager) =
            (graph.and_then(|l| number_before(l, marker)), eager.and_then(|l| number_before(l, marker)));
        rows.push(input.row(
            format!("graph_{suffix}"),
            format!("{words}, µs: a replayed CUDA graph (decode_graph)"),
            "us",
            Better::Lower,
            ours_graph,
            "the same step launched eagerly",
            same_process(ours_eager, input, "decode_graph.txt"),
            "decode_graph.txt",
        ));
        rows.push(input.row(
            format!("graph_{suffix}_vs_torch"),
            format!("{words}, µs: a replayed CUDA graph (decode_graph)"),
            "us",
            Better::Lower,
            ours_graph,
            "the same step in PyTorch, replayed as torch.cuda.CUDAGraph",
            torch_row("torch_graph", suffix),
            "decode_graph.txt, torch_graph.jsonl",
        ));
        rows.push(input.row(
            format!("eager_{suffix}_vs_torch"),
            format!("{words}, µs: launched eagerly (decode_graph)"),
            "us",
            Better::Lower,
            ours_eager,
            "the same step in PyTorch, launched eagerly",
            torch_row("torch_eager", suffix),
            "decode_graph.txt, torch_graph.jsonl",
        ));
    }
    rows
}

pub fn async_rows(input: &SectionInput) -> Vec<Row> {
    let server = input.read("async_server.txt");
    let loader = input.read("loader.txt");
    let rate = |start: &str| line_starting(&server, start).and_then(|l| number_before(l, " requests/s"));
    let median_trial = loader.split("the median trial").nth(1).unwrap_or("");
    let wall = |start: &str| line_starting(median_trial, start).and_then(|l| number_after(l, "wall"));
    let over_max =
        |start: &str| line_starting(median_trial, start).and_then(|l| number_after(l, "wall / max(copy, cpu) ="));
    vec![
        input.row(
            "async_server_requests_per_s".into(),
            "async request server (tokio tasks, Pending woken by the watcher), requests/s".into(),
            "requests/s",
            Better::Higher,
            rate("async ("),
            "OS threads, a blocking scope each",
            same_process(rate("threads ("), input, "async_server.txt"),
            "async_server.txt",
        ),
        input.row(
            "loader_wall_ms".into(),
            "data loader, pageable pieces copied while the CPU works on the next (median trial), wall ms".into(),
            "ms",
            Better::Lower,
            wall("overlapped:"),
            "the same pieces copied blocking",
            same_process(wall("blocking:"), input, "loader.txt"),
            "loader.txt",
        ),
        input.row(
            "loader_wall_over_max_copy_cpu".into(),
            "data loader, wall / max(copy, cpu) of the median trial, overlapped".into(),
            "x",
            Better::Lower,
            over_max("overlapped:"),
            "the same pieces copied blocking",
            same_process(over_max("blocking:"), input, "loader.txt"),
            "loader.txt",
        ),
    ]
}

/// Each copy size of `staged_tuning`'s output (`== 256 MiB copies`) with its lines.
fn copy_blocks(text: &str) -> Vec<(u64, Vec<&str>)> {
    let mut blocks: Vec<(u64, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("== ")
            && rest.contains(" MiB copies")
        {
            blocks.push((rest.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0), Vec::new()));
        } else if line.starts_with("==") {
            blocks.push((0, Vec::new()));
        } else if let Some((_, lines)) = blocks.last_mut() {
            lines.push(line);
        }
    }
    blocks.retain(|(mib, _)| *mib > 0);
    blocks
}

/// PyTorch's pageable copy (`torch_copies.py`) of `dir` and `mib`, as a peer.
fn torch_copy(input: &SectionInput, text: &str, dir: &str, mib: u64) -> Peer {
    let row = format!("torch_pageable_{dir}_{mib}m");
    let value = json_lines(text)
        .find(|v| v.get("row").and_then(Value::as_str) == Some(row.as_str()))
        .and_then(|v| v.get("gbs")?.as_f64());
    match value {
        Some(value) => Peer::Measured {
            value,
            version: super::pairs::torch_version(text).unwrap_or_else(|| "version not printed".into()),
        },
        None => Peer::Missing(input.missing("torch_copies.jsonl")),
    }
}

pub fn staged_rows(input: &SectionInput) -> Vec<Row> {
    let text = input.read("staged_tuning.txt");
    let torch = input.read("torch_copies.jsonl");
    let mut rows = Vec::new();
    for (mib, lines) in copy_blocks(&text) {
        let driver = lines.iter().find(|l| l.starts_with("driver pageable"));
        for (dir, marker) in [("h2d", "H2D"), ("d2h", "D2H")] {
            // The best cell of the lanes × chunk sweep, with its setting.
            let best = lines
                .iter()
                .filter(|l| l.starts_with("staged lanes"))
                .filter_map(|l| Some((number_after(l, marker)?, l.split(marker).next()?.trim().to_string())))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            let what = format!(
                "StagedCopier pageable {marker} {mib} MiB, best of the lanes × chunk sweep{}, GB/s",
                best.as_ref().map_or(String::new(), |(_, setting)| format!(" ({setting})"))
            );
            rows.push(input.row(
                format!("staged_{dir}_{mib}m"),
                what.clone(),
                "GB/s",
                Better::Higher,
                best.as_ref().map(|(v, _)| *v),
                "cudaMemcpy from/to pageable memory (the driver's staging)",
                same_process(driver.and_then(|l| number_after(l, marker)), input, "staged_tuning.txt"),
                "staged_tuning.txt",
            ));
            rows.push(input.row(
                format!("staged_{dir}_{mib}m_vs_torch"),
                what,
                "GB/s",
                Better::Higher,
                best.map(|(v, _)| v),
                "PyTorch copy_ between a pageable and a device tensor",
                torch_copy(input, &torch, dir, mib),
                "staged_tuning.txt, torch_copies.jsonl",
            ));
        }
    }
    for (size, kib) in [("4k", "4 KiB"), ("1m", "1024 KiB"), ("64m", "65536 KiB")] {
        let line = text.lines().find(|l| l.trim_start().starts_with(kib) && l.contains("cudaMallocHost pair"));
        rows.push(input.row(
            format!("pinned_pool_hit_vs_malloc_host_{size}"),
            format!("PinnedPool hit alloc + free pair, {size}, µs (staged_tuning)"),
            "us",
            Better::Lower,
            line.and_then(|l| number_before(&l[l.find("PinnedPool hit pair")?..], " us")),
            "cudaMallocHost + cudaFreeHost",
            same_process(line.and_then(|l| number_after(l, "cudaMallocHost pair")), input, "staged_tuning.txt"),
            "staged_tuning.txt",
        ));
    }
    rows
}

pub fn snapshot_rows(input: &SectionInput) -> Vec<Row> {
    let text = input.read("snapshot_dump.txt");
    let torch = input.read("torch_snapshot.jsonl");
    let line = line_starting(&text, "pickled ");
    let theirs = json_lines(&torch).find(|v| v.get("row").and_then(Value::as_str) == Some("torch_snapshot_pickle"));
    let peer = match theirs.as_ref().and_then(|v| v.get("ms")?.as_f64()) {
        Some(value) => Peer::Measured {
            value,
            version: super::pairs::torch_version(&torch).unwrap_or_else(|| "version not printed".into()),
        },
        None => Peer::Missing(input.missing("torch_snapshot.jsonl")),
    };
    let entries = theirs.as_ref().and_then(|v| v.get("trace_entries")?.as_u64());
    vec![input.row(
        "snapshot_pickle_ms".into(),
        "pickling a PyTorch-format memory snapshot of 100k trace entries and 1000 segments, ms (best of 10)".into(),
        "ms",
        Better::Lower,
        line.and_then(|l| number_before(l, " ms")),
        &match entries {
            Some(n) => format!("PyTorch: torch.cuda.memory._snapshot() + pickle.dumps, its own trace of {n} entries"),
            None => "PyTorch: torch.cuda.memory._snapshot() + pickle.dumps".to_string(),
        },
        peer,
        "snapshot_dump.txt, torch_snapshot.jsonl",
    )]
}

/// The bandwidth a row is judged by: busBw with several ranks, algBw with one.
fn bandwidth(row: &Value) -> Option<(&'static str, f64)> {
    match row.get("busbw_gbs").and_then(Value::as_f64) {
        Some(bus) => Some(("busbw", bus)),
        None => row.get("algbw_gbs").and_then(Value::as_f64).map(|alg| ("algbw", alg)),
    }
}

pub fn nccl_rows(input: &SectionInput) -> Vec<Row> {
    let ours = input.read("allreduce.jsonl");
    let torch = input.read("torch_allreduce.jsonl");
    let theirs = json_lines(&torch).find(|v| v.get("tool").and_then(Value::as_str) == Some("torch"));
    let mut rows = Vec::new();
    for row in json_lines(&ours).filter(|v| v.get("tool").and_then(Value::as_str) == Some("cuda-mem-nccl")) {
        let text = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
        let ranks = row.get("ranks").and_then(Value::as_u64).unwrap_or(0);
        let registered = row.get("registered").and_then(Value::as_bool).unwrap_or(false);
        let Some((kind, value)) = bandwidth(&row) else { continue };
        let placement = text("placement").replace('-', "_");
        let key = format!(
            "nccl_{}_{}{}_{placement}_{ranks}ranks_{kind}",
            text("mode"),
            text("source"),
            if registered { "_registered" } else { "" }
        );
        // PyTorch measures in place, one process per rank: the peer of the rows measured so.
        let comparable = placement == "in_place" && text("mode") == "procs";
        let peer = match (&theirs, comparable) {
            (Some(t), true) => match bandwidth(t).filter(|(k, _)| *k == kind) {
                Some((_, v)) => Peer::Measured {
                    value: v,
                    version: format!(
                        "torch {} / NCCL {}",
                        t.get("torch").and_then(Value::as_str).unwrap_or("?"),
                        t.get("nccl").and_then(Value::as_str).unwrap_or("?")
                    ),
                },
                None => Peer::Missing("not measured: torch_allreduce.jsonl has no row of this rank count".into()),
            },
            (None, true) => Peer::Missing(input.missing("torch_allreduce.jsonl")),
            (_, false) => Peer::NotApplicable("PyTorch is measured in place, one process per rank".into()),
        };
        rows.push(input.row(
            key,
            format!(
                "NCCL all-reduce of f32 over cuda-mem memory ({} source, {}, {} ranks, {} mode, NCCL {}), {kind} GB/s",
                text("source"),
                text("placement"),
                ranks,
                text("mode"),
                text("nccl")
            ),
            "GB/s",
            Better::Higher,
            Some(value),
            "PyTorch torch.distributed all_reduce",
            peer,
            "allreduce.jsonl, torch_allreduce.jsonl",
        ));
    }
    if rows.is_empty() {
        rows.push(input.row(
            "nccl_allreduce".into(),
            "NCCL all-reduce over cuda-mem memory".into(),
            "GB/s",
            Better::Higher,
            None,
            "PyTorch torch.distributed all_reduce",
            Peer::Missing(input.missing("allreduce.jsonl")),
            "allreduce.jsonl",
        ));
    }
    rows
}
