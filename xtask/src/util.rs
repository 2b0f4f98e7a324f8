//! Paths and process helpers shared by the subcommands.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub type Result<T = ()> = std::result::Result<T, String>;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// Runs a command, echoing it first; an error names the command.
pub fn run(cmd: &mut Command) -> Result {
    eprintln!("$ {}", describe(cmd));
    let status = cmd.status().map_err(|e| format!("could not start `{}`: {e}", describe(cmd)))?;
    if status.success() { Ok(()) } else { Err(format!("`{}` failed ({status})", describe(cmd))) }
}

/// Runs a command like [`run`], but stops it, with every process it started, once it has run for
/// `limit`: a guard for steps whose length CI must bound.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Result {
    eprintln!("$ {}", describe(cmd));
    let mut child = cmd.spawn().map_err(|e| format!("could not start `{}`: {e}", describe(cmd)))?;
    let started = Instant::now();
    loop {
        let status = child.try_wait().map_err(|e| format!("`{}`: {e}", describe(cmd)))?;
        if let Some(status) = status {
            return if status.success() { Ok(()) } else { Err(format!("`{}` failed ({status})", describe(cmd))) };
        }
        if started.elapsed() >= limit {
            // Children first, found before any is killed (an orphan's parent changes).
            let mut tree = descendants(child.id());
            tree.reverse();
            tree.push(child.id());
            for pid in tree {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).output();
            }
            let _ = child.wait();
            return Err(format!("`{}` ran past its bound of {} s and was stopped", describe(cmd), limit.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The processes `pid` started, and theirs, parents before children (Linux's /proc; none
/// elsewhere).
fn descendants(pid: u32) -> Vec<u32> {
    // Each thread lists the children it started.
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    let children: Vec<u32> = threads
        .filter_map(|thread| std::fs::read_to_string(thread.path().join("children")).ok())
        .flat_map(|list| list.split_whitespace().filter_map(|c| c.parse().ok()).collect::<Vec<u32>>())
        .collect();
    children.into_iter().flat_map(|c| [vec![c], descendants(c)].concat()).collect()
}

/// Runs a command and returns its stdout; an error names the command and carries its stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().map_err(|e| format!("could not start `{}`: {e}", describe(cmd)))?;
    if !out.status.success() {
        return Err(format!("`{}` failed ({}): {}", describe(cmd), out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Number of NVIDIA GPUs `nvidia-smi -L` lists (0 without a driver).
pub fn gpu_count() -> usize {
    Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or(0, |o| String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.starts_with("GPU ")).count())
}

/// True when an NVIDIA driver and at least one device are visible.
pub fn gpu_present() -> bool {
    gpu_count() > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound stops the command and what it started: here a shell and its `sleep`.
    #[test]
    fn a_command_past_its_bound_is_stopped_with_its_children() {
        let pid_file = std::env::temp_dir().join(format!("xtask-bounded-{}", std::process::id()));
        let script = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
        let err = run_bounded(Command::new("sh").args(["-c", &script]), Duration::from_secs(1)).unwrap_err();
        assert!(err.contains("ran past its bound of 1 s"), "{err}");
        let sleep = std::fs::read_to_string(&pid_file).unwrap();
        let _ = std::fs::remove_file(&pid_file);
        // Killed, it is gone once reaped (a liveness bound, not a timing: ten seconds is ages).
        let stat = format!("/proc/{}/stat", sleep.trim());
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z ")) {
            assert!(Instant::now() < deadline, "the command's child outlived the bound");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(run_bounded(Command::new("true").arg("x"), Duration::from_secs(60)).is_ok());
        assert!(run_bounded(&mut Command::new("false"), Duration::from_secs(60)).unwrap_err().contains("failed"));
    }
}
