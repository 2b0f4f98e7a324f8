//! `cargo xtask bench [--only SECTION,..]`: on a GPU host, the main job's benchmarks, the
//! sections of the bundle's `run --bench` (which GPU hosts without Rust use), into
//! `target/cuda-mem-report/SECTION/`, then the report in `target/cuda-mem-report/report/`. The
//! `paired` section (raw C++ reference, criterion, the same-process comparison and its report)
//! runs here with a progress bar per step; the others through the bundle's script.

use crate::util::{self, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The sections, in order, as the bundle's sections script names them.
pub fn sections() -> Vec<&'static str> {
    let line = crate::bench_kit::SECTIONS_SCRIPT
        .lines()
        .find_map(|l| l.strip_prefix("BENCH_SECTIONS="))
        .expect("bench_sections.sh sets BENCH_SECTIONS");
    line.trim_matches('"').split_whitespace().collect()
}

/// The sections `--only` names (all when `None`), in the script's order; an unknown name is an
/// error that lists the known ones.
pub fn selected(only: Option<&str>) -> Result<Vec<&'static str>> {
    let all = sections();
    let Some(only) = only else { return Ok(all) };
    let named: Vec<&str> = only.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if let Some(unknown) = named.iter().find(|n| !all.contains(n)) {
        return Err(format!("no section '{unknown}' (sections: {})", all.join(", ")));
    }
    Ok(all.into_iter().filter(|s| named.contains(s)).collect())
}

pub fn run(only: Option<&str>) -> Result {
    let sections = selected(only)?;
    if !util::gpu_present() {
        return Err("no NVIDIA GPU is visible on this host (`nvidia-smi -L` lists none), so there is nothing to \
                    benchmark: run `cargo xtask bench` on a GPU host, or `cargo xtask bundle` here and \
                    `target/bundle/run --bench OUT [--only SECTION,..]` there"
            .into());
    }
    let bundle = crate::bundle::run()?;
    let out = util::target_dir().join("cuda-mem-report");
    std::fs::create_dir_all(&out).map_err(|e| format!("create {}: {e}", out.display()))?;
    let today = util::output(Command::new("date").args(["-u", "+%F"]))?.trim().to_string();
    let mut failed = Vec::new();
    if sections.contains(&"paired") {
        let started = util::output(Command::new("date").args(["-u", "+%FT%TZ"]))?.trim().to_string();
        let clock = std::time::Instant::now();
        let result = paired(&bundle.join("bench"), &out.join("paired"), &today);
        let meta = serde_json::json!({
            "section": "paired",
            "started": started,
            "seconds": clock.elapsed().as_secs(),
            "rc": i32::from(result.is_err()),
            "gpu": util::output(Command::new("nvidia-smi").args(["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])).unwrap_or_default().lines().next().unwrap_or_default(),
            "commit": std::fs::read_to_string(bundle.join("commit.txt")).unwrap_or_default().trim(),
        });
        let _ = std::fs::write(out.join("paired/section.json"), format!("{meta}\n"));
        if let Err(e) = result {
            eprintln!("paired: {e}");
            failed.push("paired");
        }
    }
    let rest: Vec<&str> = sections.iter().copied().filter(|s| *s != "paired").collect();
    if !rest.is_empty() {
        let status = Command::new(bundle.join("run"))
            .arg("--bench")
            .arg(&out)
            .args(["--only", &rest.join(",")])
            .env("BENCH_REPORT", "0")
            .status()
            .map_err(|e| format!("run --bench: {e}"))?;
        if !status.success() {
            failed.push("a section of run --bench (see its output)");
        }
    }
    let report = out.join("report");
    util::run(
        Command::new(bundle.join("bench").join("bench_report"))
            .arg("--raw")
            .arg(&out)
            .arg("--out")
            .arg(&report)
            .args(["--date", &today]),
    )?;
    println!("report written to {}", report.join("report.md").display());
    if failed.is_empty() { Ok(()) } else { Err(format!("failed: {}", failed.join(", "))) }
}

/// The `paired` section into `out`: the raw C++ reference, criterion (cuda-mem, FFI, cudarc),
/// the same-process comparison, its rows over target profiled through CUPTI, a second reference
/// run, and the wrapper report in `out/report`.
fn paired(bench: &Path, out: &Path, today: &str) -> Result {
    std::fs::create_dir_all(out).map_err(|e| format!("create {}: {e}", out.display()))?;
    let families = find(bench, "families-")?;
    let paired = find(bench, "paired-")?;
    let raw = bench.join("raw_reference");

    step("1/6 raw C++ reference", None, Command::new(&raw), Progress::JsonLines, &out.join("raw.jsonl"))?;
    let mut criterion = Command::new(&families);
    criterion.arg("--bench").env("CRITERION_HOME", out.join("criterion"));
    let rows = listed(&families)?;
    step(
        "2/6 criterion (cuda-mem, FFI, cudarc)",
        Some(rows),
        criterion,
        Progress::Criterion,
        &out.join("criterion.log"),
    )?;
    let mut same_process = Command::new(&paired);
    same_process.arg("--bench");
    step(
        "3/6 same process, interleaved",
        Some(listed(&paired)?),
        same_process,
        Progress::JsonLines,
        &out.join("paired.jsonl"),
    )?;
    // The profile (time inside CUDA calls, through CUPTI) explains rows over their target, so it
    // runs on those rows only; a host without CUPTI gets the report without it.
    let judged = out.join("paired.jsonl");
    let select = [std::ffi::OsStr::new("--missed"), judged.as_os_str()];
    let mut profiled = Command::new(&paired);
    profiled.args(["--bench", "--api-time"]).args(select);
    let profile = out.join("paired-api.jsonl");
    let with_profile = match step(
        "4/6 rows over target, profiled (CUPTI)",
        Some(listed_with(&paired, &select)?),
        profiled,
        Progress::JsonLines,
        &profile,
    ) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("warning: no CUDA-call profile in the report: {e}");
            false
        }
    };
    let mut rerun = Command::new(&raw);
    rerun.args(["alloc", "managed"]);
    step("5/6 raw C++ again (noise floor)", None, rerun, Progress::JsonLines, &out.join("raw-rerun.jsonl"))?;
    let mut report_command = Command::new(bench.join("report"));
    report_command.arg("--date").arg(today);
    if with_profile {
        report_command.arg("--paired-api").arg(&profile);
    }
    util::run(
        report_command.args(
            ["--raw", "--raw-rerun", "--paired", "--criterion", "--out"]
                .iter()
                .zip([
                    out.join("raw.jsonl"),
                    out.join("raw-rerun.jsonl"),
                    out.join("paired.jsonl"),
                    out.join("criterion"),
                    out.join("report"),
                ])
                .flat_map(|(flag, path)| [PathBuf::from(flag), path]),
        ),
    )
    .map_err(|e| format!("6/6 wrapper report: {e}"))
}

/// How a step's progress shows in its output.
#[derive(Clone, Copy)]
enum Progress {
    /// One JSON object per finished row on stdout.
    JsonLines,
    /// Criterion's "Benchmarking ID: Analyzing" line on stderr per finished row.
    Criterion,
}

/// Runs one step, saving its stdout to `save` and advancing a bar per finished row.
fn step(name: &str, rows: Option<u64>, mut cmd: Command, progress: Progress, save: &Path) -> Result {
    let bar = match rows {
        Some(n) => ProgressBar::new(n).with_style(style("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")),
        None => ProgressBar::new_spinner().with_style(style("{prefix} {spinner} {pos} rows {msg} ({elapsed})")),
    };
    bar.set_prefix(name.to_string());
    let mut file = std::fs::File::create(save).map_err(|e| format!("create {}: {e}", save.display()))?;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{name}: could not start {}: {e}", cmd.get_program().to_string_lossy()))?;
    let stderr = child.stderr.take().expect("piped stderr");
    let stdout = child.stdout.take().expect("piped stdout");
    let errors = std::thread::scope(|scope| {
        let bar = &bar;
        let reader = scope.spawn(move || {
            let mut tail = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
                if let (Progress::Criterion, Some(id)) = (progress, line.strip_suffix(": Analyzing")) {
                    bar.inc(1);
                    bar.set_message(id.trim_start_matches("Benchmarking ").to_string());
                } else if !line.trim().is_empty() && !line.contains("Unable to complete") {
                    tail.push(line);
                }
            }
            tail
        });
        for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
            let _ = writeln!(file, "{line}");
            if let Progress::JsonLines = progress
                && let Some(key) = json_key(&line)
            {
                bar.inc(1);
                bar.set_message(key);
            }
        }
        reader.join().unwrap_or_default()
    });
    let status = child.wait().map_err(|e| e.to_string())?;
    bar.finish();
    if status.success() {
        return Ok(());
    }
    let last: Vec<_> = errors.iter().rev().take(10).rev().cloned().collect();
    Err(format!("{name} failed ({status}); its last messages:\n{}", last.join("\n")))
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).expect("a valid template").progress_chars("=> ")
}

/// The `"key"` of a JSON line, if it is one.
fn json_key(line: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    value.get("key")?.as_str().map(str::to_string)
}

/// How many benchmarks `exe --list` lists.
fn listed(exe: &Path) -> Result<u64> {
    listed_with(exe, &[])
}

/// As [`listed`], with the row-selecting arguments of the run (e.g. `--missed FILE`).
fn listed_with(exe: &Path, args: &[&std::ffi::OsStr]) -> Result<u64> {
    let output = Command::new(exe).arg("--list").args(args).output().map_err(|e| format!("{}: {e}", exe.display()))?;
    let count = String::from_utf8_lossy(&output.stdout).lines().filter(|l| l.ends_with(": benchmark")).count();
    Ok(count as u64)
}

/// The bundle's executable whose name starts with `prefix` (cargo appends a hash).
fn find(dir: &Path, prefix: &str) -> Result<PathBuf> {
    std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(std::result::Result::ok)
        .map(|entry| entry.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix)))
        .ok_or_else(|| format!("{} has no {prefix}* executable: rebuild the bundle", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_the_scripts_and_the_reports() {
        assert_eq!(selected(None).unwrap(), sections());
        assert_eq!(selected(Some("nccl,cache")).unwrap(), ["cache", "nccl"], "the script's order");
        let err = selected(Some("cache,gpaphs")).unwrap_err();
        assert!(err.contains("no section 'gpaphs'") && err.contains("paired, cache, threads"), "{err}");
        // The report generator reads the same sections (cuda-mem-bench/src/suite/mod.rs).
        let suite = std::fs::read_to_string(util::workspace_root().join("cuda-mem-bench/src/suite/mod.rs")).unwrap();
        let listed = suite
            .split("pub const SECTIONS")
            .nth(1)
            .and_then(|r| r.split_once('='))
            .and_then(|(_, r)| r.split(';').next())
            .unwrap();
        let quoted: Vec<&str> = listed.split('"').skip(1).step_by(2).collect();
        assert_eq!(quoted, sections());
    }

    #[test]
    fn json_keys_are_read_from_row_lines_only() {
        assert_eq!(json_key(r#"{"key":"malloc_4k","value":1}"#).as_deref(), Some("malloc_4k"));
        assert_eq!(json_key("Benchmarking alloc/malloc_4k"), None);
        assert_eq!(json_key(r#"{"value":1}"#), None);
    }

    #[test]
    fn steps_save_stdout_and_report_failures_with_stderr() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let save = dir.join("out.jsonl");
        let mut ok = Command::new("sh");
        ok.args(["-c", r#"echo '{"key":"a"}'; echo '{"key":"b"}'"#]);
        step("ok", Some(2), ok, Progress::JsonLines, &save).unwrap();
        assert_eq!(std::fs::read_to_string(&save).unwrap(), "{\"key\":\"a\"}\n{\"key\":\"b\"}\n");
        let mut bad = Command::new("sh");
        bad.args(["-c", "echo 'Benchmarking x: Analyzing' >&2; echo 'row x failed: boom' >&2; exit 3"]);
        let err = step("bad", Some(1), bad, Progress::Criterion, &save).unwrap_err();
        assert!(err.contains("bad failed") && err.contains("row x failed: boom"), "{err}");
        assert!(!err.contains("Analyzing"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
