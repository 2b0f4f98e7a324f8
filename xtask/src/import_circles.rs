//! Import circles between the top-level modules of cuda-mem and cuda-mem-cache: a module (a file under `src/`, or a folder
//! with everything in it) that names `crate::other` depends on `other`, and one that names an
//! item the crate root re-exports (`crate::Stream`, from lib.rs's `pub use stream::Stream`)
//! depends on the module it comes from; a circle is a set of modules each reachable from every
//! other. A circle means no module of it can be read, tested
//! or moved alone. `cargo xtask tidy` fails on a circle that is not in [`KNOWN`], and on an entry
//! of [`KNOWN`] that no longer is one (so the list only shrinks, toward none). Test files
//! (`tests.rs`, `*_tests.rs`) and inline `mod tests` are left out: what a test imports is not
//! the design.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// The circles tolerated, each as its crate and its modules in order; an entry here needs a
/// reason beside it.
pub const KNOWN: &[(&str, &[&str])] = &[
    // Empty since 2026-12-07: the circle of nineteen cuda-mem modules through error.rs (which
    // named graph's `UpdateRefusal`, now its own) and maybe_owned.rs (which named `Stream` and
    // `MemPool`, whose `From` impls now sit beside them) is gone.
];

/// The crates whose `src/` is checked.
const CRATES: [&str; 2] = ["cuda-mem", "cuda-mem-cache"];

/// The problems of the workspace at `root` (see [`problems`]).
pub fn check_tree(root: &Path) -> Vec<String> {
    CRATES.iter().flat_map(|krate| problems(krate, &circles_in(&root.join(krate).join("src")), KNOWN)).collect()
}

/// Modules as nodes, `crate::` names as edges.
pub(crate) type Graph = BTreeMap<String, BTreeSet<String>>;

/// The circles of cuda-mem's source tree at `src` (its `src/` folder), each sorted.
pub fn circles_in(src: &Path) -> Vec<Vec<String>> {
    circles(&module_graph(src))
}

/// The top-level modules of the source tree at `src` and the modules each names (itself left
/// out; names that are no module of the tree kept, as the circles skip them).
pub(crate) fn module_graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    let root = root_items(&fs::read_to_string(src.join("lib.rs")).unwrap_or_default());
    let Ok(entries) = fs::read_dir(src) else { return graph };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().trim_end_matches(".rs").to_string();
        if name == "lib" {
            continue;
        }
        let mut text = String::new();
        collect_code(&path, &mut text);
        let edges = graph.entry(name.clone()).or_default();
        let modules = crate_names(&text).into_iter().map(|n| root.get(&n).cloned().unwrap_or(n));
        edges.extend(modules.filter(|n| *n != name));
    }
    graph
}

/// The code of a file, or of every file of a folder, without test files and inline test modules.
fn collect_code(path: &Path, out: &mut String) {
    if path.is_dir() {
        let Ok(entries) = fs::read_dir(path) else { return };
        let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        paths.iter().for_each(|p| collect_code(p, out));
        return;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    if !name.ends_with(".rs") || name == "tests.rs" || name.ends_with("_tests.rs") {
        return;
    }
    if let Ok(text) = fs::read_to_string(path) {
        out.push_str(without_test_module(&text));
        out.push('\n');
    }
}

/// `text` up to its inline test module (`#[cfg(test)]` followed by `mod tests`, or `pub(crate) mod
/// tests` where other modules' tests share its helpers), which by convention closes a file.
fn without_test_module(text: &str) -> &str {
    let mut at = 0;
    while let Some(found) = text[at..].find("#[cfg(test)]") {
        let start = at + found;
        let rest = text[start + "#[cfg(test)]".len()..].trim_start();
        let rest = rest.strip_prefix("pub(crate) ").unwrap_or(rest);
        if rest.starts_with("mod tests") {
            return &text[..start];
        }
        at = start + 1;
    }
    text
}

/// The names `text` reaches through `crate::name` or `crate::{name, ..}`, outside comments:
/// modules, and items of the crate root (resolved through [`root_items`]).
fn crate_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(found) = rest.find("crate::") {
            let after = &rest[found + "crate::".len()..];
            let preceded_by_ident = rest[..found].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_');
            if !preceded_by_ident {
                if let Some(group) = after.strip_prefix('{') {
                    let end = group.find('}').unwrap_or(group.len());
                    for item in group[..end].split(',') {
                        names.extend(ident(item.trim()));
                    }
                } else {
                    names.extend(ident(after));
                }
            }
            rest = after;
        }
    }
    names
}

/// The identifier at the start of `text`, if any (`self` is none).
fn ident(text: &str) -> Option<String> {
    let name: String = text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty() && name != "self").then_some(name)
}

/// What the crate root's `use` declarations (in lib.rs's text) bring in, by the name they take
/// there: the first segment of each path, the module an item comes from. A name defined in
/// lib.rs itself is in no module: it has no entry, and so no edge.
fn root_items(lib: &str) -> BTreeMap<String, String> {
    let mut items = BTreeMap::new();
    let mut statement: Option<String> = None;
    for line in lib.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        let start = ["use ", "pub use ", "pub(crate) use "].iter().find_map(|p| code.strip_prefix(p));
        let text = match (&mut statement, start) {
            (Some(open), _) => {
                open.push(' ');
                open.push_str(code);
                open.clone()
            }
            (None, Some(tree)) => tree.to_string(),
            (None, None) => continue,
        };
        match text.split_once(';') {
            Some((tree, _)) => {
                use_leaves(tree, None, &mut items);
                statement = None;
            }
            None => statement = Some(text),
        }
    }
    items
}

/// The leaves of a use tree (`a::b::{C, d::E as F}`) as (name taken, first segment), into `out`;
/// `first` is the tree's first segment when `tree` is a branch inside braces.
fn use_leaves(tree: &str, first: Option<&str>, out: &mut BTreeMap<String, String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = &tree[..open];
        let first = first.or_else(|| head.split("::").next()).unwrap_or("").trim();
        let body = tree[open + 1..].strip_suffix('}').unwrap_or(&tree[open + 1..]);
        let (mut depth, mut start) = (0, 0);
        for (i, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    use_leaves(&body[start..i], Some(first), out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        use_leaves(&body[start..], Some(first), out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((path, alias)) => (path.trim(), Some(alias.trim())),
        None => (tree, None),
    };
    let segments: Vec<&str> = path.split("::").map(str::trim).filter(|s| !s.is_empty()).collect();
    let (Some(&last), Some(first)) = (segments.last(), first.or(segments.first().copied())) else { return };
    // `use other_crate;` or `use other_crate as name;` brings in no item of a module.
    if first.is_empty() || (segments.len() == 1 && first == last) || last == "*" || last == "self" {
        return;
    }
    out.insert(alias.unwrap_or(last).to_string(), first.to_string());
}

/// The strongly connected components of more than one node (Tarjan's algorithm), each sorted,
/// in order of their first node.
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, node: &'g str) {
        let i = s.index.len();
        s.index.insert(node, i);
        s.low.insert(node, i);
        s.stack.push(node);
        s.on_stack.insert(node);
        for next in s.graph.get(node).into_iter().flatten() {
            let next = next.as_str();
            if !s.graph.contains_key(next) {
                continue; // a name that is not a module of the tree (a macro, a re-export)
            }
            if !s.index.contains_key(next) {
                visit(s, next);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                component.push(top.to_string());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found.sort();
    state.found
}

/// What is wrong with `found`, the circles of `krate`, against [`KNOWN`]-like `known`: new
/// circles, and known ones gone.
pub fn problems(krate: &str, found: &[Vec<String>], known: &[(&str, &[&str])]) -> Vec<String> {
    let known: Vec<Vec<String>> =
        known.iter().filter(|(of, _)| *of == krate).map(|(_, c)| c.iter().map(|s| s.to_string()).collect()).collect();
    let mut out = Vec::new();
    for circle in found.iter().filter(|c| !known.contains(c)) {
        out.push(format!("{krate}/src: an import circle: {}", circle.join(" <-> ")));
    }
    for circle in known.iter().filter(|c| !found.contains(c)) {
        out.push(format!(
            "xtask/src/import_circles.rs: KNOWN lists {} which is no longer a circle (remove it)",
            circle.join(" <-> ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        edges.iter().map(|(n, to)| (n.to_string(), to.iter().map(|t| t.to_string()).collect())).collect()
    }

    #[test]
    fn circles_are_the_components_of_more_than_one_module() {
        let g = graph(&[
            ("a", &["b"]),
            ("b", &["c"]),
            ("c", &["a", "d"]),
            ("d", &[]),
            ("e", &["f", "macro_name"]),
            ("f", &["e"]),
        ]);
        assert_eq!(circles(&g), [vec!["a", "b", "c"], vec!["e", "f"]]);
        assert!(circles(&graph(&[("a", &["b"]), ("b", &[])])).is_empty());
    }

    #[test]
    fn crate_paths_and_groups_name_modules_and_root_items_but_comments_do_not() {
        let text = "use crate::error::{CudaError, Result};\nuse crate::{raw, stream::Stream, Pod};\n\
                    // crate::commented\nlet x = crate::slice::view(); my_crate::other::f();\n";
        let names: Vec<_> = crate_names(text).into_iter().collect();
        assert_eq!(names, ["Pod", "error", "raw", "slice", "stream"]);
    }

    #[test]
    fn root_items_resolve_to_the_module_they_come_from() {
        let lib = "pub mod stream;\npub use bytemuck::{Pod, Zeroable};\npub use other_crate as alias;\n\
                   pub use stream::{Completion, Event as Mark, Stream};\n// pub use commented::Out;\n\
                   pub use graph::{\n    exec::{GraphExec, UpdateRefusal},\n    Graph,\n};\n\
                   use raw::host_flags::HostAllocFlags;\npub struct Defined;\n";
        let items = root_items(lib);
        let of = |name: &str| items.get(name).map(String::as_str);
        assert_eq!(of("Stream"), Some("stream"));
        assert_eq!(of("Mark"), Some("stream"));
        assert_eq!(of("Event"), None, "renamed: the root has Mark");
        assert_eq!(of("UpdateRefusal"), Some("graph"));
        assert_eq!(of("Graph"), Some("graph"));
        assert_eq!(of("HostAllocFlags"), Some("raw"));
        assert_eq!(of("Pod"), Some("bytemuck"), "a crate outside: no module of the tree, so no edge");
        assert_eq!((of("alias"), of("Out"), of("Defined")), (None, None, None));
    }

    #[test]
    fn a_root_item_makes_an_edge_to_its_module() {
        let dir = std::env::temp_dir().join(format!("import-circles-{}", std::process::id()));
        let src = dir.join("src");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("lib.rs"), "mod error;\nmod stream;\npub use stream::Stream;\n").unwrap();
        fs::write(src.join("error.rs"), "fn f(_: &crate::Stream) {}\n").unwrap();
        fs::write(src.join("stream.rs"), "use crate::error::CudaError;\n").unwrap();
        assert_eq!(circles_in(&src), [vec!["error", "stream"]]);
        fs::write(src.join("error.rs"), "pub struct CudaError;\n").unwrap();
        assert!(circles_in(&src).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_inline_test_module_is_left_out() {
        let text = "use crate::a::X;\n#[cfg(test)]\nfn helper() {}\n#[cfg(test)]\nmod tests {\n use crate::b::Y;\n}\n";
        assert_eq!(crate_names(without_test_module(text)).into_iter().collect::<Vec<_>>(), ["a"]);
        let shared = "use crate::a::X;\n#[cfg(test)]\npub(crate) mod tests {\n use crate::b::Y;\n}\n";
        assert_eq!(crate_names(without_test_module(shared)).into_iter().collect::<Vec<_>>(), ["a"]);
        let public = "use crate::a::X;\n#[cfg(test)]\npub mod tests {\n use crate::b::Y;\n}\n";
        assert_eq!(crate_names(without_test_module(public)).len(), 2, "only a crate-visible test module is left out");
    }

    #[test]
    fn the_crates_have_only_the_known_circles() {
        let problems = check_tree(&crate::util::workspace_root());
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn a_new_circle_and_a_stale_entry_are_both_problems() {
        let found = vec![vec!["a".to_string(), "b".to_string()]];
        assert!(problems("cuda-mem", &found, &[("cuda-mem", &["a", "b"])]).is_empty());
        let new = problems("cuda-mem-cache", &found, &[]);
        assert_eq!(new.len(), 1);
        assert!(new[0].starts_with("cuda-mem-cache/src: an import circle: a <-> b"), "{new:?}");
        let stale = problems("cuda-mem", &[], &[("cuda-mem", &["a", "b"])]);
        assert!(stale[0].contains("no longer a circle"), "{stale:?}");
    }
}
