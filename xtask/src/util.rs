//! Paths and process helpers shared by the subcommands.

use std::path::{Path, PathBuf};
use std::process::Command;

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
