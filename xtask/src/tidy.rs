//! `cargo xtask tidy`: textual rules that keep the layering and the unsafe discipline true. A
//! `#[test]` runs them too, so `cargo xtask test` (and CI) fails on a violation.
//!
//! The rules, each with a planted violation in the tests below:
//! - only `cuda-mem/src/raw/` names the runtime (`sys::cuda…`, the `cuda_mem_sys` crate, or an
//!   import from it); cuda-mem-nccl reaches it through cuda-mem only;
//! - only `cuda-mem-nccl/src/raw/` names NCCL's functions (`nccl` followed by a capital, in code);
//! - a runtime status is never dropped unread (`let _ = unsafe { sys::…`);
//! - every `unsafe` block or impl has a `// SAFETY:` comment just above it (or on its line);
//! - code comments carry no hardware figures (a number followed by `GB/s`, `µs` or `ms per`); they
//!   point to the dated report instead;
//! - cuda-mem's top-level modules form no import circle but the known ones, which may only go
//!   ([`crate::import_circles`]), and import no module of a higher layer than their own, as
//!   cuda-mem's lib.rs declares the layers ([`crate::layers`]).

use crate::util::{self, Result};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// One broken rule, at a file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub file: String,
    pub line: usize,
    pub rule: Rule,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    RuntimeOutsideRaw,
    NcclOutsideRaw,
    DroppedStatus,
    UnsafeWithoutSafety,
    HardwareFigureInComment,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.rule {
            Rule::RuntimeOutsideRaw => "the CUDA runtime named outside cuda-mem/src/raw/ (add a function there)",
            Rule::NcclOutsideRaw => "NCCL named outside cuda-mem-nccl/src/raw/ (add a function there)",
            Rule::DroppedStatus => "a runtime status dropped unread (use raw::check, or raw::quiet on drop paths)",
            Rule::UnsafeWithoutSafety => "`unsafe` without a `// SAFETY:` comment just above it",
            Rule::HardwareFigureInComment => "a hardware figure in a code comment (point to the dated report)",
        };
        write!(f, "{}:{}: {why}", self.file, self.line)
    }
}

/// Runs every rule over the workspace and fails with the list of violations.
pub fn run() -> Result {
    let root = util::workspace_root();
    let violations = check_tree(&root);
    let mut circles = crate::import_circles::check_tree(&root);
    circles.extend(crate::layers::check_tree(&root));
    if violations.is_empty() && circles.is_empty() {
        eprintln!("tidy: clean");
        return Ok(());
    }
    let mut list: Vec<String> = violations.iter().map(ToString::to_string).collect();
    list.extend(circles);
    Err(format!("tidy: {} violation(s):\n{}", list.len(), list.join("\n")))
}

/// The violations in every Rust file of the workspace (generated bindings and build output
/// aside).
pub fn check_tree(root: &Path) -> Vec<Violation> {
    let mut files = Vec::new();
    for krate in [
        "cuda-mem-sys",
        "cuda-mem",
        "cuda-mem-snapshot",
        "cuda-mem-kernels",
        "cuda-mem-nccl",
        "cuda-mem-bench",
        "cuda-mem-py",
        "cuda-mem-torch-alloc",
        "xtask",
        "fuzz",
    ] {
        rust_files(&root.join(krate), &mut files);
    }
    files.sort();
    let mut violations = Vec::new();
    for file in files {
        let name = file.strip_prefix(root).unwrap_or(&file).to_string_lossy().replace('\\', "/");
        if let Ok(text) = fs::read_to_string(&file) {
            violations.extend(check_file(&name, &text));
        }
    }
    violations
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            // Generated bindings are bindgen's text; `target` and `corpus` are build output.
            if !matches!(name.to_str(), Some("bindings" | "target" | "corpus" | "artifacts")) {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The violations in one file; `name` is its path from the workspace root, with `/`.
pub fn check_file(name: &str, text: &str) -> Vec<Violation> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut flag = |line: usize, rule| found.push(Violation { file: name.to_string(), line: line + 1, rule });
    let library = name.starts_with("cuda-mem/src/");
    let in_raw = name.starts_with("cuda-mem/src/raw/");
    let nccl_library = name.starts_with("cuda-mem-nccl/src/");
    let in_nccl_raw = name.starts_with("cuda-mem-nccl/src/raw/");
    // Test fixtures do arithmetic on made-up inputs; their comments may show it.
    let mut fixtures = name.contains("/tests/");
    for (i, line) in lines.iter().enumerate() {
        let (code, comment) = split_comment(line);
        let code = blank_strings(code);
        fixtures |= code.trim_start().starts_with("#[cfg(test)]");
        if ((library && !in_raw) || nccl_library) && names_the_runtime(&code) {
            flag(i, Rule::RuntimeOutsideRaw);
        }
        if nccl_library && !in_nccl_raw && names_nccl(&code) {
            flag(i, Rule::NcclOutsideRaw);
        }
        if code.replace(' ', "").contains("let_=unsafe{sys::") {
            flag(i, Rule::DroppedStatus);
        }
        if opens_unsafe(&code) && !has_safety_comment(&lines, i) {
            flag(i, Rule::UnsafeWithoutSafety);
        }
        if !fixtures && comment.is_some_and(has_hardware_figure) {
            flag(i, Rule::HardwareFigureInComment);
        }
    }
    found
}

/// The code of a line and its `//` comment, if any (a `//` inside a string literal counts as
/// code: the split is at the first `//` outside double quotes).
fn split_comment(line: &str) -> (&str, Option<&str>) {
    let mut in_string = false;
    let mut escaped = false;
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\\' if in_string => escaped = !escaped,
            b'"' if !escaped => in_string = !in_string,
            b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => return (&line[..i], Some(&line[i..])),
            _ => escaped = false,
        }
        if b != b'\\' {
            escaped = false;
        }
    }
    (line, None)
}

/// The code with the contents of its string literals blanked, so text about code (messages, test
/// inputs) is not read as code.
fn blank_strings(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in code.chars() {
        if in_string {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    in_string = false;
                    out.push(c);
                }
                _ => escaped = false,
            }
            if in_string {
                out.push(' ');
            }
        } else {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

/// `sys::cuda` followed by an upper-case letter, the `cuda_mem_sys` crate (the one re-export in
/// lib.rs aside), or an import list from `sys`.
fn names_the_runtime(code: &str) -> bool {
    if code.trim() == "pub use cuda_mem_sys as sys;" {
        return false;
    }
    let sys_item = code
        .match_indices("sys::cuda")
        .any(|(at, m)| code[at + m.len()..].chars().next().is_some_and(|c| c.is_ascii_uppercase()));
    sys_item || code.contains("cuda_mem_sys") || code.contains("sys::{")
}

/// An NCCL function or type (`ncclAllReduce`, `ncclComm_t`): `nccl` then a capital letter, at the
/// start of an identifier.
fn names_nccl(code: &str) -> bool {
    code.match_indices("nccl").any(|(at, m)| {
        let before = code[..at].chars().next_back();
        let after = code[at + m.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && after.is_some_and(|c| c.is_ascii_uppercase())
    })
}

/// An `unsafe` block or impl starts on this line (`unsafe fn` and `unsafe extern` declare, and
/// `unsafe trait` states a contract: their docs carry `# Safety` instead).
fn opens_unsafe(code: &str) -> bool {
    code.match_indices("unsafe").any(|(at, _)| {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            return false;
        }
        let rest = code[at + "unsafe".len()..].trim_start();
        rest.starts_with('{') || rest.starts_with("impl")
    })
}

/// A `// SAFETY:` comment on the line itself, or in the comment lines just above the statement
/// that holds the `unsafe` (the statement may start a few lines up: `let x =` on one line,
/// `unsafe {` on the next, or attributes between the comment and an impl).
fn has_safety_comment(lines: &[&str], at: usize) -> bool {
    if lines[at].contains("SAFETY:") {
        return true;
    }
    let mut i = at;
    let mut statement_lines = 0;
    while i > 0 {
        i -= 1;
        let line = lines[i].trim();
        if line.starts_with("//") {
            if line.contains("SAFETY:") {
                return true;
            }
            continue;
        }
        // Above the comments: the previous statement, a blank line, or the block's opening.
        if line.is_empty() || line.ends_with(';') || line.ends_with('{') || line.ends_with('}') || line.ends_with(',') {
            return false;
        }
        // A line of the same statement (its start, or an attribute before an impl).
        statement_lines += 1;
        if statement_lines > 4 {
            return false;
        }
    }
    false
}

/// A number followed by one of the hardware units: `GB/s`, `µs`, or `ms per` (a step, a call).
fn has_hardware_figure(comment: &str) -> bool {
    ["GB/s", "µs", "ms per"].iter().any(|unit| {
        comment
            .match_indices(unit)
            .any(|(at, _)| comment[..at].trim_end().chars().next_back().is_some_and(|c| c.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(name: &str, text: &str) -> Vec<Rule> {
        check_file(name, text).into_iter().map(|v| v.rule).collect()
    }

    #[test]
    fn the_workspace_is_tidy() {
        let violations = check_tree(&util::workspace_root());
        let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
        assert!(list.is_empty(), "tidy violations:\n{}", list.join("\n"));
    }

    #[test]
    fn a_runtime_call_outside_raw_fails() {
        let planted = "// SAFETY: test.\nlet code = unsafe { sys::cudaMalloc(&mut p, 8) };\n";
        assert_eq!(rules("cuda-mem/src/device_buffer.rs", planted), [Rule::RuntimeOutsideRaw]);
        assert_eq!(rules("cuda-mem/src/raw/memory.rs", planted), []);
        // A type, the crate, and an import list count too; the re-export in lib.rs does not.
        assert_eq!(rules("cuda-mem/src/a.rs", "fn f(s: sys::cudaStream_t) {}"), [Rule::RuntimeOutsideRaw]);
        assert_eq!(rules("cuda-mem/src/a.rs", "use cuda_mem_sys::cudaFree;"), [Rule::RuntimeOutsideRaw]);
        assert_eq!(rules("cuda-mem/src/a.rs", "use crate::sys::{cudaFree};"), [Rule::RuntimeOutsideRaw]);
        assert_eq!(rules("cuda-mem/src/lib.rs", "pub use cuda_mem_sys as sys;"), []);
        // Other crates may call the runtime (tests, benchmarks): the layering is cuda-mem's.
        assert_eq!(rules("cuda-mem/tests/gpu_core.rs", planted), []);
    }

    #[test]
    fn nccl_outside_its_raw_layer_fails() {
        let planted = "// SAFETY: test.\nlet code = unsafe { ncclAllReduce(s, r, n, 7, 0, c, q) };\n";
        assert_eq!(rules("cuda-mem-nccl/src/group.rs", planted), [Rule::NcclOutsideRaw]);
        assert_eq!(rules("cuda-mem-nccl/src/raw/mod.rs", planted), []);
        // Names in strings and comments, and identifiers that merely contain it, are not calls.
        assert_eq!(rules("cuda-mem-nccl/src/a.rs", "let op = \"ncclAllReduce\"; // ncclGroupEnd\n"), []);
        assert_eq!(rules("cuda-mem-nccl/src/a.rs", "let my_ncclX = 1; fn nccl_ok() {}\n"), []);
        // The crate reaches the runtime through cuda-mem only, its raw layer included.
        assert_eq!(rules("cuda-mem-nccl/src/raw/mod.rs", "use cuda_mem_sys::cudaFree;"), [Rule::RuntimeOutsideRaw]);
        // Its tests and examples may do either.
        assert_eq!(rules("cuda-mem-nccl/tests/gpu_nccl.rs", planted), []);
    }

    #[test]
    fn a_dropped_status_fails() {
        let planted = "// SAFETY: test.\nlet _ = unsafe { sys::cudaFree(p) };\n";
        assert_eq!(rules("cuda-mem-bench/src/a.rs", planted), [Rule::DroppedStatus]);
    }

    #[test]
    fn unsafe_without_a_safety_comment_fails() {
        assert_eq!(rules("x/src/a.rs", "fn f() {\n    let v = unsafe { g() };\n}\n"), [Rule::UnsafeWithoutSafety]);
        assert_eq!(rules("x/src/a.rs", "struct S;\nunsafe impl Send for S {}\n"), [Rule::UnsafeWithoutSafety]);
        // A comment for the statement before does not cover this one.
        let stale = "    // SAFETY: covers a.\n    unsafe { a() };\n    unsafe { b() };\n";
        assert_eq!(rules("x/src/a.rs", stale), [Rule::UnsafeWithoutSafety]);
        // Above the statement, on the line, or above a statement that spans lines: fine.
        assert_eq!(rules("x/src/a.rs", "    // SAFETY: fine.\n    let v = unsafe { g() };\n"), []);
        assert_eq!(rules("x/src/a.rs", "    let v = unsafe { g() }; // SAFETY: fine.\n"), []);
        assert_eq!(rules("x/src/a.rs", "    // SAFETY: fine.\n    let v =\n        unsafe { g() };\n"), []);
        assert_eq!(rules("x/src/a.rs", "// SAFETY: fine.\n#[allow(x)]\nunsafe impl Send for S {}\n"), []);
        // Declarations carry `# Safety` docs instead; words containing "unsafe" are not blocks.
        assert_eq!(
            rules("x/src/a.rs", "pub unsafe fn f() {}\nunsafe extern \"C\" {}\nfn not_unsafe_at_all() {}\n"),
            []
        );
    }

    #[test]
    fn a_hardware_figure_in_a_comment_fails() {
        assert_eq!(
            rules("x/src/a.rs", "let x = 1; // reaches 4.8 TB/s and 3500 GB/s\n"),
            [Rule::HardwareFigureInComment]
        );
        assert_eq!(rules("x/src/a.rs", "/// costs 0.62 µs per pair\n"), [Rule::HardwareFigureInComment]);
        assert_eq!(rules("x/src/a.rs", "//! 3 ms per step\n"), [Rule::HardwareFigureInComment]);
        // Units without a figure, and figures in code or strings, are not comments' figures.
        assert_eq!(rules("x/src/a.rs", "/// println!(\"{:.0} GB/s\", rate);\n"), []);
        assert_eq!(rules("x/src/a.rs", "let unit = \"GB/s\"; let s = \"// 5 GB/s\";\n"), []);
    }

    #[test]
    fn string_contents_are_not_code() {
        assert_eq!(blank_strings("f(\"a\\\"b\", x)"), "f(\"    \", x)");
        assert_eq!(rules("x/src/a.rs", "let s = \"unsafe { g() }\";\n"), []);
    }

    #[test]
    fn comments_split_outside_strings() {
        assert_eq!(split_comment("let a = \"//\"; // note"), ("let a = \"//\"; ", Some("// note")));
        assert_eq!(split_comment("let a = \"\\\"//\";"), ("let a = \"\\\"//\";", None));
    }
}
