//! The `sleep` section: a `DeviceCache` put to sleep and woken (`sleep_wake.jsonl`, the
//! `sleep_wake` example, beside one pinned copy in the same process), and PyTorch's tagged
//! memory (`torch_sleep_wake.jsonl`, `python/sleep_wake_compare.py`: cuda-mem's regions beside
//! torch_memory_saver, vLLM's per-allocation copies and one pinned copy, each in a process of its
//! own, on the same tensors). Bandwidths are the best warm cycle (every cycle after the first).

use super::{Better, Peer, Row, SectionInput, json_lines};
use serde_json::Value;

/// What a run of `sleep_wake_compare.py` measured: (first sleep s, best warm sleep and wake GB/s).
struct Run {
    first_sleep_s: f64,
    sleep_gbs: f64,
    wake_gbs: f64,
    version: String,
}

fn run_of(value: &Value) -> Option<Run> {
    let bytes = value.get("bytes")?.as_f64()?;
    let records = value.get("records")?.as_array()?;
    let seconds = |r: &Value, k: &str| r.get(k).and_then(Value::as_f64);
    let first_sleep_s = seconds(records.first()?, "sleep_s")?;
    let warm = if records.len() > 1 { &records[1..] } else { &records[..] };
    let best = |k: &str| warm.iter().filter_map(|r| seconds(r, k)).fold(f64::INFINITY, f64::min);
    let gbs = |s: f64| (s.is_finite() && s > 0.0).then(|| bytes / s / 1e9);
    let version = value.get("version").and_then(Value::as_str).unwrap_or("version not printed").to_string();
    Some(Run { first_sleep_s, sleep_gbs: gbs(best("sleep_s"))?, wake_gbs: gbs(best("wake_s"))?, version })
}

/// The runs of `torch_sleep_wake.jsonl` by name: measured, or why not.
fn torch_runs(input: &SectionInput) -> impl Fn(&str) -> Result<Run, String> {
    let lines: Vec<Value> = json_lines(&input.read("torch_sleep_wake.jsonl")).collect();
    let missing = input.missing("torch_sleep_wake.jsonl");
    // The run script leaves `tms.missing` where the bundle carries no torch_memory_saver wheel.
    let no_tms = input.dir.join("tms.missing").is_file().then(|| input.missing("tms.jsonl"));
    move |name: &str| {
        if let (Some(why), "tms") = (&no_tms, name) {
            return Err(why.clone());
        }
        let Some(line) = lines.iter().find(|v| v.get("run").and_then(Value::as_str) == Some(name)) else {
            return Err(missing.clone());
        };
        if let Some(error) = line.get("error").and_then(Value::as_str) {
            return Err(format!("not measured: {error}"));
        }
        run_of(line).ok_or_else(|| format!("not measured: torch_sleep_wake.jsonl's {name} line has no cycles"))
    }
}

pub fn sleep_rows(input: &SectionInput) -> Vec<Row> {
    let mut rows = cache_rows(input);
    let runs = torch_runs(input);
    let ours = runs("cuda_mem").ok();
    let peers = [
        ("tms", "torch_memory_saver pause/resume with CPU backup"),
        ("per_tensor_copy", "vLLM CuMemAllocator's per-allocation copies (copies only, no unmap or remap)"),
        ("pinned_copy", "one pinned copy each way"),
    ];
    let sizes = "40 GiB in about 1,000 tensors of 1 MiB-512 MiB";
    for (peer, label) in peers {
        let theirs = runs(peer);
        for (direction, pick) in [("sleep", (|r: &Run| r.sleep_gbs) as fn(&Run) -> f64), ("wake", |r: &Run| r.wake_gbs)]
        {
            rows.push(input.row(
                format!("sleep_torch_{direction}_gbs_vs_{peer}"),
                format!("PyTorch: {direction} of tagged memory ({sizes}), warm GB/s"),
                "GB/s",
                Better::Higher,
                ours.as_ref().map(pick),
                label,
                peer_of(&theirs, pick),
                "torch_sleep_wake.jsonl",
            ));
        }
        if peer != "pinned_copy" {
            rows.push(input.row(
                format!("sleep_torch_first_sleep_ms_vs_{peer}"),
                format!("PyTorch: first sleep of tagged memory ({sizes}, pinned host memory allocated), ms"),
                "ms",
                Better::Lower,
                ours.as_ref().map(|r| r.first_sleep_s * 1e3),
                label,
                peer_of(&theirs, |r| r.first_sleep_s * 1e3),
                "torch_sleep_wake.jsonl",
            ));
        }
    }
    rows
}

fn peer_of(theirs: &Result<Run, String>, pick: impl Fn(&Run) -> f64) -> Peer {
    match theirs {
        Ok(run) => Peer::Measured { value: pick(run), version: run.version.clone() },
        Err(why) => Peer::Missing(why.clone()),
    }
}

/// The `sleep_wake` example's rows: warm sleeps and wakes against one pinned copy each way in the
/// same process.
fn cache_rows(input: &SectionInput) -> Vec<Row> {
    let lines: Vec<Value> = json_lines(&input.read("sleep_wake.jsonl")).collect();
    let row_of = |name: &str| lines.iter().find(|v| v.get("row").and_then(Value::as_str) == Some(name));
    let pinned = row_of("pinned_memcpy_1g");
    let count = row_of("tensors").and_then(|v| v.get("count")?.as_u64());
    let cycles: Vec<&Value> =
        lines.iter().filter(|v| v.get("row").and_then(Value::as_str) == Some("cycle")).skip(1).collect();
    let best = |k: &str| {
        cycles.iter().filter_map(|v| v.get(k)?.as_f64()).fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    [("sleep", "sleep_gbps", "d2h_gbps", "D2H"), ("wake", "wake_gbps", "h2d_gbps", "H2D")]
        .into_iter()
        .map(|(direction, ours, theirs, way)| {
            let peer = match pinned.and_then(|p| p.get(theirs)?.as_f64()) {
                Some(value) => Peer::Measured { value, version: "cudaMemcpy of 1 GiB, pinned, same process".into() },
                None => Peer::Missing(input.missing("sleep_wake.jsonl")),
            };
            input.row(
                format!("sleep_cache_{direction}_gbs"),
                format!(
                    "DeviceCache: {direction} of {} blocks holding 40 GiB (Keep::Contents), warm GB/s",
                    count.map_or("its".to_string(), |n| n.to_string())
                ),
                "GB/s",
                Better::Higher,
                best(ours),
                &format!("one pinned cudaMemcpy {way}"),
                peer,
                "sleep_wake.jsonl",
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(files: &[(&str, &str)]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("suite-sleep-{}-{}", std::process::id(), files.len()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    const EXAMPLE: &str = r#"{"row":"pinned_memcpy_1g","d2h_gbps":55.0,"h2d_gbps":50.0}
{"row":"tensors","count":484,"bytes":42949672960}
{"row":"cycle","cycle":0,"sleep_s":4.2,"wake_s":0.85,"sleep_gbps":10.0,"wake_gbps":50.4}
{"row":"cycle","cycle":1,"sleep_s":0.82,"wake_s":0.85,"sleep_gbps":52.5,"wake_gbps":50.3}
{"row":"cycle","cycle":2,"sleep_s":0.82,"wake_s":0.85,"sleep_gbps":52.4,"wake_gbps":50.2}
"#;

    const TORCH: &str = r#"{"run": "cuda_mem", "tensors": 2, "bytes": 10000000000, "records": [{"cycle": 0, "sleep_s": 3.0, "wake_s": 0.5, "intact": true}, {"cycle": 1, "sleep_s": 0.25, "wake_s": 0.2, "intact": true}, {"cycle": 2, "sleep_s": 0.2, "wake_s": 0.25, "intact": true}], "version": "torch 2.11.0"}
{"run": "tms", "error": "No module named 'torch_memory_saver'"}
{"run": "per_tensor_copy", "tensors": 2, "bytes": 10000000000, "records": [{"cycle": 0, "sleep_s": 20.0, "wake_s": 0.4, "intact": true}, {"cycle": 1, "sleep_s": 0.2, "wake_s": 0.2, "intact": true}], "version": "torch 2.11.0"}
run              tensors   GiB ...
"#;

    #[test]
    fn rows_take_the_best_warm_cycle_and_name_missing_peers() {
        let dir = section(&[("sleep_wake.jsonl", EXAMPLE), ("torch_sleep_wake.jsonl", TORCH)]);
        let rows = sleep_rows(&SectionInput { name: "sleep", dir: &dir });
        let row = |key: &str| rows.iter().find(|r| r.key == key).unwrap_or_else(|| panic!("no row {key}"));
        let cache = row("sleep_cache_sleep_gbs");
        assert_eq!((cache.cuda_mem, cache.peer_value), (Some(52.5), Some(55.0)), "the first cycle left out");
        assert!(cache.what.contains("484 blocks"), "{}", cache.what);
        assert_eq!(row("sleep_cache_wake_gbs").cuda_mem, Some(50.3));
        // 10 GB over 0.2 s: 50 GB/s, the best warm cycle of each direction.
        let sleep = row("sleep_torch_sleep_gbs_vs_per_tensor_copy");
        assert_eq!((sleep.cuda_mem, sleep.peer_value), (Some(50.0), Some(50.0)));
        assert_eq!(row("sleep_torch_first_sleep_ms_vs_per_tensor_copy").peer_value, Some(20000.0));
        assert_eq!(row("sleep_torch_first_sleep_ms_vs_per_tensor_copy").cuda_mem, Some(3000.0));
        let tms = row("sleep_torch_wake_gbs_vs_tms");
        assert_eq!((tms.cuda_mem, tms.peer_value), (Some(50.0), None));
        assert!(tms.status.contains("No module named 'torch_memory_saver'"), "{}", tms.status);
        let pinned = row("sleep_torch_sleep_gbs_vs_pinned_copy");
        assert!(pinned.peer_value.is_none() && pinned.status.contains("torch_sleep_wake.jsonl"), "{}", pinned.status);
        assert!(!rows.iter().any(|r| r.key == "sleep_torch_first_sleep_ms_vs_pinned_copy"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn without_outputs_every_row_says_what_is_missing() {
        let dir = section(&[]);
        let rows = sleep_rows(&SectionInput { name: "sleep", dir: &dir });
        assert_eq!(rows.len(), 2 + 2 * 3 + 2);
        assert!(rows.iter().all(|r| r.cuda_mem.is_none() && !r.status.is_empty()), "{rows:?}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
