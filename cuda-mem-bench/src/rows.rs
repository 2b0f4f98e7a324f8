//! The row catalogue: every measured row, its section, unit, batch size K and sample count.
//!
//! `benches/families.rs` takes K and the sample count from here, `reference/raw_reference.cu` has
//! the same table (`PLANS`; a unit test below compares the two), and the report uses it to turn
//! criterion's samples into the same figure the C++ program prints.

/// A group of rows: one table in the report, one criterion group in the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Section {
    /// Allocation + free pairs, microseconds per pair.
    Alloc,
    /// Synchronous 256 MiB copies, GB/s.
    Bandwidth,
    /// The streaming-read kernel over device and mapped host memory, GB/s.
    Kernel,
    /// The streaming-read kernel over managed memory, GB/s.
    Managed,
}

impl Section {
    /// Every section, in report order.
    pub const ALL: [Section; 4] = [Section::Alloc, Section::Bandwidth, Section::Kernel, Section::Managed];

    /// The section's name: the criterion group of the cuda-mem rows, and the C++ program's
    /// section argument.
    pub fn name(self) -> &'static str {
        match self {
            Section::Alloc => "alloc",
            Section::Bandwidth => "bandwidth",
            Section::Kernel => "kernel",
            Section::Managed => "managed",
        }
    }

    /// The table heading in the report.
    pub fn title(self) -> &'static str {
        match self {
            Section::Alloc => "Allocation + free pairs (µs per pair, lower is better)",
            Section::Bandwidth => "Copies of 256 MiB (GB/s, higher is better)",
            Section::Kernel => "Streaming-read kernel (GB/s, higher is better)",
            Section::Managed => "Managed memory, 1 GiB read by the GPU (GB/s, higher is better)",
        }
    }

    /// The unit every row of the section is reported in.
    pub fn unit(self) -> Unit {
        match self {
            Section::Alloc => Unit::Micros,
            Section::Bandwidth | Section::Kernel | Section::Managed => Unit::GigabytesPerSecond,
        }
    }
}

/// Who performed the operations of a criterion benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// cuda-mem, the crate under test.
    CudaMem,
    /// cudarc 0.19.10 (driver API), for comparison.
    Cudarc,
    /// The runtime called directly through `cuda_mem::sys` from the benchmark process (diagnostic
    /// rows of the stream-ordered families: they separate the wrapper's cost from the process's).
    Ffi,
}

/// The criterion group id of a section's rows: `alloc`, `bandwidth`, ... for cuda-mem and
/// `cudarc-alloc`, `cudarc-bandwidth`, ... for cudarc, `ffi-alloc` for the direct-FFI diagnostic
/// rows. The function id is always the row key, so a
/// row's samples are at `<criterion dir>/<group>/<key>/new/sample.json`.
pub fn group_id(section: Section, peer: Peer) -> String {
    match peer {
        Peer::CudaMem => section.name().to_string(),
        Peer::Cudarc => format!("cudarc-{}", section.name()),
        Peer::Ffi => format!("ffi-{}", section.name()),
    }
}

/// The unit of a row's figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Microseconds per operation (lower is better).
    Micros,
    /// Gigabytes (1e9 bytes) per second (higher is better).
    GigabytesPerSecond,
}

impl Unit {
    /// The unit as the C++ program and the report spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Micros => "us",
            Unit::GigabytesPerSecond => "GB/s",
        }
    }
}

/// One measured row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The key: the C++ program's `key` and the criterion function id.
    pub key: &'static str,
    /// The table it belongs to.
    pub section: Section,
    /// Operations per sample.
    pub k: u32,
    /// Samples (after one warm-up sample).
    pub samples: u32,
    /// Bytes one operation allocates, copies or reads.
    pub bytes: u64,
    /// Needs the streaming-read kernel (on the Rust side: cuda-mem-kernels).
    pub needs_kernel: bool,
}

impl Row {
    /// The unit of the row's figure.
    pub fn unit(&self) -> Unit {
        self.section.unit()
    }

    /// The family (the key without its size suffix), for the latency plot.
    pub fn family(&self) -> &'static str {
        self.key.rsplit_once('_').map_or(self.key, |(family, _)| family)
    }

    /// The size suffix of the key (`4k`, `1m`, `64m`, `16441`, ...).
    pub fn size_label(&self) -> &'static str {
        self.key.rsplit_once('_').map_or("", |(_, size)| size)
    }
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
/// Bytes of every host/device copy row.
pub const COPY_BYTES: u64 = 256 * MIB;

const fn alloc(key: &'static str, bytes: u64, k: u32, samples: u32) -> Row {
    Row { key, section: Section::Alloc, k, samples, bytes, needs_kernel: false }
}

const fn copy(key: &'static str, k: u32, samples: u32) -> Row {
    Row { key, section: Section::Bandwidth, k, samples, bytes: COPY_BYTES, needs_kernel: false }
}

const fn read(section: Section, key: &'static str, bytes: u64, k: u32, samples: u32) -> Row {
    Row { key, section, k, samples, bytes, needs_kernel: true }
}

/// Every row, in report order.
pub const ROWS: &[Row] = &[
    alloc("malloc_4k", 4 * KIB, 200, 30),
    alloc("malloc_1m", MIB, 200, 30),
    alloc("malloc_64m", 64 * MIB, 200, 30),
    alloc("malloc_host_4k", 4 * KIB, 50, 20),
    alloc("malloc_host_1m", MIB, 50, 20),
    alloc("malloc_host_64m", 64 * MIB, 20, 10),
    alloc("host_alloc_portable_4k", 4 * KIB, 50, 20),
    alloc("host_alloc_portable_1m", MIB, 50, 20),
    alloc("host_alloc_portable_64m", 64 * MIB, 20, 10),
    alloc("host_alloc_mapped_4k", 4 * KIB, 50, 20),
    alloc("host_alloc_mapped_1m", MIB, 50, 20),
    alloc("host_alloc_mapped_64m", 64 * MIB, 20, 10),
    alloc("host_alloc_wc_4k", 4 * KIB, 50, 20),
    alloc("host_alloc_wc_1m", MIB, 50, 20),
    alloc("host_alloc_wc_64m", 64 * MIB, 20, 10),
    alloc("managed_4k", 4 * KIB, 200, 30),
    alloc("managed_1m", MIB, 100, 20),
    alloc("managed_64m", 64 * MIB, 10, 10),
    alloc("async_default_sync_4k", 4 * KIB, 200, 30),
    alloc("async_default_sync_1m", MIB, 200, 30),
    alloc("async_default_sync_64m", 64 * MIB, 200, 30),
    alloc("async_retain_sync_4k", 4 * KIB, 200, 30),
    alloc("async_retain_sync_1m", MIB, 200, 30),
    alloc("async_retain_sync_64m", 64 * MIB, 200, 30),
    alloc("async_retain_nosync_4k", 4 * KIB, 200, 50),
    alloc("async_retain_nosync_1m", MIB, 200, 50),
    alloc("async_retain_nosync_64m", 64 * MIB, 200, 50),
    alloc("pool_odd_16441", 16441, 200, 50),
    alloc("pool_odd_67121209", 67_121_209, 200, 50),
    copy("h2d_pageable", 1, 20),
    copy("d2h_pageable", 1, 20),
    copy("h2d_pinned", 1, 30),
    copy("d2h_pinned", 1, 30),
    copy("h2d_wc", 1, 30),
    copy("d2h_wc", 1, 30),
    copy("h2d_registered", 1, 30),
    copy("d2h_registered", 1, 30),
    copy("d2d", 10, 30),
    read(Section::Kernel, "read_device_1g", GIB, 10, 30),
    read(Section::Kernel, "read_mapped_256m", COPY_BYTES, 1, 20),
    read(Section::Managed, "managed_first_read_fault_1g", GIB, 1, 10),
    read(Section::Managed, "managed_first_read_prefetch_1g", GIB, 1, 10),
    read(Section::Managed, "managed_first_read_advise_prefetch_1g", GIB, 1, 10),
    read(Section::Managed, "managed_resident_read_1g", GIB, 10, 30),
];

/// Rows the C++ program checks by calling the API in question (unit "ok", value 1 or 0).
pub const CLAIM_ROWS: &[&str] = &["claim_pool_odd_sizes", "claim_cross_stream_free", "claim_pinned_other_thread"];

/// The row with this key.
pub fn row(key: &str) -> Option<&'static Row> {
    ROWS.iter().find(|r| r.key == key)
}

/// The rows of one section, in report order.
pub fn section_rows(section: Section) -> impl Iterator<Item = &'static Row> {
    ROWS.iter().filter(move |r| r.section == section)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The C++ program's PLANS table, parsed from its source: `{"key", K, SAMPLES},` per line.
    fn cpp_plans() -> BTreeMap<String, (u32, u32)> {
        let source = include_str!("../reference/raw_reference.cu");
        let start = source.find("// BEGIN PLANS").expect("BEGIN PLANS marker");
        let end = source.find("// END PLANS").expect("END PLANS marker");
        let mut plans = BTreeMap::new();
        for line in source[start..end].lines() {
            let line = line.trim();
            let Some(inner) = line.strip_prefix("{\"").and_then(|l| l.strip_suffix("},")) else { continue };
            let mut parts = inner.split(',').map(str::trim);
            let key = parts.next().unwrap().trim_end_matches('"').to_string();
            let k = parts.next().unwrap().parse().unwrap();
            let samples = parts.next().unwrap().parse().unwrap();
            assert!(plans.insert(key, (k, samples)).is_none(), "duplicate plan in raw_reference.cu: {line}");
        }
        plans
    }

    #[test]
    fn catalogue_matches_the_cpp_plans() {
        let plans = cpp_plans();
        assert_eq!(plans.len(), ROWS.len(), "raw_reference.cu PLANS and ROWS differ in length");
        for row in ROWS {
            assert_eq!(
                plans.get(row.key),
                Some(&(row.k, row.samples)),
                "row {} differs from raw_reference.cu",
                row.key
            );
        }
    }

    #[test]
    fn keys_are_unique_and_criterion_safe() {
        let mut seen = std::collections::HashSet::new();
        for row in ROWS {
            assert!(seen.insert(row.key), "duplicate key {}", row.key);
            // criterion replaces these characters in directory names; keys must survive unchanged.
            assert!(!row.key.contains(['?', '"', '/', '\\', '*', '<', '>', ':', '|', '^', ' ']));
            assert!(row.samples >= 10, "criterion needs at least 10 samples ({})", row.key);
            assert!(row.k >= 1);
        }
    }

    #[test]
    fn families_and_sizes_split_on_the_last_underscore() {
        let r = row("async_retain_nosync_64m").unwrap();
        assert_eq!((r.family(), r.size_label()), ("async_retain_nosync", "64m"));
        assert_eq!(row("pool_odd_16441").unwrap().family(), "pool_odd");
        assert_eq!(group_id(Section::Alloc, Peer::CudaMem), "alloc");
        assert_eq!(group_id(Section::Managed, Peer::Cudarc), "cudarc-managed");
        assert_eq!(section_rows(Section::Kernel).count(), 2);
    }
}
