//! `cargo xtask codegen [--check]`: the committed cuda-mem-sys bindings, one file per CUDA version,
//! generated from the pinned wheels' headers with the configuration in
//! `cuda-mem-sys/build/bindgen_config.rs`.

#[path = "../../cuda-mem-sys/build/bindgen_config.rs"]
mod bindgen_config;

use crate::provision::{self, Toolkit};
use crate::util::{self, Result};
use std::path::PathBuf;

struct BindingSet {
    label: &'static str,
    file: &'static str,
    toolkit: fn() -> Result<Toolkit>,
}

const SETS: [BindingSet; 2] = [
    BindingSet { label: "13.0", file: "cuda_13_0.rs", toolkit: provision::cuda13_pinned },
    BindingSet { label: "12.9", file: "cuda_12_9.rs", toolkit: provision::cuda12_pinned },
];

pub fn bindings_path(file: &str) -> PathBuf {
    util::workspace_root().join("cuda-mem-sys/src/bindings").join(file)
}

pub fn run(check: bool) -> Result {
    let libclang = provision::libclang()?;
    if let Some(path) = &libclang.path
        && std::env::var_os("LIBCLANG_PATH").as_deref() != Some(path.as_os_str())
    {
        // SAFETY: only `cargo xtask codegen` calls `run`, from its main thread before any other
        // thread exists; the test calls `check_or_write`, which leaves the environment alone.
        unsafe { std::env::set_var("LIBCLANG_PATH", path) };
    }
    check_or_write(check, &libclang.clang_args)
}

/// Generates every binding set with the libclang the environment names (bindgen reads
/// `LIBCLANG_PATH` and `BINDGEN_EXTRA_CLANG_ARGS`), then compares or writes.
fn check_or_write(check: bool, clang_args: &[String]) -> Result {
    provision::require_libclang()?;
    let mut stale = Vec::new();
    for set in &SETS {
        let toolkit = (set.toolkit)()?;
        let text = generate(&toolkit, set.label, clang_args)?;
        let path = bindings_path(set.file);
        if check {
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != text {
                stale.push(path.display().to_string());
            }
        } else {
            std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
    }
    if stale.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the committed bindings differ from the generator's output: {}\nrun `cargo xtask codegen` and commit",
            stale.join(", ")
        ))
    }
}

fn generate(toolkit: &Toolkit, label: &str, clang_args: &[String]) -> Result<String> {
    let found = format!("{}.{}", toolkit.version / 1000, toolkit.version % 1000 / 10);
    if found != label {
        return Err(format!("expected CUDA {label} headers at {}, found {found}", toolkit.root.display()));
    }
    bindgen_config::generate(&toolkit.include_dirs, clang_args, label)
        .map_err(|e| format!("bindgen failed on the CUDA {label} headers: {e}"))
}

#[cfg(test)]
mod tests {
    use super::bindgen_config::doxygen_to_markdown as md;

    /// A failure printed as the plain sentence it is (a returned error shows no backtrace, even
    /// under `RUST_BACKTRACE`).
    struct Failure(String);

    impl std::fmt::Debug for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    /// The suite fails when a committed binding was edited by hand or the generator changed, and,
    /// without libclang, with a sentence saying what to install. `cargo xtask test` provisions
    /// libclang before the suite runs (exporting `LIBCLANG_PATH` when it is the wheel's).
    #[test]
    fn committed_bindings_match_the_generator() -> Result<(), Failure> {
        super::check_or_write(true, &[]).map_err(Failure)
    }

    /// A doxygen command the converter does not know is shown as `` `\name` ``; none may reach
    /// the committed bindings.
    #[test]
    fn committed_docs_hold_no_unknown_doxygen_command() {
        for set in &super::SETS {
            let path = super::bindings_path(set.file);
            let text = std::fs::read_to_string(&path).unwrap();
            let unknown: Vec<&str> = text
                .lines()
                .filter(|l| {
                    l.match_indices("`\\").any(|(i, _)| l[i + 2..].starts_with(|c: char| c.is_ascii_alphabetic()))
                })
                .collect();
            assert!(unknown.is_empty(), "{}: {unknown:#?}", path.display());
        }
    }

    #[test]
    fn a_function_comment_becomes_markdown() {
        // As bindgen hands it over: comment markers gone, indentation kept.
        let doxygen = " \\brief Sets attributes of a memory pool

 Supported attributes are:
 - ::cudaMemPoolAttrReleaseThreshold: (value type = cuuint64_t)
                    Amount of reserved memory in bytes.

 \\param[in] pool  - The memory pool to modify
 \\param[in,out] value - Pointer to the value,
   read as \\p *value
 \\returns
 ::cudaSuccess,
 ::cudaErrorInvalidValue
 \\note_callback

 \\sa ::cuMemPoolSetAttribute, ::cudaMemPoolProps::location
";
        let expected = " Sets attributes of a memory pool

 Supported attributes are:
 - `cudaMemPoolAttrReleaseThreshold`: (value type = cuuint64_t)
 Amount of reserved memory in bytes.

 Parameters:
 - `pool` (in): The memory pool to modify
 - `value` (in, out): Pointer to the value,
 read as `*value`

 Returns:
 `cudaSuccess`,
 `cudaErrorInvalidValue`

 Note that as specified by `cudaStreamAddCallback` no CUDA function may be called from callback. \
`cudaErrorNotPermitted` may, but is not guaranteed to, be returned as a diagnostic in such case.

 See also: `cuMemPoolSetAttribute`, `cudaMemPoolProps::location`";
        assert_eq!(md(doxygen), expected);
    }

    #[test]
    fn code_becomes_a_fenced_c_block_and_nothing_stays_indented() {
        let doxygen = " in a push-pop fashion: \\code
        mode = desiredMode;
            swap(&mode);
\\endcode
        after the block, indented";
        let expected = " in a push-pop fashion:

 ```c
 mode = desiredMode;
     swap(&mode);
 ```

 after the block, indented";
        assert_eq!(md(doxygen), expected);
    }

    #[test]
    fn markdown_syntax_in_prose_is_escaped() {
        assert_eq!(
            md("clamped to [1, n] <b>, __global__ and max_width"),
            " clamped to \\[1, n\\] \\<b>, \\_\\_global\\_\\_ and max_width"
        );
        assert_eq!(md("# not a heading\n==="), " \\# not a heading\n \\===");
        assert_eq!(
            md("see (https://docs.nvidia.com/cuda/nvrtc/index.html)."),
            " see (<https://docs.nvidia.com/cuda/nvrtc/index.html>)."
        );
        assert_eq!(md("in \\p config->attrs[i]."), " in `config->attrs[i]`.");
        // The headers' own code spans and entities are Markdown already.
        assert_eq!(
            md("run `mknod <major> 0`, 2 &times; 3, a lone ` tick"),
            " run `mknod <major> 0`, 2 &times; 3, a lone \\` tick"
        );
    }

    #[test]
    fn references_member_comments_boxes_and_line_breaks() {
        assert_eq!(
            md("Please see \\ref CUDART_DRIVER \"Interactions\n with the Driver API\" for more."),
            " Please see Interactions with the Driver API for more."
        );
        assert_eq!(
            md("\\ref ::cudaMallocHost(void**, size_t) \"cudaMallocHost (C API)\","),
            " `cudaMallocHost` (C API),"
        );
        assert_eq!(
            md("< Value of launch attribute ::cudaLaunchAttributeCooperative."),
            " Value of launch attribute `cudaLaunchAttributeCooperative`."
        );
        assert_eq!(md("                *\n                *\n               **"), "");
        assert_eq!(
            md("Max registers.\\n\n Option type: unsigned int\\n\n"),
            " Max registers.\\\n Option type: unsigned int"
        );
        assert_eq!(md("\\cond impl_private"), "");
    }

    #[test]
    fn xml_tables_become_markdown_tables() {
        let doxygen = "as listed:
 \\xmlonly
 <table><tgroup cols=\"2\"><thead><row>
 <entry>CUDA array type</entry> <entry>Valid extents {(width range in
 elements)}</entry>
 </row></thead><tbody><row>
 <entry>2D</entry> <entry>{ (1,maxTexture2D[0]) | 0 }</entry>
 </row></tbody></tgroup></table>
 \\endxmlonly
";
        let expected = " as listed:

 | CUDA array type | Valid extents {(width range in elements)} |
 |---|---|
 | 2D | { (1,maxTexture2D\\[0\\]) \\| 0 } |";
        assert_eq!(md(doxygen), expected);
    }
}
