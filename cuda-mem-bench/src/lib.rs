//! # cuda-mem-bench
//!
//! Benchmarks of every cuda-mem allocation family against a raw CUDA C++ reference measured the
//! same way, with cudarc as an optional peer, and the `report` that joins them.
//!
//! | piece | what it is |
//! |---|---|
//! | `reference/raw_reference.cu` | plain CUDA C++, compiled by `build.rs` with nvcc into `raw_reference`; one JSON object per line |
//! | `benches/families.rs` | criterion benchmark of the same rows through cuda-mem, the runtime called directly (FFI) and, with the `cudarc` feature, cudarc |
//! | `benches/paired.rs` | cuda-mem and the reference's own C++ batches ([`in_process`]) interleaved in one process ([`paired`]): the ratios the target is judged by |
//! | `src/bin/report.rs` | joins them by key ([`join`]) into `report.md`, `results.json`, `latency.svg`, `bandwidth.svg` |
//! | `src/bin/bench_report.rs` | the main job's report ([`suite`]): every section of `./run --bench OUT` beside its peers (PyTorch, RMM, raw C++, cudarc), one row per figure under a stable key, with `speed.svg`, `threads.svg`, `memory.svg` |
//!
//! ## Method (both sides)
//!
//! One warm-up sample, then N samples, each an optional untimed setup (the managed first-read
//! rows: the CPU writes the buffer) and K operations timed with the host's monotonic clock; K and
//! N per row are in [`rows::ROWS`], which `build.rs` also writes into the C++ program. The figure
//! is the median over samples of (sample time / K): µs per operation, or bytes / that time in GB/s
//! (1 GB = 1e9 bytes). In criterion one iteration is one batch of K operations (`iter_custom`,
//! `SamplingMode::Flat`, warm-up and measurement times of 1 ns: one warm-up batch and one batch
//! per sample, with a warning "Unable to complete N samples" for every row); the report
//! recomputes the figure from criterion's samples ([`stats::figure`]). Groups: [`rows::group_id`];
//! function id: the row key.
//!
//! Ratios: µs rows cuda-mem / raw, GB/s rows raw / cuda-mem, so above 1 is slower than raw CUDA;
//! rows above [`stats::TARGET_RATIO`] are flagged. Where `paired` measured a row, its same-process
//! ratio is the one judged ([`join::ReportRow::judged_ratio`]): two runs of the same C++ program
//! differ by more than any wrapper costs on sub-µs and pinned rows (the report's noise column).

// The in-process C++ batches call the CUDA runtime, so every binary that links this crate links
// cudart: naming cuda-mem-sys makes rustc link it, even into `report`, which makes no CUDA call.
use cuda_mem_sys as _;

pub mod api_time;
pub mod cli;
pub mod features;
pub mod in_process;
pub mod inputs;
pub mod join;
pub mod paired;
pub mod plots;
pub mod render;
pub mod replay;
pub mod rows;
pub mod stats;
pub mod suite;
pub mod workload_table;
