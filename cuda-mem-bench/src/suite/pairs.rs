//! The `cache` and `threads` sections: alloc + free pairs of `DeviceCache` and `PinnedPool`
//! (the `cache_pairs` example), one thread and many, against PyTorch's caching allocators
//! (`torch_alloc.py`, `torch_alloc_mt.py`), RAPIDS RMM's resources (`rmmbench`) and the
//! stream-ordered pool cuda-mem wraps (`StreamBuffer` from a retaining pool, same process).

use super::{Better, Peer, Row, SectionInput, json_lines};
use serde_json::Value;

/// The pair sizes: the rows' suffix and bytes.
pub const SIZES: [(&str, u64); 3] = [("4k", 4 << 10), ("1m", 1 << 20), ("64m", 64 << 20)];

/// The RMM resources compared, as `rmmbench` names them.
pub const RMM_RESOURCES: [&str; 4] = ["arena", "pool", "binning", "cuda_async"];

/// The PyTorch version line (`{"torch": "2.11.0+cu130", …}`) of a peer script's output.
pub fn torch_version(text: &str) -> Option<String> {
    json_lines(text).find_map(|v| v.get("torch")?.as_str().map(|t| format!("torch {t}")))
}

/// The RMM version of `rmmbench`'s (or `rmm_replay`'s) meta row.
pub fn rmm_version(text: &str) -> Option<String> {
    json_lines(text).find_map(|v| v.get("rmm_version")?.as_str().map(|t| format!("rmm {t}")))
}

/// The value of field `field` of the row named `row` (`{"row": …}` lines).
fn named(text: &str, row: &str, field: &str) -> Option<f64> {
    json_lines(text).find(|v| v.get("row").and_then(Value::as_str) == Some(row))?.get(field)?.as_f64()
}

/// The value of `field` of the `rmmbench` row of `section` and `resource` where `pick` holds.
fn rmm_row(text: &str, section: &str, resource: &str, field: &str, pick: impl Fn(&Value) -> bool) -> Option<f64> {
    json_lines(text)
        .find(|v| {
            v.get("section").and_then(Value::as_str) == Some(section)
                && v.get("resource").and_then(Value::as_str) == Some(resource)
                && pick(v)
        })?
        .get(field)?
        .as_f64()
}

/// A peer read from a file: measured (with the file's version) or missing with the reason.
fn peer(input: &SectionInput, file: &str, value: Option<f64>, version: Option<String>) -> Peer {
    match value {
        Some(value) => Peer::Measured { value, version: version.unwrap_or_else(|| "version not printed".into()) },
        None => Peer::Missing(input.missing(file)),
    }
}

/// Same-process baseline: cuda-mem's own stream-ordered pool path.
fn same_process(value: Option<f64>, input: &SectionInput) -> Peer {
    match value {
        Some(value) => Peer::Measured { value, version: "same process".into() },
        None => Peer::Missing(input.missing("cache_pairs.jsonl")),
    }
}

pub fn cache_rows(input: &SectionInput) -> Vec<Row> {
    let ours = input.read("cache_pairs.jsonl");
    let torch = input.read("torch.jsonl");
    let rmm = input.read("rmm.jsonl");
    let (torch_v, rmm_v) = (torch_version(&torch), rmm_version(&rmm));
    let mut rows = Vec::new();
    for (size, bytes) in SIZES {
        let key = format!("device_cache_pair_{size}");
        let cache = named(&ours, &key, "us");
        let what = format!("DeviceCache alloc + free pair, {size}, one thread, µs");
        rows.push(input.row(
            key.clone(),
            what.clone(),
            "us",
            Better::Lower,
            cache,
            "PyTorch CUDACachingAllocator",
            peer(
                input,
                "torch.jsonl",
                named(&torch, &format!("torch_caching_device_pair_{size}"), "us"),
                torch_v.clone(),
            ),
            "cache_pairs.jsonl, torch.jsonl",
        ));
        for resource in RMM_RESOURCES {
            let theirs = rmm_row(&rmm, "pair", resource, "ns_per_pair_median", |v| {
                v.get("bytes").and_then(Value::as_u64) == Some(bytes)
            })
            .map(|ns| ns / 1e3);
            rows.push(input.row(
                format!("{key}_vs_rmm_{resource}"),
                what.clone(),
                "us",
                Better::Lower,
                cache,
                &format!("RMM {resource}"),
                peer(input, "rmm.jsonl", theirs, rmm_v.clone()),
                "cache_pairs.jsonl, rmm.jsonl",
            ));
        }
        rows.push(input.row(
            format!("{key}_vs_stream_pool"),
            what,
            "us",
            Better::Lower,
            cache,
            "StreamBuffer (cudaMallocFromPoolAsync, retaining pool)",
            same_process(named(&ours, &format!("stream_buffer_retaining_nosync_pair_{size}"), "us"), input),
            "cache_pairs.jsonl",
        ));
        let key = format!("pinned_pool_pair_{size}");
        rows.push(input.row(
            key,
            format!("PinnedPool hit alloc + free pair, {size}, µs"),
            "us",
            Better::Lower,
            named(&ours, &format!("pinned_pool_hit_pair_{size}"), "us"),
            "PyTorch CachingHostAllocator",
            peer(
                input,
                "torch.jsonl",
                named(&torch, &format!("torch_caching_host_pair_{size}"), "us"),
                torch_v.clone(),
            ),
            "cache_pairs.jsonl, torch.jsonl",
        ));
    }
    rows
}

/// The thread counts met in cuda-mem's rows (`device_cache_threads_N_1m`), ascending.
pub fn thread_counts(text: &str) -> Vec<u64> {
    let mut counts: Vec<u64> = json_lines(text)
        .filter_map(|v| {
            let row = v.get("row")?.as_str()?;
            row.strip_prefix("device_cache_threads_")?.strip_suffix("_1m")?.parse().ok()
        })
        .collect();
    counts.sort_unstable();
    counts.dedup();
    counts
}

pub fn thread_rows(input: &SectionInput) -> Vec<Row> {
    let ours = input.read("cache_pairs.jsonl");
    let torch = input.read("torch_mt.jsonl");
    let rmm = input.read("rmm.jsonl");
    let (torch_v, rmm_v) = (torch_version(&torch), rmm_version(&rmm));
    let million = |v: Option<f64>| v.map(|r| r / 1e6);
    let mut rows = Vec::new();
    for n in thread_counts(&ours) {
        let key = format!("device_cache_threads_{n}_1m");
        let cache = million(named(&ours, &key, "pairs_per_s"));
        let what = format!("DeviceCache 1 MiB pairs, {n} threads with a stream each, aggregate M pairs/s");
        rows.push(input.row(
            key.clone(),
            what.clone(),
            "M/s",
            Better::Higher,
            cache,
            "PyTorch CUDACachingAllocator (C++ threads)",
            peer(
                input,
                "torch_mt.jsonl",
                million(named(&torch, &format!("torch_caching_device_threads_{n}_1m"), "pairs_per_s")),
                torch_v.clone(),
            ),
            "cache_pairs.jsonl, torch_mt.jsonl",
        ));
        for resource in RMM_RESOURCES {
            let theirs = rmm_row(&rmm, "threads", resource, "pairs_per_s_median", |v| {
                v.get("threads").and_then(Value::as_u64) == Some(n)
            });
            rows.push(input.row(
                format!("{key}_vs_rmm_{resource}"),
                what.clone(),
                "M/s",
                Better::Higher,
                cache,
                &format!("RMM {resource} (one shared resource)"),
                peer(input, "rmm.jsonl", million(theirs), rmm_v.clone()),
                "cache_pairs.jsonl, rmm.jsonl",
            ));
        }
        rows.push(input.row(
            format!("{key}_vs_stream_pool"),
            what,
            "M/s",
            Better::Higher,
            cache,
            "StreamBuffer (cudaMallocFromPoolAsync, retaining pool)",
            same_process(million(named(&ours, &format!("stream_buffer_threads_{n}_1m"), "pairs_per_s")), input),
            "cache_pairs.jsonl",
        ));
    }
    rows
}
