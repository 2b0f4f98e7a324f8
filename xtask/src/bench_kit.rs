//! What `./run --bench` needs in the bundle beside the executables: `bench/sections.sh` (the
//! sections, sourced by the run script), the peers in `peers/` (PyTorch scripts, the workload
//! replayers, and RMM's programs where `cuda-mem-bench/peers/build_rmm.sh` built them into
//! `target/peers/rmm`), and `commit.txt`, the commit the bundle was built from.

use crate::util::{self, Result};
use std::path::Path;
use std::process::Command;

/// The sections script (`bench/sections.sh` in the bundle).
pub const SECTIONS_SCRIPT: &str = include_str!("bench_sections.sh");

/// The peers' files: where they live in the repository, where they go under `peers/`.
const PEER_FILES: [(&str, &str); 10] = [
    ("docs/reference/torch_alloc.py", "torch_alloc.py"),
    ("cuda-mem-bench/peers/torch_alloc_mt.py", "torch_alloc_mt.py"),
    ("cuda-mem-bench/peers/torch_copies.py", "torch_copies.py"),
    ("cuda-mem-bench/peers/torch_snapshot.py", "torch_snapshot.py"),
    ("cuda-mem-bench/peers/torch_graph.py", "torch_graph.py"),
    ("docs/reference/torch_allreduce.py", "torch_allreduce.py"),
    ("cuda-mem-bench/workloads/torch_replay.py", "workloads/torch_replay.py"),
    // torch_replay.py compiles its extension around this header, found beside the script.
    ("cuda-mem-bench/workloads/replay.h", "workloads/replay.h"),
    ("cuda-mem-bench/workloads/run_training.sh", "workloads/run_training.sh"),
    ("cuda-mem-bench/workloads/torch_training.py", "workloads/torch_training.py"),
];

/// Adds the sections script, the peers and `commit.txt` to the bundle in `dir`.
pub fn add(dir: &Path) -> Result {
    let write =
        |path: &Path, text: &str| std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()));
    write(&dir.join("bench").join("sections.sh"), SECTIONS_SCRIPT)?;
    let root = util::workspace_root();
    for (from, to) in PEER_FILES {
        let to = dir.join("peers").join(to);
        std::fs::create_dir_all(to.parent().expect("a file has a folder")).map_err(|e| e.to_string())?;
        std::fs::copy(root.join(from), &to).map_err(|e| format!("copy {from}: {e}"))?;
    }
    // torch_memory_saver's wheel, the `sleep` section's peer, where one was downloaded.
    let peers = util::target_dir().join("peers");
    for entry in std::fs::read_dir(&peers).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("torch_memory_saver-") && name.ends_with(".whl") {
            std::fs::copy(entry.path(), dir.join("peers").join(&name)).map_err(|e| format!("copy {name}: {e}"))?;
        }
    }
    let rmm = util::target_dir().join("peers").join("rmm");
    if rmm.is_dir() {
        std::fs::create_dir_all(dir.join("peers/rmm")).map_err(|e| e.to_string())?;
        for entry in std::fs::read_dir(&rmm).map_err(|e| format!("{}: {e}", rmm.display()))?.flatten() {
            std::fs::copy(entry.path(), dir.join("peers/rmm").join(entry.file_name()))
                .map_err(|e| format!("copy {}: {e}", entry.path().display()))?;
        }
    } else {
        eprintln!(
            "note: no RMM peer in the bundle ({} is missing: run cuda-mem-bench/peers/build_rmm.sh); its rows will say so",
            rmm.display()
        );
    }
    let commit = util::output(Command::new("git").args(["rev-parse", "--short", "HEAD"]).current_dir(&root))
        .unwrap_or_else(|_| "unknown".into());
    write(&dir.join("commit.txt"), commit.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A bundle of stand-ins for `./run --bench`: examples printing a line each, a report that
    /// lists its arguments, peers that exist or not, and `python3` without PyTorch.
    struct FakeBench {
        dir: PathBuf,
    }

    fn write(path: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    const EXAMPLES: [&str; 10] = [
        "cache_pairs",
        "workloads",
        "decode_graph",
        "async_server",
        "loader",
        "staged_tuning",
        "snapshot_dump",
        "allreduce",
        "write_corpus",
        "sleep_wake",
    ];

    impl FakeBench {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("xtask-bench-kit-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            for example in EXAMPLES {
                // Prints its name and arguments; `workloads OUT` also writes a corpus file.
                write(
                    &dir.join("examples").join(example),
                    &format!(
                        "#!/bin/sh\necho \"{example} $*\"\n[ {example} = workloads ] && touch \"$1/churn.cmwl\"\nexit 0\n"
                    ),
                );
            }
            for bench in ["raw_reference", "families-1", "paired-2", "report"] {
                write(&dir.join("bench").join(bench), "#!/bin/sh\necho '{\"key\":\"x\"}'\n");
            }
            write(&dir.join("bench/bench_report"), "#!/bin/sh\necho \"bench_report $*\" > \"$BENCH_LOG\"\n");
            write(&dir.join("bench/sections.sh"), SECTIONS_SCRIPT);
            write(&dir.join("commit.txt"), "abc1234");
            write(&dir.join("peers/torch_alloc.py"), "");
            write(&dir.join("bin/python3"), "#!/bin/sh\nexit 1\n");
            write(&dir.join("bin/nvidia-smi"), "#!/bin/sh\necho 'NVIDIA H200, 580.159.04, 143771 MiB'\n");
            write(&dir.join("bin/ldconfig"), "#!/bin/sh\nexit 0\n");
            write(&dir.join("run"), crate::bundle::RUN_SCRIPT);
            FakeBench { dir }
        }

        /// Runs `./run ARGS`: whether it succeeded, and its output.
        fn run(&self, args: &[&str]) -> (bool, String) {
            self.run_with(&[], args)
        }

        /// Runs `./run ARGS` with more environment variables.
        fn run_with(&self, env: &[(&str, &str)], args: &[&str]) -> (bool, String) {
            let path = crate::bundle::path_with_first(&self.dir.join("bin"));
            let output = Command::new(self.dir.join("run"))
                .args(args)
                .envs(env.iter().copied())
                .env("PATH", path)
                .env("BENCH_LOG", self.dir.join("report.log"))
                .env_remove("CUDA_MEM_NCCL_LIB")
                .output()
                .unwrap();
            let text =
                format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
            (output.status.success(), text)
        }

        fn read(&self, path: &str) -> String {
            std::fs::read_to_string(self.dir.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
        }
    }

    impl Drop for FakeBench {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn only_the_named_sections_run_each_into_its_folder_then_the_report() {
        let bench = FakeBench::new("only");
        let out = bench.dir.join("out");
        let (ok, text) = bench.run(&["--bench", out.to_str().unwrap(), "--only", "snapshot,graphs"]);
        assert!(ok, "{text}");
        let mut folders: Vec<String> =
            std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        folders.sort();
        assert_eq!(folders, ["graphs", "snapshot"]);
        assert_eq!(bench.read("out/snapshot/snapshot_dump.txt"), "snapshot_dump \n");
        assert_eq!(bench.read("out/graphs/decode_graph.txt"), "decode_graph \n");
        let meta: serde_json::Value = serde_json::from_str(&bench.read("out/graphs/section.json")).unwrap();
        assert_eq!(meta["section"], "graphs");
        assert_eq!(meta["rc"], 0);
        assert_eq!(meta["commit"], "abc1234");
        assert_eq!(meta["gpu"], "NVIDIA H200, 580.159.04, 143771 MiB");
        let report = bench.read("report.log");
        assert!(report.starts_with(&format!(
            "bench_report --raw {} --out {}/report --date ",
            out.display(),
            out.display()
        )));
    }

    #[test]
    fn peers_that_cannot_run_leave_a_reason_and_the_section_still_succeeds() {
        let bench = FakeBench::new("peers");
        let out = bench.dir.join("out");
        let (ok, text) = bench.run(&["--bench", out.to_str().unwrap(), "--only", "cache,threads,workloads,nccl,sleep"]);
        assert!(ok, "{text}");
        assert_eq!(bench.read("out/cache/cache_pairs.jsonl"), "cache_pairs --only pairs\n");
        assert_eq!(bench.read("out/threads/cache_pairs.jsonl"), "cache_pairs --only threads --threads 1,2,4,8,16\n");
        assert!(bench.read("out/cache/torch.missing").starts_with("PyTorch with CUDA is not installed"));
        assert!(bench.read("out/cache/rmm.missing").starts_with("no peers/rmm/rmmbench"));
        assert!(bench.read("out/threads/torch_mt.missing").contains("no peers/torch_alloc_mt.py in this bundle"));
        assert!(bench.read("out/workloads/rmm.missing").starts_with("no peers/rmm/rmm_replay"));
        assert!(bench.read("out/workloads/torch_exp.missing").starts_with("no peers/workloads/torch_replay.py"));
        assert!(bench.read("out/workloads/cuda_mem.jsonl").starts_with("workloads /"));
        assert!(bench.read("out/nccl/allreduce.missing").starts_with("no libnccl.so.2"));
        assert_eq!(bench.read("out/sleep/sleep_wake.jsonl"), "sleep_wake 40 3\n");
        assert!(bench.read("out/sleep/tms.missing").starts_with("no torch_memory_saver wheel in peers"));
        assert!(bench.read("out/sleep/torch_sleep_wake.missing").contains("sleep_wake_compare.py"));
        assert!(text.contains("== peer not measured: rmm: no peers/rmm/rmmbench"), "{text}");
    }

    /// A section that failed (or was cut off) goes on, with BENCH_RESUME=1, from its first step
    /// that did not finish: steps that finished are not run again, the failed one's partial output
    /// is dropped; a section that succeeded is kept whole.
    #[test]
    fn a_resumed_section_keeps_its_finished_steps_and_redoes_the_cut_one() {
        let bench = FakeBench::new("resume");
        let runs = bench.dir.join("raw_reference.runs");
        write(
            &bench.dir.join("bench/raw_reference"),
            &format!("#!/bin/sh\necho run >> {}\necho '{{\"key\":\"raw\"}}'\n", runs.display()),
        );
        // The paired program prints a row, then dies until a file says otherwise.
        let healed = bench.dir.join("healed");
        write(
            &bench.dir.join("bench/paired-2"),
            &format!("#!/bin/sh\necho '{{\"key\":\"paired\"}}'\n[ -f {} ] || exit 9\n", healed.display()),
        );
        let out = bench.dir.join("out");
        let args = ["--bench", out.to_str().unwrap(), "--only", "paired,snapshot"];
        let resume = [("BENCH_RESUME", "1"), ("BENCH_REPORT", "0")];
        let (ok, text) = bench.run_with(&resume, &args);
        assert!(!ok, "{text}");
        assert!(bench.read("out/paired/section.json").contains("\"rc\":1"));
        std::fs::write(&healed, "").unwrap();
        // raw_reference runs twice in the section (its rows, then a second pass over two families).
        assert_eq!(bench.read("raw_reference.runs"), "run\nrun\n");
        let snapshot_before = bench.read("out/snapshot/section.json");
        let (ok, text) = bench.run_with(&resume, &args);
        assert!(ok, "{text}");
        assert!(text.contains("(finished by an earlier run: kept)"), "{text}");
        assert!(text.contains("== section snapshot finished before: kept"), "{text}");
        assert_eq!(bench.read("raw_reference.runs"), "run\nrun\n", "a finished step ran again");
        assert_eq!(
            bench.read("out/paired/paired.jsonl"),
            "{\"key\":\"paired\"}\n",
            "the cut step's partial rows stayed"
        );
        assert_eq!(bench.read("out/snapshot/section.json"), snapshot_before);
        let meta: serde_json::Value = serde_json::from_str(&bench.read("out/paired/section.json")).unwrap();
        assert_eq!(meta["rc"], 0);
        let marks: Vec<_> = std::fs::read_dir(out.join("paired"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(marks.is_empty(), "{marks:?}");
    }

    /// `./run --python-wheel WHEEL` installs the wheel apart and runs the Python tests from a
    /// folder without python/'s own modules (the package and `cuda_mem_torch.py`), over the
    /// installed ones; the scripts the tests start come along.
    #[test]
    fn the_python_tests_run_over_the_package_a_wheel_installs() {
        let bench = FakeBench::new("python-wheel");
        for file in [
            "python/tests/test_x.py",
            "python/conftest.py",
            "python/run_tests.py",
            "python/torch_sleep_wake.py",
            "python/cuda_mem/__init__.py",
            "python/cuda_mem_torch.py",
        ] {
            write(&bench.dir.join(file), "");
        }
        let log = bench.dir.join("python3.log");
        write(
            &bench.dir.join("bin/python3"),
            &format!(
                "#!/bin/sh\necho \"$PWD|${{PYTHONPATH:-}}|$*\" >> {}\n\
                 if [ \"$1 $2\" = \"-m pip\" ]; then shift 2; while [ \"$1\" != --target ]; do shift; done; mkdir -p \"$2/cuda_mem\"; fi\n",
                log.display()
            ),
        );
        let wheel = bench.dir.join("dist/cuda_mem-0.1.0-cp39-abi3-linux_x86_64.whl");
        write(&wheel, "");
        let (ok, text) = bench.run(&["--python-wheel", wheel.to_str().unwrap(), "-k", "torch"]);
        assert!(ok, "{text}");
        let calls = bench.read("python3.log");
        let calls: Vec<&str> = calls.lines().collect();
        let install = calls.iter().find(|c| c.contains("-m pip install")).expect("pip ran");
        assert!(install.ends_with(&format!("{}", wheel.display())), "{install}");
        let site = install.split("--target ").nth(1).unwrap().split(' ').next().unwrap();
        let pytest = calls.iter().find(|c| c.contains("-m pytest")).expect("pytest ran");
        let [cwd, path, args] = pytest.splitn(3, '|').collect::<Vec<_>>()[..] else { panic!("{pytest}") };
        assert_eq!(format!("{cwd}/site"), site, "the tests run beside the installed package");
        let cwd = std::path::Path::new(cwd);
        assert!(!cwd.join("cuda_mem").exists(), "no package of the bundle beside the tests");
        assert!(!cwd.join("cuda_mem_torch.py").exists(), "no module of the bundle beside the tests");
        assert!(cwd.join("torch_sleep_wake.py").exists(), "the scripts the tests start are there");
        assert!(path.starts_with(site), "{path}");
        assert!(args.ends_with("tests -k torch"), "{args}");
        let (ok, text) = bench.run(&["--python-wheel", "dist/missing.whl"]);
        assert!(!ok && text.contains("no wheel at 'dist/missing.whl'"), "{text}");
    }

    /// A resumed section must go on where it began: same GPU, same commit.
    #[test]
    fn a_section_begun_on_another_commit_is_not_resumed() {
        let bench = FakeBench::new("resume-elsewhere");
        write(&bench.dir.join("examples/snapshot_dump"), "#!/bin/sh\nexit 4\n");
        let out = bench.dir.join("out");
        let args = ["--bench", out.to_str().unwrap(), "--only", "snapshot"];
        let resume = [("BENCH_RESUME", "1"), ("BENCH_REPORT", "0")];
        assert!(!bench.run_with(&resume, &args).0);
        write(&bench.dir.join("commit.txt"), "def5678");
        let (ok, text) = bench.run_with(&resume, &args);
        assert!(!ok, "{text}");
        assert!(text.contains("was begun on NVIDIA H200, 580.159.04, 143771 MiB abc1234, not"), "{text}");
    }

    #[test]
    fn a_failing_program_fails_the_run_and_its_section_records_it() {
        let bench = FakeBench::new("fail");
        write(&bench.dir.join("examples/loader"), "#!/bin/sh\necho 'loader: no GPU' >&2\nexit 3\n");
        let out = bench.dir.join("out");
        let (ok, text) = bench.run(&["--bench", out.to_str().unwrap(), "--only", "async,staged"]);
        assert!(!ok, "{text}");
        assert!(text.contains("examples/loader failed (3)"), "{text}");
        assert!(bench.read("out/async/loader.log").contains("loader: no GPU"));
        let meta = |s: &str| -> serde_json::Value {
            serde_json::from_str(&bench.read(&format!("out/{s}/section.json"))).unwrap()
        };
        assert_eq!((meta("async")["rc"].as_i64(), meta("staged")["rc"].as_i64()), (Some(1), Some(0)));
        // Without BENCH_RESUME a failed section leaves no marks among its raw outputs.
        let hidden = std::fs::read_dir(out.join("async"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with('.'))
            .count();
        assert_eq!(hidden, 0);
    }

    /// A peer that fails leaves its reason in `PEER.missing` and its section's exit code alone;
    /// PyTorch with expandable segments replays each workload file in a process of its own.
    #[test]
    fn a_failing_peer_does_not_fail_its_section_and_expandable_replays_run_one_file_each() {
        let bench = FakeBench::new("peer-fails");
        // PyTorch present; its replayer prints a row per file, then crashes as it exits.
        write(
            &bench.dir.join("bin/python3"),
            "#!/bin/sh\n[ \"$1\" = -c ] && exit 0\nshift\nfor f in \"$@\"; do echo \"row $f\"; done\nexit 139\n",
        );
        write(&bench.dir.join("peers/workloads/torch_replay.py"), "");
        write(
            &bench.dir.join("examples/workloads"),
            "#!/bin/sh\necho \"workloads $*\"\ntouch \"$1/churn.cmwl\" \"$1/mixed.cmwl\"\n",
        );
        write(&bench.dir.join("peers/rmm/rmm_replay"), "#!/bin/sh\nexit 5\n");
        let out = bench.dir.join("out");
        let (ok, text) = bench.run(&["--bench", out.to_str().unwrap(), "--only", "workloads"]);
        assert!(ok, "{text}");
        let meta: serde_json::Value = serde_json::from_str(&bench.read("out/workloads/section.json")).unwrap();
        assert_eq!(meta["rc"], 0);
        assert!(bench.read("out/workloads/rmm.missing").starts_with("rmm_replay failed"));
        let rows = |file: &str| bench.read(&format!("out/workloads/{file}")).lines().count();
        assert_eq!((rows("torch.jsonl"), rows("torch_exp.jsonl")), (2, 2));
        let runs = |file: &str| bench.read(&format!("out/workloads/{file}")).matches("== python3 ").count();
        assert_eq!((runs("torch.log"), runs("torch_exp.log")), (1, 2));
    }

    /// A peer that includes a local header (`#include "replay.h"` in a C++ source compiled on the
    /// GPU host) finds it beside itself in the bundle.
    #[test]
    fn every_local_header_a_peer_includes_travels_beside_it() {
        let root = util::workspace_root();
        for (from, to) in PEER_FILES {
            let text = std::fs::read_to_string(root.join(from)).unwrap();
            let folder = Path::new(to).parent().unwrap();
            for header in quoted_includes(&text) {
                let wanted = folder.join(&header);
                assert!(
                    PEER_FILES.iter().any(|(_, t)| Path::new(t) == wanted),
                    "{from} includes \"{header}\", which the bundle does not copy to peers/{}",
                    wanted.display()
                );
            }
        }
    }

    /// The quoted includes of a text: `#include "NAME"`.
    fn quoted_includes(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("#include \""))
            .filter_map(|rest| rest.split_once('"').map(|(name, _)| name.to_string()))
            .collect()
    }

    #[test]
    fn an_unknown_section_is_refused_before_anything_runs() {
        let bench = FakeBench::new("unknown");
        let out = bench.dir.join("out");
        let (ok, text) = bench.run(&["--bench", out.to_str().unwrap(), "--only", "cache,gpaphs"]);
        assert!(!ok);
        assert!(text.contains("no section 'gpaphs'"), "{text}");
        assert!(!out.join("cache").exists(), "nothing ran");
    }
}
