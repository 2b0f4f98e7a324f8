//! Rows of different programs that time one call: where their values differ, the report shows
//! them side by side and says why, so that nobody compares a value of one program with another's.

use super::{Row, Suite, markdown::figure};
use std::fmt::Write;

/// Which of a row's two values times the call.
#[derive(Clone, Copy)]
enum Side {
    CudaMem,
    Peer,
}

/// A call timed by several rows, and those rows, for one size.
struct Call {
    what: String,
    rows: Vec<(String, Side)>,
}

fn calls() -> Vec<Call> {
    let sizes = [("4k", "4 KiB"), ("1m", "1 MiB"), ("64m", "64 MiB")];
    let mut calls = Vec::new();
    for (size, words) in sizes {
        let key = |prefix: &str| format!("{prefix}_{size}");
        calls.push(Call {
            what: format!("`cudaMallocHost` + `cudaFreeHost`, {words}"),
            rows: vec![
                (key("paired_malloc_host"), Side::CudaMem),
                (key("paired_malloc_host"), Side::Peer),
                (key("cudarc_malloc_host"), Side::CudaMem),
                (key("cudarc_malloc_host"), Side::Peer),
                (key("feature_pinned_pool_hit"), Side::Peer),
                (key("pinned_pool_hit_vs_malloc_host"), Side::Peer),
            ],
        });
        calls.push(Call {
            what: format!("`PinnedPool` hit, alloc + free, {words}"),
            rows: vec![
                (key("pinned_pool_pair"), Side::CudaMem),
                (key("feature_pinned_pool_hit"), Side::CudaMem),
                (key("pinned_pool_hit_vs_malloc_host"), Side::CudaMem),
            ],
        });
        calls.push(Call {
            what: format!("`DeviceCache` alloc + free, {words}"),
            rows: vec![(key("device_cache_pair"), Side::CudaMem), (key("paired_device_cache_pair"), Side::CudaMem)],
        });
    }
    calls
}

fn value(row: &Row, side: Side) -> Option<f64> {
    match side {
        Side::CudaMem => row.cuda_mem,
        Side::Peer => row.peer_value,
    }
}

/// The report's section on those rows; empty where no call has two measured values.
pub fn section(suite: &Suite) -> String {
    let mut lines = String::new();
    for call in calls() {
        let values: Vec<(String, f64)> = call
            .rows
            .iter()
            .filter_map(|(key, side)| {
                let row = suite.rows.iter().find(|r| &r.key == key)?;
                let name = match side {
                    Side::CudaMem => format!("`{key}`"),
                    Side::Peer => format!("`{key}`, peer: {}", row.peer),
                };
                Some((name, value(row, *side)?))
            })
            .collect();
        if values.len() < 2 {
            continue;
        }
        let (low, high) =
            values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), (_, v)| (low.min(*v), high.max(*v)));
        let listed: Vec<String> = values.iter().map(|(name, v)| format!("{} {name}", figure(*v))).collect();
        let _ = writeln!(lines, "| {} | {} | {} |", call.what, listed.join("; "), figure(high / low));
    }
    if lines.is_empty() {
        return lines;
    }
    format!(
        "\n## Rows that time one call in different programs\n\n\
         Each program times the call its own way (criterion's batches, the interleaved loop of the \
         same-process comparison, a timed loop of an example) after a history of its own (what the \
         process pinned or cached before), so their values differ by more than one program's noise; \
         most of all `cudaMallocHost`, whose cost is the driver's and the kernel's page pinning. Within \
         one program the rows and their peers are timed side by side: compare each row's ratio, not \
         values across these programs.\n\n\
         | call | values, µs (row) | largest over smallest |\n|---|---|---|\n{lines}"
    )
}
