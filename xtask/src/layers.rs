//! The layers of cuda-mem's modules, as its lib.rs declares them: the `mod` declarations stand
//! under `// # Layer N: name` headings, lowest layer first, and a module may use only modules of
//! its own layer or a lower one. `cargo xtask tidy` fails on a module under no heading, a heading
//! out of order, and an import of a module on a higher layer (counted as the circle check counts
//! imports: `crate::module` paths and items the crate root re-exports, outside comments and test
//! modules), so lib.rs stays the honest map of the crate.

use crate::import_circles::{Graph, module_graph};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// The crates whose lib.rs declares layers.
const CRATES: [&str; 1] = ["cuda-mem"];

/// The problems of the workspace at `root` (see [`problems`]).
pub fn check_tree(root: &Path) -> Vec<String> {
    CRATES
        .iter()
        .flat_map(|krate| {
            let src = root.join(krate).join("src");
            let lib = fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
            problems(krate, &lib, &module_graph(&src))
        })
        .collect()
}

/// A layer heading's number and name, from a line `// # Layer N: name`.
fn heading(line: &str) -> Option<(usize, String)> {
    let rest = line.trim().strip_prefix("// # Layer ")?;
    let (number, name) = rest.split_once(':')?;
    // The name is what comes before a gloss in parentheses.
    let name = name.split('(').next().unwrap_or(name);
    Some((number.trim().parse().ok()?, name.trim().to_string()))
}

/// The module a line declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`), if any.
fn declared(line: &str) -> Option<String> {
    let code = line.split("//").next()?.trim();
    let rest = ["mod ", "pub mod ", "pub(crate) mod "].iter().find_map(|p| code.strip_prefix(p))?;
    let name = rest.strip_suffix(';')?.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// Each module's layer (1 is the lowest) as `lib` declares it, and what is wrong with the
/// headings: a number out of order, a module declared before the first heading.
fn layers_of(krate: &str, lib: &str) -> (BTreeMap<String, (usize, String)>, Vec<String>) {
    let (mut layers, mut out) = (BTreeMap::new(), Vec::new());
    let mut current: Option<(usize, String)> = None;
    for (at, line) in lib.lines().enumerate() {
        if let Some((number, name)) = heading(line) {
            let expected = current.as_ref().map_or(1, |(n, _)| n + 1);
            if number != expected {
                out.push(format!("{krate}/src/lib.rs:{}: layer {number} where layer {expected} comes next", at + 1));
            }
            current = Some((number, name));
        } else if let Some(module) = declared(line) {
            match &current {
                Some(layer) => {
                    layers.insert(module, layer.clone());
                }
                None => {
                    out.push(format!("{krate}/src/lib.rs:{}: `mod {module}` stands under no layer heading", at + 1))
                }
            }
        }
    }
    (layers, out)
}

/// What is wrong with `krate`'s layers: `lib` is its lib.rs, `graph` its modules' imports.
pub fn problems(krate: &str, lib: &str, graph: &Graph) -> Vec<String> {
    let (layers, mut out) = layers_of(krate, lib);
    for (module, uses) in graph {
        let Some((level, name)) = layers.get(module) else {
            out.push(format!("{krate}/src/{module}: a module lib.rs declares under no layer heading"));
            continue;
        };
        for used in uses {
            if let Some((above, above_name)) = layers.get(used).filter(|(n, _)| n > level) {
                out.push(format!(
                    "{krate}/src/{module} (layer {level}, {name}) imports {used} of the higher layer {above}, {above_name}"
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = "//! docs\n\n// # Layer 1: foundations\n#[macro_use]\nmod macros;\nmod error;\n\n\
                       // # Layer 2: owners\nmod buffer;\n#[cfg(feature = \"x\")]\npub mod export;\n\
                       pub(crate) mod staged; // a comment\n";

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        edges.iter().map(|(n, to)| (n.to_string(), to.iter().map(|t| t.to_string()).collect())).collect()
    }

    #[test]
    fn headings_give_each_declared_module_its_layer() {
        let (layers, out) = layers_of("k", LIB);
        assert!(out.is_empty(), "{out:?}");
        let of = |m: &str| layers.get(m).map(|(n, _)| *n);
        assert_eq!(
            (of("macros"), of("error"), of("buffer"), of("export"), of("staged")),
            (Some(1), Some(1), Some(2), Some(2), Some(2))
        );
    }

    #[test]
    fn imports_down_or_across_pass_and_an_import_up_fails() {
        let fine = graph(&[("macros", &[]), ("error", &["macros"]), ("buffer", &["error", "staged", "Pod"])]);
        assert!(problems("k", LIB, &fine).is_empty());
        let up = graph(&[("error", &["buffer"]), ("buffer", &[])]);
        assert_eq!(
            problems("k", LIB, &up),
            ["k/src/error (layer 1, foundations) imports buffer of the higher layer 2, owners"]
        );
    }

    #[test]
    fn a_module_or_heading_out_of_place_fails() {
        let lib = "mod early;\n// # Layer 2: skipped one\nmod late;\n";
        let (_, out) = layers_of("k", lib);
        assert_eq!(
            out,
            [
                "k/src/lib.rs:1: `mod early` stands under no layer heading",
                "k/src/lib.rs:2: layer 2 where layer 1 comes next"
            ]
        );
        let unlisted = graph(&[("buffer", &[]), ("stray", &[])]);
        assert_eq!(problems("k", LIB, &unlisted), ["k/src/stray: a module lib.rs declares under no layer heading"]);
    }

    /// A planted import of a higher layer in a copy of a source tree fails the check.
    #[test]
    fn a_planted_upward_import_in_a_tree_fails() {
        let dir = std::env::temp_dir().join(format!("layers-{}", std::process::id()));
        let src = dir.join("src");
        fs::create_dir_all(&src).unwrap();
        let lib = "// # Layer 1: base\nmod error;\n// # Layer 2: owners\nmod stream;\npub use stream::Stream;\n";
        fs::write(src.join("lib.rs"), lib).unwrap();
        fs::write(src.join("stream.rs"), "use crate::error::CudaError;\n").unwrap();
        fs::write(src.join("error.rs"), "pub struct CudaError;\n").unwrap();
        assert!(problems("k", lib, &module_graph(&src)).is_empty());
        fs::write(src.join("error.rs"), "fn f(_: &crate::Stream) {}\n").unwrap();
        assert_eq!(
            problems("k", lib, &module_graph(&src)),
            ["k/src/error (layer 1, base) imports stream of the higher layer 2, owners"]
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_crates_layers_hold() {
        let problems = check_tree(&crate::util::workspace_root());
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
