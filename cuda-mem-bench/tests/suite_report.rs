//! The main job's report generator (`cuda_mem_bench::suite`) on canned raw outputs: every
//! section's figures read from the lines their programs print, peers missing for the reasons their
//! `.missing` files give, stable keys, and the files the report is made of.

use cuda_mem_bench::suite::{self, Row, SECTIONS};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/suite")
}

fn rows() -> Vec<Row> {
    suite::collect(&fixtures(), "2026-12-04").rows
}

fn row<'a>(rows: &'a [Row], key: &str) -> &'a Row {
    rows.iter().find(|r| r.key == key).unwrap_or_else(|| panic!("no row {key}"))
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() <= 1e-9 * b.abs().max(1.0))
}

/// cuda-mem's value, the peer's, and the ratio of the row `key`.
#[track_caller]
fn expect(rows: &[Row], key: &str, ours: f64, peer: f64, ratio: f64) {
    let r = row(rows, key);
    assert!(close(r.cuda_mem, ours), "{key}: cuda-mem {:?}, expected {ours}", r.cuda_mem);
    assert!(close(r.peer_value, peer), "{key}: peer {:?}, expected {peer}", r.peer_value);
    assert!(close(r.ratio(), ratio), "{key}: ratio {:?}, expected {ratio}", r.ratio());
    assert_eq!(r.status, "measured", "{key}");
}

#[track_caller]
fn expect_missing(rows: &[Row], key: &str, why: &str) {
    let r = row(rows, key);
    assert!(r.peer_value.is_none() && r.ratio().is_none(), "{key}: {r:?}");
    assert!(r.status.starts_with("not measured") && r.status.contains(why), "{key}: {}", r.status);
}

#[test]
fn pairs_and_threads_meet_their_peers_by_size_and_thread_count() {
    let rows = rows();
    expect(&rows, "device_cache_pair_1m", 0.06, 0.6, 0.1);
    assert_eq!(row(&rows, "device_cache_pair_1m").peer_version, "torch 2.11.0+cu130");
    expect(&rows, "pinned_pool_pair_64m", 0.05, 0.2, 0.25);
    expect(&rows, "device_cache_pair_4k_vs_stream_pool", 0.05, 1.0, 0.05);
    expect_missing(&rows, "device_cache_pair_1m_vs_rmm_arena", "no rmmbench in peers/rmm");
    // Rates: the peer's over cuda-mem's, in millions of pairs per second.
    expect(&rows, "device_cache_threads_8_1m", 160.0, 0.32, 0.002);
    expect(&rows, "device_cache_threads_8_1m_vs_rmm_arena", 160.0, 1.6, 0.01);
    assert_eq!(row(&rows, "device_cache_threads_8_1m_vs_rmm_arena").peer_version, "rmm 26.10.0");
    expect_missing(&rows, "device_cache_threads_8_1m_vs_rmm_pool", "no such row in rmm.jsonl");
    expect(&rows, "device_cache_threads_1_1m_vs_stream_pool", 20.0, 1.0, 0.05);
    assert!(!rows.iter().any(|r| r.key.starts_with("device_cache_threads_2_")), "only the counts measured");
}

#[test]
fn workloads_and_training_take_the_default_cache_against_each_peer() {
    let rows = rows();
    expect(&rows, "workload_churn_ns_per_op", 200.0, 500.0, 0.4);
    expect(&rows, "workload_churn_reserved_over_live_vs_rmm_pool", 1.2, 1.875, 0.64);
    expect(&rows, "workload_training_reserved_over_live", 1.1, 2.2, 0.5);
    expect(&rows, "workload_churn_misses", 400.0, 1.0, 400.0);
    expect_missing(&rows, "workload_churn_ns_per_op_vs_torch_expandable", "expandable segments refused");
    expect_missing(&rows, "workload_churn_ns_per_op_vs_rmm_binning", "no such row in rmm.jsonl");
    assert!(!rows.iter().any(|r| r.key.contains("cache_throughput")), "one cuda-mem configuration per figure");
    expect(&rows, "training_loop_step_ms", 21.0, 20.0, 1.05);
    expect(&rows, "training_loop_reserved_over_allocated_vs_torch_expandable", 1.02, 1.01, 1.02 / 1.01);
    let step = row(&rows, "training_loop_step_ms");
    assert_eq!((step.peer_version.as_str(), step.section), ("torch 2.11.0+cu130", "training"));
}

#[test]
fn programs_printing_lines_for_people_are_read_from_their_lines() {
    let rows = rows();
    expect(&rows, "graph_queue_us_per_step", 4.0, 40.0, 0.1);
    expect(&rows, "graph_wall_us_per_step", 30.0, 60.0, 0.5);
    expect(&rows, "graph_queue_us_per_step_vs_torch", 4.0, 16.0, 0.25);
    expect(&rows, "eager_wall_us_per_step_vs_torch", 60.0, 300.0, 0.2);
    expect(&rows, "async_server_requests_per_s", 2700.0, 3000.0, 3000.0 / 2700.0);
    expect(&rows, "loader_wall_ms", 210.0, 400.0, 0.525);
    expect(&rows, "loader_wall_over_max_copy_cpu", 1.05, 2.0, 0.525);
    expect(&rows, "staged_h2d_256m", 44.0, 8.0, 8.0 / 44.0);
    assert!(row(&rows, "staged_h2d_256m").what.contains("lanes 12 chunk  4 MiB"), "the best cell names its setting");
    expect(&rows, "staged_d2h_256m", 42.0, 16.0, 16.0 / 42.0);
    expect(&rows, "staged_h2d_1024m", 45.0, 7.0, 7.0 / 45.0);
    expect(&rows, "staged_d2h_256m_vs_torch", 42.0, 11.0, 11.0 / 42.0);
    assert_eq!(row(&rows, "staged_d2h_256m_vs_torch").peer_version, "torch 2.11.0+cu130");
    expect_missing(&rows, "staged_d2h_1024m_vs_torch", "no such row in torch_copies.jsonl");
    expect(&rows, "pinned_pool_hit_vs_malloc_host_64m", 0.25, 40000.0, 0.25 / 40000.0);
    expect(&rows, "snapshot_pickle_ms", 8.0, 40.0, 0.2);
    assert!(row(&rows, "snapshot_pickle_ms").peer.ends_with("its own trace of 100000 entries"));
    expect(&rows, "nccl_procs_pool_in_place_2ranks_busbw", 268.44, 255.65, 255.65 / 268.44);
    let threads = row(&rows, "nccl_threads_cache_registered_out_of_place_2ranks_busbw");
    assert!(threads.peer_value.is_none() && threads.status.starts_with("measured; no peer"), "{threads:?}");
}

#[test]
fn the_wrapper_report_gives_same_process_cudarc_and_feature_rows() {
    let rows = rows();
    expect(&rows, "paired_async_retain_nosync_1m", 0.51, 0.5, 1.02);
    expect(&rows, "cudarc_h2d_pinned", 50.0, 40.0, 0.8);
    expect(&rows, "cudarc_async_retain_nosync_1m", 0.5, 1.0, 0.5);
    assert!(!rows.iter().any(|r| r.key == "cudarc_malloc_1m"), "no cudarc row where cudarc has none");
    expect(&rows, "feature_staged_h2d_256m", 40.0, 8.0, 0.2);
    expect(&rows, "feature_pinned_pool_hit_4k", 0.1, 700.0, 0.1 / 700.0);
}

#[test]
fn keys_are_unique_and_stable() {
    let rows = rows();
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    let mut unique = keys.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), keys.len(), "duplicate keys");
    // Docs quote rows by key: renaming one breaks them, so the fixture's keys are pinned.
    let pinned = std::fs::read_to_string(fixtures().join("../suite-keys.txt")).unwrap();
    let pinned: Vec<&str> = pinned.lines().collect();
    assert_eq!(keys, pinned, "keys changed: update tests/fixtures/suite-keys.txt and every doc quoting them");
}

#[test]
fn sections_and_peers_that_did_not_run_leave_rows_that_say_so() {
    let dir = std::env::temp_dir().join(format!("suite-missing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("nccl")).unwrap();
    std::fs::create_dir_all(dir.join("cache")).unwrap();
    std::fs::write(dir.join("nccl/allreduce.missing"), "no libnccl.so.2 on this host\n").unwrap();
    std::fs::create_dir_all(dir.join("graphs")).unwrap();
    std::fs::write(dir.join("graphs/decode_graph.txt"), "").unwrap();
    std::fs::write(dir.join("graphs/decode_graph.log"), "== examples/decode_graph\nno GPU\n== exit code 1\n").unwrap();
    let suite = suite::collect(&dir, "2026-12-04");
    assert_eq!(suite.ran.iter().map(|r| r.section).collect::<Vec<_>>(), ["cache", "graphs", "nccl"]);
    let graph = row(&suite.rows, "graph_queue_us_per_step");
    assert_eq!(graph.status, "not measured: decode_graph exited 1 (see decode_graph.log)");
    let nccl = row(&suite.rows, "nccl_allreduce");
    assert!(nccl.cuda_mem.is_none() && nccl.status == "not measured: no libnccl.so.2 on this host", "{nccl:?}");
    let pair = row(&suite.rows, "device_cache_pair_1m");
    assert_eq!(pair.status, "not measured: no cache_pairs.jsonl in this run");
    let out = dir.join("report");
    suite.write(&out).unwrap();
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("Not in this report: paired, threads, workloads, training, async, staged, snapshot, sleep.")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_report_is_written_with_results_plots_and_anchors() {
    let dir = std::env::temp_dir().join(format!("suite-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let suite = suite::collect(&fixtures(), "2026-12-04");
    assert_eq!(suite.ran.len(), SECTIONS.len());
    assert_eq!((suite.device.as_str(), suite.commits()), ("NVIDIA H200, 580.159.04, 143771 MiB", vec!["abc1234"]));
    let files = suite.write(&dir).unwrap();
    let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["results.json", "speed.svg", "threads.svg", "memory.svg", "report.md"]);
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["format"], suite::FORMAT);
    assert_eq!(results["date"], "2026-12-04");
    let rows = results["rows"].as_array().unwrap();
    assert_eq!(rows.len(), suite.rows.len());
    let pair = rows.iter().find(|r| r["key"] == "device_cache_pair_1m").unwrap();
    assert_eq!((pair["cuda_mem"].as_f64(), pair["peer_value"].as_f64()), (Some(0.06), Some(0.6)));
    assert!((pair["ratio"].as_f64().unwrap() - 0.1).abs() < 1e-12);
    assert!((pair["speedup"].as_f64().unwrap() - 10.0).abs() < 1e-9);
    assert_eq!(pair["peer_version"], "torch 2.11.0+cu130");
    let missing = rows.iter().find(|r| r["key"] == "device_cache_pair_1m_vs_rmm_arena").unwrap();
    assert!(missing["peer_value"].is_null() && missing["ratio"].is_null());
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for r in &suite.rows {
        assert!(report.contains(&format!("<a id=\"{}\"></a>", r.key)), "report.md has no anchor for {}", r.key);
    }
    assert!(report.contains("| cache | 2026-12-04T10:08:00Z | 95 | 0 |"), "{report}");
    for plot in ["speed.svg", "threads.svg", "memory.svg"] {
        assert!(report.contains(&format!("]({plot})")), "report.md does not show {plot}");
        let svg = std::fs::read_to_string(dir.join(plot)).unwrap();
        assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"), "{plot}");
    }
    let threads = std::fs::read_to_string(dir.join("threads.svg")).unwrap();
    assert!(threads.contains("RMM arena (one shared resource)") && threads.contains("cuda-mem DeviceCache"));
    assert_eq!(threads.matches("<polyline").count(), 4, "cuda-mem, PyTorch, RMM arena, the stream pool");
    let memory = std::fs::read_to_string(dir.join("memory.svg")).unwrap();
    assert!(
        memory.contains("workload_training: PyTorch CUDACachingAllocator")
            && memory.contains("training_loop: cuda-mem")
    );
    // The same raw outputs give the same report.
    let again = dir.join("again");
    suite::collect(&fixtures(), "2026-12-04").write(&again).unwrap();
    for name in &names {
        assert_eq!(std::fs::read(dir.join(name)).unwrap(), std::fs::read(again.join(name)).unwrap(), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Sections measured by bundles of two commits (two device calls of one day): the report names
/// both, and each section's own in its row of the table.
#[test]
fn sections_from_bundles_of_two_commits_name_each_commit() {
    let dir = std::env::temp_dir().join(format!("suite-commits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (section, commit) in [("cache", "abc1234"), ("snapshot", "def5678")] {
        std::fs::create_dir_all(dir.join(section)).unwrap();
        let meta = format!(
            r#"{{"section":"{section}","started":"2026-12-04T10:00:00Z","seconds":9,"rc":0,"gpu":"H200","commit":"{commit}","gpus":1}}"#
        );
        std::fs::write(dir.join(section).join("section.json"), meta).unwrap();
    }
    let suite = suite::collect(&dir, "2026-12-04");
    assert_eq!(suite.commits(), ["abc1234", "def5678"]);
    let commits: Vec<&str> = suite.ran.iter().map(|r| r.commit.as_str()).collect();
    assert_eq!(commits, ["abc1234", "def5678"]);
    let out = dir.join("report");
    suite.write(&out).unwrap();
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("at commits `abc1234`, `def5678` (each section's below)"), "{report}");
    assert!(report.contains("| snapshot | 2026-12-04T10:00:00Z | 9 | 0 | 1 | def5678 |"), "{report}");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["sections"][1]["commit"], "def5678");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rows_that_time_one_call_in_different_programs_are_shown_side_by_side() {
    let suite = suite::collect(&fixtures(), "2026-12-04");
    let keys = ["pinned_pool_pair_4k", "feature_pinned_pool_hit_4k", "pinned_pool_hit_vs_malloc_host_4k"];
    let values: Vec<f64> = keys.iter().filter_map(|k| suite.rows.iter().find(|r| r.key == *k)?.cuda_mem).collect();
    assert!(values.len() >= 2, "the fixtures time a PinnedPool hit in two programs");
    let spread = values.iter().cloned().fold(f64::MIN, f64::max) / values.iter().cloned().fold(f64::MAX, f64::min);
    let report = suite::markdown::report(&suite, &[]);
    let section = report.split("## Rows that time one call in different programs").nth(1).expect("the section");
    let line = section.lines().find(|l| l.starts_with("| `PinnedPool` hit, alloc + free, 4 KiB |")).expect("its line");
    assert!(line.contains("`pinned_pool_pair_4k`") && line.contains("`feature_pinned_pool_hit_4k`"), "{line}");
    assert!(line.ends_with(&format!("| {} |", suite::markdown::figure(spread))), "{line}");
    // A call with fewer than two measured values has no line, and there is no section where none has two.
    let alone = suite::Suite { rows: vec![row(&suite.rows, "pinned_pool_pair_4k").clone()], ..suite };
    assert!(!suite::markdown::report(&alone, &[]).contains("## Rows that time one call"));
}
