//! The row catalogue: every measured row, its section, unit, batch size K and sample count.
//!
//! The benchmarks take K and the sample count from here, and so does the C++ program:
//! `build.rs` writes [`ROWS`] into its `plans.h` (one row per line, K and samples last).

/// A group of rows: one table in the report, one criterion group in the benchmark. `Features`
/// ([`crate::features`]) has no C++ counterpart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Alloc,
    Bandwidth,
    Kernel,
    Managed,
    Features,
}

impl Section {
    /// The sections with a raw C++ counterpart, in report order.
    pub const ALL: [Section; 4] = [Section::Alloc, Section::Bandwidth, Section::Kernel, Section::Managed];

    /// The criterion group of the cuda-mem rows, and the C++ program's section argument.
    pub fn name(self) -> &'static str {
        match self {
            Section::Alloc => "alloc",
            Section::Bandwidth => "bandwidth",
            Section::Kernel => "kernel",
            Section::Managed => "managed",
            Section::Features => "features",
        }
    }

    /// The table heading in the report.
    pub fn title(self) -> &'static str {
        match self {
            Section::Alloc => "Allocation + free pairs (µs per pair, lower is better)",
            Section::Bandwidth => "Copies of 256 MiB (GB/s, higher is better)",
            Section::Kernel => "Streaming-read kernel (GB/s, higher is better)",
            Section::Managed => "Managed memory, 1 GiB read by the GPU (GB/s, higher is better)",
            Section::Features => "Beyond raw CUDA: pinned pool, staged copies, resource adaptors",
        }
    }
}

/// Who performed the operations of a criterion benchmark: cuda-mem, cudarc 0.19.10 (a peer), or
/// the runtime called directly through `cuda_mem::sys` from the benchmark process (which
/// separates the wrapper's cost from the process's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    CudaMem,
    Cudarc,
    Ffi,
}

/// The criterion group of a section's rows: `alloc`, `cudarc-alloc`, `ffi-alloc`, ... The
/// function id is the row key, so samples are at `<criterion dir>/<group>/<key>/new/sample.json`.
pub fn group_id(section: Section, peer: Peer) -> String {
    match peer {
        Peer::CudaMem => section.name().to_string(),
        Peer::Cudarc => format!("cudarc-{}", section.name()),
        Peer::Ffi => format!("ffi-{}", section.name()),
    }
}

/// The unit of a row's figure: µs per operation (lower is better) or GB/s, 1e9 bytes per second
/// (higher is better).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Micros,
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
    /// The C++ program's `key` and the criterion function id.
    pub key: &'static str,
    /// The table it belongs to.
    pub section: Section,
    /// The unit of its figure.
    pub unit: Unit,
    /// Operations per sample.
    pub k: u32,
    /// Samples (after one warm-up sample).
    pub samples: u32,
    /// Bytes one operation allocates, copies or reads.
    pub bytes: u64,
}

impl Row {
    /// The family: the key without its size suffix (`async_retain_nosync_64m` → `async_retain_nosync`).
    pub fn family(&self) -> &'static str {
        self.key.rsplit_once('_').map_or(self.key, |(family, _)| family)
    }
}

pub(crate) const MIB: u64 = 1 << 20;
/// Bytes of every host/device copy row.
pub const COPY_BYTES: u64 = 256 * MIB;

pub(crate) const fn alloc(key: &'static str, bytes: u64, k: u32, samples: u32) -> Row {
    Row { key, section: Section::Alloc, unit: Unit::Micros, k, samples, bytes }
}

const fn copy(key: &'static str, k: u32, samples: u32) -> Row {
    read(Section::Bandwidth, key, COPY_BYTES, k, samples)
}

const fn read(section: Section, key: &'static str, bytes: u64, k: u32, samples: u32) -> Row {
    Row { key, section, unit: Unit::GigabytesPerSecond, k, samples, bytes }
}

/// Every row with a raw C++ counterpart, in report order.
pub const ROWS: &[Row] = &[
    alloc("malloc_4k", 4096, 200, 30),
    alloc("malloc_1m", MIB, 200, 30),
    alloc("malloc_64m", 64 * MIB, 200, 30),
    alloc("malloc_host_4k", 4096, 50, 20),
    alloc("malloc_host_1m", MIB, 50, 20),
    alloc("malloc_host_64m", 64 * MIB, 20, 10),
    alloc("host_alloc_portable_4k", 4096, 50, 20),
    alloc("host_alloc_portable_1m", MIB, 50, 20),
    alloc("host_alloc_portable_64m", 64 * MIB, 20, 10),
    alloc("host_alloc_mapped_4k", 4096, 50, 20),
    alloc("host_alloc_mapped_1m", MIB, 50, 20),
    alloc("host_alloc_mapped_64m", 64 * MIB, 20, 10),
    alloc("host_alloc_wc_4k", 4096, 50, 20),
    alloc("host_alloc_wc_1m", MIB, 50, 20),
    alloc("host_alloc_wc_64m", 64 * MIB, 20, 10),
    alloc("managed_4k", 4096, 200, 30),
    alloc("managed_1m", MIB, 100, 20),
    alloc("managed_64m", 64 * MIB, 10, 10),
    alloc("async_default_sync_4k", 4096, 200, 30),
    alloc("async_default_sync_1m", MIB, 200, 30),
    alloc("async_default_sync_64m", 64 * MIB, 200, 30),
    alloc("async_retain_sync_4k", 4096, 200, 30),
    alloc("async_retain_sync_1m", MIB, 200, 30),
    alloc("async_retain_sync_64m", 64 * MIB, 200, 30),
    alloc("async_retain_nosync_4k", 4096, 200, 50),
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
    read(Section::Kernel, "read_device_1g", 1024 * MIB, 10, 30),
    read(Section::Kernel, "read_mapped_256m", COPY_BYTES, 1, 20),
    read(Section::Managed, "managed_first_read_fault_1g", 1024 * MIB, 1, 10),
    read(Section::Managed, "managed_first_read_prefetch_1g", 1024 * MIB, 1, 10),
    read(Section::Managed, "managed_first_read_advise_prefetch_1g", 1024 * MIB, 1, 10),
    read(Section::Managed, "managed_resident_read_1g", 1024 * MIB, 10, 30),
];

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

    #[test]
    fn keys_are_unique_and_criterion_safe() {
        for (i, row) in ROWS.iter().enumerate() {
            assert!(ROWS[..i].iter().all(|r| r.key != row.key), "duplicate key {}", row.key);
            // criterion replaces these characters in directory names; keys must survive unchanged.
            assert!(!row.key.contains(['?', '"', '/', '\\', '*', '<', '>', ':', '|', '^', ' ']));
            assert!(row.samples >= 10 && row.k >= 1, "criterion needs 10 samples ({})", row.key);
        }
        assert_eq!(row("pool_odd_16441").unwrap().family(), "pool_odd");
        assert_eq!(group_id(Section::Managed, Peer::Cudarc), "cudarc-managed");
    }
}
