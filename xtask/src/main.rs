//! `cargo xtask`: the project's automation. One module per subcommand; flags parsed here.

mod bench;
mod bench_kit;
mod bundle;
mod codegen;
mod figures;
mod fuzz;
mod import_circles;
mod layers;
mod miri;
mod msrv;
mod package;
mod provision;
mod requote;
mod test;
mod tidy;
mod util;
mod wheel;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "cuda-mem automation: provisioning, codegen, tests, benchmarks, bundles, packaging")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install the pinned CUDA wheels (and libclang) under target/ if no toolkit is found.
    Provision,
    /// Regenerate the committed cuda-mem-sys bindings for CUDA 13.0 and 12.9.
    Codegen {
        /// Fail if the committed bindings differ from what the generator produces.
        #[arg(long)]
        check: bool,
    },
    /// fmt check, clippy -D warnings, the whole test suite (GPU tests too where a GPU exists),
    /// the published crates on their declared rust-version, the allocator core under Miri and a
    /// fuzz smoke of every target.
    Test {
        /// On a GPU host: run the GPU test executables under compute-sanitizer memcheck,
        /// racecheck and synccheck instead.
        #[arg(long)]
        sanitize: bool,
    },
    /// The textual rules (layering, unsafe discipline, no hardware figures in comments).
    Tidy,
    /// Run each fuzz target (cargo-fuzz, provisioned; AddressSanitizer where a nightly toolchain
    /// can be had) for a number of executions.
    Fuzz {
        /// Executions per target.
        #[arg(long, default_value_t = 1_000_000)]
        runs: u64,
    },
    /// Run cuda-mem's unit tests under Miri (nightly; its components provisioned through rustup).
    Miri,
    /// `cargo +MSRV check` of the published crates, every feature on, on the rust-version their
    /// manifests declare (that toolchain provisioned through rustup).
    Msrv,
    /// Benchmarks on a GPU host.
    Bench {
        /// Only these sections, comma-separated (paired, cache, threads, workloads, training,
        /// graphs, async, staged, snapshot, nccl, sleep); all by default.
        #[arg(long)]
        only: Option<String>,
    },
    /// Build GPU test executables into target/bundle for a GPU host without Rust.
    Bundle,
    /// Move the documents' quotes of the previous main report to a new one (its dated folder under docs/bench):
    /// figures quoted by row key take the new rows' values; lists what needs a person.
    Requote {
        /// The new report's folder.
        report: std::path::PathBuf,
        /// Rewrite the documents (without it, only print the changes).
        #[arg(long)]
        write: bool,
    },
    /// Build the Python wheel (the cuda_mem package with the PyTorch allocator) into
    /// target/wheels, through the PEP 517 backend pip uses; with --check, install it, and the one
    /// `pip install ./cuda-mem-py` builds, into fresh virtual environments and test them.
    Wheel {
        /// Install the wheel, then `pip install ./cuda-mem-py`, each into a fresh virtual
        /// environment; import it, check the allocator's library and the tag, run the Python tests.
        #[arg(long)]
        check: bool,
    },
    /// `cargo publish --dry-run` of the four published crates, cuda-mem-sys, cuda-mem-cache,
    /// cuda-mem and cuda-mem-kernels (each package built from its packaged files), and a check that
    /// each carries the licence texts and the sys package its bindings.
    Package {
        /// Package uncommitted changes too.
        #[arg(long)]
        allow_dirty: bool,
    },
    /// Replay an allocation log (from LoggingResource) against a resource; prints time, peak
    /// requested and peak reserved bytes.
    Replay {
        /// The log, CSV or JSON lines.
        log: std::path::PathBuf,
        /// pool, cache, device, managed, pinned or pinned-pool.
        #[arg(default_value = "pool")]
        resource: String,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Provision => provision::toolkit().map(|t| println!("CUDA {} at {}", t.version, t.root.display())),
        Command::Codegen { check } => codegen::run(check),
        Command::Test { sanitize: false } => test::run(),
        Command::Test { sanitize: true } => test::sanitize(),
        Command::Tidy => tidy::run(),
        Command::Fuzz { runs } => fuzz::run(runs),
        Command::Miri => miri::run(),
        Command::Msrv => msrv::run(),
        Command::Bench { only } => bench::run(only.as_deref()),
        Command::Requote { report, write } => requote::run(&report, write),
        Command::Bundle => bundle::run().map(|dir| println!("bundle written to {}", dir.display())),
        Command::Wheel { check } => wheel::run().and_then(|wheel| {
            println!("wheel written to {}", wheel.display());
            if check { wheel::check_installed(&wheel) } else { Ok(()) }
        }),
        Command::Package { allow_dirty } => package::run(allow_dirty),
        Command::Replay { log, resource } => provision::toolkit().and_then(|_| {
            util::run(
                util::cargo()
                    .args(["run", "--release", "-p", "cuda-mem-bench", "--example", "replay", "--"])
                    .arg(log)
                    .arg(resource),
            )
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
