//! `cargo xtask msrv`: the published crates ([`crate::package::PUBLISHED`]) checked, every feature
//! on, with the toolchain of the `rust-version` their manifests declare (`cargo +1.88 check`), which
//! rustup installs in its minimal profile where missing. The workspace's own checks use the
//! machine's toolchain; this one proves the declared minimum is true.
//!
//! `cargo xtask test` runs [`ci`]: the same, but where the toolchain cannot be had it says so in
//! one line and passes (the rest of CI decides); where it can, a failure fails the run.

use crate::package::PUBLISHED;
use crate::provision;
use crate::util::{self, Result};
use std::process::Command;

/// The check, failing where the toolchain cannot be had.
pub fn run() -> Result {
    let msrv = declared()?;
    provision::toolchain(&msrv, &[])?;
    check(&msrv)
}

/// [`run`] for `cargo xtask test`: skipped, in one line, where the toolchain cannot be had.
pub fn ci() -> Result {
    let msrv = declared()?;
    if let Err(why) = provision::toolchain(&msrv, &[]) {
        eprintln!("msrv: skipped ({why})");
        return Ok(());
    }
    check(&msrv)
}

/// The `rust-version` every published crate declares (the workspace's, which each inherits), read
/// through `cargo metadata`; an error where one declares none or they differ.
fn declared() -> Result<String> {
    let metadata = util::output(util::cargo().args(["metadata", "--no-deps", "--format-version", "1"]))?;
    let metadata: serde_json::Value =
        serde_json::from_str(&metadata).map_err(|e| format!("`cargo metadata` printed no JSON: {e}"))?;
    let packages = metadata["packages"].as_array().ok_or("`cargo metadata` lists no packages")?;
    msrv_of(packages)
}

/// The one `rust_version` the [`PUBLISHED`] packages of `cargo metadata`'s `packages` declare.
fn msrv_of(packages: &[serde_json::Value]) -> Result<String> {
    let mut declared: Vec<(&str, &str)> = Vec::new();
    for name in PUBLISHED {
        let package = packages
            .iter()
            .find(|p| p["name"] == name)
            .ok_or_else(|| format!("`cargo metadata` does not list the published crate {name}"))?;
        let version = package["rust_version"]
            .as_str()
            .ok_or_else(|| format!("the published crate {name} declares no rust-version"))?;
        declared.push((name, version));
    }
    match &declared[..] {
        [(_, first), rest @ ..] if rest.iter().all(|(_, v)| v == first) => Ok(first.to_string()),
        _ => Err(format!("the published crates declare different rust-versions: {declared:?}")),
    }
}

/// `cargo +MSRV check` of the published crates' libraries with every feature, in a target folder
/// of its own. Every feature: `cuda-mem-sys/bindgen` too, so the libclang `cargo xtask test` set up
/// is passed on.
fn check(msrv: &str) -> Result {
    let toolkit = provision::toolkit()?;
    let libclang = provision::libclang()?;
    // The rustup proxy `cargo` (not $CARGO, the pinned toolchain's own) understands `+1.88`; the
    // pinned toolchain's cargo and rustc, which `cargo xtask` runs under, must not leak in.
    let mut cmd = libclang.apply(Command::new("cargo"));
    for var in ["CARGO", "RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN"] {
        cmd.env_remove(var);
    }
    cmd.current_dir(util::workspace_root())
        .env("CUDA_PATH", &toolkit.root)
        .env("CARGO_TARGET_DIR", util::target_dir().join("check-msrv"))
        .args([&format!("+{msrv}"), "check", "--all-features"]);
    for name in PUBLISHED {
        cmd.args(["-p", name]);
    }
    util::run(&mut cmd)?;
    eprintln!("msrv: {} build on Rust {msrv}, their declared rust-version", PUBLISHED.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn packages(versions: &[(&str, Option<&str>)]) -> Vec<serde_json::Value> {
        versions.iter().map(|(name, v)| json!({ "name": name, "rust_version": v })).collect()
    }

    #[test]
    fn the_published_crates_declare_one_rust_version() {
        let mut listed: Vec<(&str, Option<&str>)> = PUBLISHED.iter().map(|n| (*n, Some("1.88"))).collect();
        listed.push(("xtask", Some("1.95")));
        assert_eq!(msrv_of(&packages(&listed)), Ok("1.88".to_string()));
        listed[1].1 = Some("1.90");
        assert!(msrv_of(&packages(&listed)).unwrap_err().contains("different rust-versions"));
        listed[1].1 = None;
        assert!(msrv_of(&packages(&listed)).unwrap_err().contains("declares no rust-version"));
        assert!(msrv_of(&packages(&listed[1..])).unwrap_err().contains("does not list"));
    }

    /// The manifests as committed: every published crate inherits the workspace's rust-version.
    #[test]
    fn the_manifests_declare_it() {
        let msrv = declared().unwrap();
        assert!(msrv.split('.').all(|part| part.parse::<u32>().is_ok()), "{msrv}");
    }
}
