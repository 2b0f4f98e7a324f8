//! # cuda-mem-bench
//!
//! Benchmarks of every cuda-mem allocation family against a raw CUDA C++ reference measured the
//! same way in the same run, with cudarc as an optional peer, and the `report` that joins them.
//!
//! ## Pieces
//!
//! | piece | what it is |
//! |---|---|
//! | `reference/raw_reference.cu` | plain CUDA C++ (no Rust), compiled by `build.rs` with nvcc into `raw_reference`; prints one JSON object per line |
//! | `benches/families.rs` | criterion benchmark (`harness = false`) of the same rows through cuda-mem, and through cudarc with the `cudarc` feature |
//! | `reference/alloc_batches.h`, `reference/in_process.cpp` | the C++ allocation batches `raw_reference` runs, also compiled (by `build.rs`, host C++ compiler) into this crate: [`in_process`] |
//! | `benches/paired.rs` | cuda-mem and those raw C++ batches interleaved in one process, and the adaptors against the resource they wrap ([`paired`]); JSON lines |
//! | `src/bin/report.rs` | joins both by key and writes `report.md`, `results.json`, `latency.svg`, `bandwidth.svg` |
//!
//! ## Measurement method (both sides)
//!
//! One warm-up sample, then N samples. A sample runs an optional untimed setup (only the managed
//! first-read rows have one: the CPU writes the 1 GiB buffer), then K operations timed with the
//! host's monotonic clock (`std::chrono::steady_clock` / `std::time::Instant`). K and N are fixed
//! per row in [`rows::ROWS`] and in the C++ program's `PLANS` (a unit test keeps them equal). The
//! figure is the **median over samples of (sample time / K)**: µs per operation, or bytes / that
//! time in GB/s (1 GB = 1e9 bytes, bytes counted once).
//!
//! In criterion this is `iter_custom`, where one criterion iteration is one batch of K operations,
//! with `SamplingMode::Flat`, a 1 ns warm-up time (criterion then runs exactly one warm-up batch)
//! and a 1 ns measurement time (criterion then runs exactly one batch per sample and prints a
//! harmless "Unable to complete N samples" warning for every row). The report recomputes the figure
//! from criterion's raw samples, `<criterion dir>/<group>/<key>/new/sample.json`
//! (`{"sampling_mode","iters","times"}`, times in ns), as the median of
//! `times[i] / (iters[i] × K)` — the same statistic as the C++ program's.
//!
//! ## Benchmark ids
//!
//! Criterion group = section ([`rows::Section::name`]: `alloc`, `bandwidth`, `kernel`,
//! `managed`), function id = the row key, equal to the C++ program's `key`. cudarc's rows use the
//! groups `cudarc-alloc`, `cudarc-bandwidth`, ... with the same function ids
//! ([`rows::group_id`]). The group `ffi-alloc` holds diagnostic rows: the stream-ordered alloc
//! rows with the runtime called directly through `cuda_mem::sys` in the benchmark process; the
//! report shows them as a column, because sub-µs rows differ more between two processes (on the
//! H200 hosts, in either program: the report's noise column) than cuda-mem differs from a direct
//! call.
//!
//! ## Ratios
//!
//! µs rows: cuda-mem / raw; GB/s rows: raw / cuda-mem. Above 1 always means slower than raw CUDA;
//! rows above [`stats::TARGET_RATIO`] (1.02) are flagged. Where the `paired` benchmark measured a
//! row, its same-process ratio is the one judged ([`join::ReportRow::judged_ratio`]): two runs of
//! the same C++ program differ by more than any wrapper costs on sub-µs and pinned rows (the
//! report's noise column), interleaving in one process does not.

// The in-process C++ and CUDA batches (`in_process`) call the CUDA runtime, so every binary that
// links this crate must link cudart: naming cuda-mem-sys makes rustc link it (and its cudart)
// even into binaries that never call CUDA, such as `report`.
use cuda_mem_sys as _;

pub mod api_time;
pub mod claims;
pub mod cli;
pub mod date;
pub mod features;
pub mod in_process;
pub mod inputs;
pub mod join;
pub mod paired;
pub mod plots;
pub mod render;
pub mod rows;
pub mod stats;

/// Whether `benches/families.rs` measures the rows that need the streaming-read kernel
/// ([`rows::Row::needs_kernel`], through cuda-mem-kernels' `stream_read_u32`). The report uses it
/// to explain missing cuda-mem figures of those rows.
pub const BENCH_HAS_KERNEL_ROWS: bool = true;

/// Where `build.rs` put the `raw_reference` executable (empty when built for docs.rs).
pub const RAW_REFERENCE_PATH: &str = env!("RAW_REFERENCE_PATH");
