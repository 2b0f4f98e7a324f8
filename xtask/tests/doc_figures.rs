//! One source for every published figure.
//!
//! Every measured figure that the documents quote (a number with a unit of time, bandwidth, rate
//! or a ratio: `752 µs`, `7.92 / 15.8 GB/s`, `1.032×`, `104 倍`) must be found in a results file the
//! same document links to: a dated report folder under `docs/bench/` (its `report.md`,
//! `results.json` and `*.jsonl`), a log under `docs/measurements/`, or the yardsticks under
//! `docs/reference/`. The document may round (`28.8 ms` for a report's `28837` µs, `0.65 µs` for
//! `0.646`) but not claim more digits than the source has, nor take a figure from a source it does
//! not cite. Code comments carry no hardware figures at all: they point to the documents.
//!
//! The check is on numbers, not meaning: a figure that happens to equal another row of a cited
//! source passes.
//!
//! The main job's report (`docs/bench/DATE-h200/`, whose `results.json` names its format
//! `cuda-mem-bench-suite/…`) is the one source of the headline documents ([`HEADLINE_DOCS`]):
//! once such a report is committed, those documents may cite only the latest one, so a figure the
//! latest report does not hold fails. Any document quotes a row by linking its key with the
//! report's date (`[device_cache_pair_1m, 2026-12-04](bench/2026-12-04-h200/report.md#device_cache_pair_1m)`):
//! the key must be a row of that report, and the figures of that line must be that row's.

use regex::Regex;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

#[path = "../src/figures.rs"]
mod figures;
use figures::{Figure, NOT_MEASURED, NUM, NUMBER, Number, Unit, figures, number, unit};

static LINK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\]\(([^)\s]+)\)").unwrap());

/// What a results file prints right after a number.
#[derive(Debug, Clone, Copy)]
enum Label {
    /// A unit of figures.
    Unit(Unit),
    /// A size, a count or a share (`64 MiB`, `16 lanes`, `5%`): never a quoted figure's source.
    Other,
    /// Nothing (a table cell, a JSON value).
    None,
}

/// A number found in a results file, and its label.
#[derive(Debug, Clone, Copy)]
struct Token {
    number: Number,
    label: Label,
}

static OTHER_UNIT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s?(?:KiB|MiB|GiB|TiB|KB|MB|GB|B|bytes?|%|s|k|m|threads?|lanes?|streams?|runs?|calls?|SMs)(?:[^A-Za-z0-9_/]|$)")
        .unwrap()
});

fn text_tokens(text: &str, into: &mut Vec<Token>) {
    for line in text.lines() {
        let typed = figures(line);
        for m in NUMBER.find_iter(line) {
            // Digits glued to letters (sm_90, H200, a commit hash) are not figures.
            if line[..m.start()].chars().next_back().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') {
                continue;
            }
            let label = match typed.iter().find(|f| f.at == m.start()) {
                Some(f) => Label::Unit(f.unit),
                None if OTHER_UNIT.is_match(&line[m.end()..]) => Label::Other,
                None => Label::None,
            };
            into.push(Token { number: number(m.as_str()), label });
        }
    }
}

fn json_tokens(value: &serde_json::Value, key: &str, into: &mut Vec<Token>) {
    match value {
        serde_json::Value::Number(n) if !NOT_MEASURED.contains(&key) => {
            // Full precision: any rounding of it is a faithful quote.
            into.push(Token { number: Number { value: n.as_f64().unwrap(), step: 0.0 }, label: Label::None });
        }
        serde_json::Value::String(s) => text_tokens(s, into),
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_tokens(v, key, into)),
        serde_json::Value::Object(map) => map.iter().for_each(|(k, v)| json_tokens(v, k, into)),
        _ => {}
    }
}

fn file_tokens(path: &Path) -> Vec<Token> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut tokens = Vec::new();
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => json_tokens(&serde_json::from_str(&text).unwrap(), "", &mut tokens),
        Some("jsonl") => {
            // Programs print a summary table after their rows (as the suite reads them, other
            // lines are left out).
            for value in text.lines().filter_map(|l| serde_json::from_str(l).ok()) {
                json_tokens(&value, "", &mut tokens);
            }
        }
        _ => text_tokens(&text, &mut tokens),
    }
    tokens
}

/// True when the figure is `token`: the same printed number in the same unit, or `token` rounded
/// (possibly into a unit a thousand times larger: `28.8 ms` for `28837` µs) to a figure that keeps
/// at least three significant digits. Rounding further (`0.11` for `0.105`, `4.4 TB/s`) would let
/// one measurement read differently in two documents.
fn quotes(figure: &Figure, token: &Token) -> bool {
    let q = number(&figure.text);
    let significant = figure.text.replace([',', '.'], "").trim_start_matches('0').len();
    let mut readings = Vec::new();
    match token.label {
        Label::Other => return false,
        Label::Unit(u) if u.family != figure.unit.family => return false,
        Label::Unit(u) => readings.push(u.scale / figure.unit.scale),
        // Unlabelled (a table cell, a JSON value): the figure's unit, or the report's base unit
        // (µs, GB/s).
        Label::None => readings.extend([1.0, 1.0 / figure.unit.scale]),
    }
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12);
    readings.into_iter().any(|factor| {
        let value = token.number.value * factor;
        let step = token.number.step * factor;
        if close(value, q.value) && close(step, q.step) {
            return true;
        }
        let slack = 1e-9 * q.value.abs().max(1e-12);
        significant >= 3 && step <= q.step + slack && (value - q.value).abs() <= q.step / 2.0 + slack
    })
}

/// The results files a document cites: every file of a linked dated report folder (its report,
/// results.json and JSON lines; not its README, which is prose checked like the others) and of a
/// linked folder inside it, and each linked log or yardstick file.
fn cited_sources(root: &Path, doc: &Path, text: &str) -> BTreeSet<PathBuf> {
    let results = |dir: &Path| -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
                matches!(ext, "json" | "jsonl" | "txt") || (ext == "md" && !p.ends_with("README.md"))
            })
            .collect();
        files.sort();
        files
    };
    let mut sources = BTreeSet::new();
    let (bench, measurements, reference) =
        (root.join("docs/bench"), root.join("docs/measurements"), root.join("docs/reference"));
    for caps in LINK.captures_iter(text) {
        let target = caps[1].split('#').next().unwrap();
        let Ok(path) = doc.parent().unwrap().join(target).canonicalize() else { continue };
        if let Ok(rest) = path.strip_prefix(&bench) {
            if let Some(report) = rest.components().next() {
                sources.extend(results(&bench.join(report)));
            }
            // A linked folder inside a report (one call's raw rows) cites its files too.
            if path.is_dir() && path != bench {
                sources.extend(results(&path));
            }
        } else if (path.starts_with(&measurements) || path.starts_with(&reference)) && path.is_file() {
            sources.insert(path);
        }
    }
    sources
}

/// The documents whose prose quotes figures.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md"), root.join("README.zh-CN.md")];
    let md_in = |dir: PathBuf| -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        found.sort();
        found
    };
    docs.extend(md_in(root.join("docs")));
    for report in fs::read_dir(root.join("docs/bench")).unwrap() {
        let readme = report.unwrap().path().join("README.md");
        if readme.is_file() {
            docs.push(readme);
        }
    }
    docs
}

static HEADING_UNIT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?:^|[^A-Za-z])(µs|μs|us|ms|ns|MB/s|GB/s|TB/s|M/s)(?:[^A-Za-z]|$)").unwrap());
static PLAIN_CELL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!(r"^\s*\**{NUM}\**(?:\s*/\s*\**{NUM}\**)*\s*$")).unwrap());

/// The figures of a document with their line numbers: numbers followed by a unit, and the plain
/// numbers of table cells whose column header, or else the section heading, names a unit
/// (`| GB/s |`, `## Copies, GB/s`).
fn document_figures(text: &str) -> Vec<(usize, Figure)> {
    let heading_unit = |t: &str| HEADING_UNIT.captures(t).map(|c| c[1].to_string());
    let cells = |row: &str| -> Vec<String> { row.trim().trim_matches('|').split('|').map(|c| c.to_string()).collect() };
    let lines: Vec<&str> = text.lines().collect();
    let mut section: Option<String> = None;
    let mut columns: Option<Vec<Option<String>>> = None;
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        found.extend(figures(line).into_iter().map(|f| (i + 1, f)));
        if line.starts_with('#') {
            section = heading_unit(line);
        }
        if !line.starts_with('|') {
            columns = None;
            continue;
        }
        if lines.get(i + 1).is_some_and(|next| next.starts_with("|---") || next.starts_with("| ---")) {
            columns = Some(cells(line).iter().map(|c| heading_unit(c).or(section.clone())).collect());
            continue;
        }
        let Some(units) = &columns else { continue };
        for (cell, unit_text) in cells(line).iter().zip(units) {
            let Some(unit_text) = unit_text else { continue };
            if !PLAIN_CELL.is_match(cell) {
                continue;
            }
            for m in NUMBER.find_iter(cell) {
                let figure =
                    Figure { at: 0, text: m.as_str().to_string(), unit: unit(unit_text), unit_text: unit_text.clone() };
                found.push((i + 1, figure));
            }
        }
    }
    found
}

/// The documents whose figures must come from the latest main report once there is one.
const HEADLINE_DOCS: [&str; 8] = [
    "README.md",
    "README.zh-CN.md",
    "docs/choosing-an-allocator.md",
    "docs/choosing-an-allocator.zh-CN.md",
    "docs/staged-copies.md",
    "docs/async-work.md",
    "docs/multi-gpu.md",
    "docs/python.md",
];

/// The rows of a main report's `results.json`, or `None` for a folder that is not one (an
/// older wrapper report, raw rows of one call).
fn suite_rows(report: &Path) -> Option<Vec<serde_json::Value>> {
    let text = fs::read_to_string(report.join("results.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("format")?.as_str()?.starts_with("cuda-mem-bench-suite/").then_some(())?;
    Some(json.get("rows")?.as_array()?.clone())
}

/// The newest main report under `docs/bench` (folders are named by date first).
fn latest_suite(root: &Path) -> Option<PathBuf> {
    let mut reports: Vec<PathBuf> = fs::read_dir(root.join("docs/bench"))
        .ok()?
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() && suite_rows(p).is_some())
        .collect();
    reports.sort();
    reports.pop()
}

static KEY_LINK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\]\(([^)\s#]*)#([a-z0-9_]+)\)").unwrap());

/// Quotes by key: each line's links to a main report's row (`report.md#KEY`) must name a row it
/// holds, and every figure of the line must be one of those rows' values.
fn key_quotes(root: &Path, doc: &Path, text: &str) -> Vec<String> {
    let name = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
    let bench = root.join("docs/bench");
    let mut wrong = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut row_tokens = Vec::new();
        let mut keyed = false;
        for caps in KEY_LINK.captures_iter(line) {
            let Ok(path) = doc.parent().unwrap().join(&caps[1]).canonicalize() else { continue };
            let Some(report) = path.strip_prefix(&bench).ok().and_then(|r| r.components().next()) else { continue };
            let Some(rows) = suite_rows(&bench.join(report)) else { continue };
            keyed = true;
            match rows.iter().find(|r| r.get("key").and_then(|k| k.as_str()) == Some(&caps[2])) {
                Some(row) => json_tokens(row, "", &mut row_tokens),
                None => wrong.push(format!(
                    "{name}:{}: key {} is not a row of {}",
                    i + 1,
                    &caps[2],
                    report.as_os_str().to_string_lossy()
                )),
            }
        }
        if keyed {
            for figure in figures(line) {
                if !row_tokens.iter().any(|t| quotes(&figure, t)) {
                    wrong.push(format!(
                        "{name}:{}: {} {} is not a value of the rows its keys name",
                        i + 1,
                        figure.text,
                        figure.unit_text
                    ));
                }
            }
        }
    }
    wrong
}

/// Every figure of `doc` that none of its cited results files holds, as "doc:line: figure".
fn unsourced(root: &Path, doc: &Path) -> Vec<String> {
    let text = fs::read_to_string(doc).unwrap();
    let mut sources = cited_sources(root, doc, &text);
    let name = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
    let mut missing = key_quotes(root, doc, &text);
    // Every document quotes one main report, the latest: an older one's report, results and rows
    // are no source (raw rows of single calls kept in folders inside it still are).
    if let Some(latest) = latest_suite(root) {
        let older_report = |s: &PathBuf| {
            let folder = s.parent().unwrap();
            folder.parent() == Some(root.join("docs/bench").as_path())
                && folder != latest
                && suite_rows(folder).is_some()
        };
        let (older, kept): (BTreeSet<PathBuf>, BTreeSet<PathBuf>) = sources.into_iter().partition(older_report);
        let named: BTreeSet<&Path> = older.iter().map(|s| s.parent().unwrap()).collect();
        for folder in named.into_iter().filter(|f| links_report_itself(doc, &text, f)) {
            missing.push(format!(
                "{name}: quotes {}; the documents quote only the latest report, {}",
                folder.strip_prefix(root).unwrap_or(folder).display(),
                latest.strip_prefix(root).unwrap_or(&latest).display()
            ));
        }
        sources = kept;
    }
    // Once a main report exists, the headline documents cite the latest one only.
    if let Some(latest) = latest_suite(root).filter(|_| HEADLINE_DOCS.contains(&name.as_str())) {
        let (kept, older): (BTreeSet<PathBuf>, BTreeSet<PathBuf>) =
            sources.into_iter().partition(|s| s.starts_with(&latest));
        for source in older {
            missing.push(format!(
                "{name}: cites {}; the headline documents quote only the latest report, {}",
                source.strip_prefix(root).unwrap_or(&source).display(),
                latest.strip_prefix(root).unwrap_or(&latest).display()
            ));
        }
        sources = kept;
    }
    let tokens: Vec<Token> = sources.iter().flat_map(|s| file_tokens(s)).collect();
    for (n, figure) in document_figures(&text) {
        if !tokens.iter().any(|t| quotes(&figure, t)) {
            missing.push(format!("{name}:{n}: {} {}", figure.text, figure.unit_text));
        }
    }
    if sources.is_empty() && !missing.is_empty() {
        missing
            .push(format!("{name}: cites no results file (docs/bench/<date>/, docs/measurements/, docs/reference/)"));
    }
    missing
}

/// Whether `text` links the report folder `report` itself, or its report.md or results.json (not
/// only a folder of raw rows inside it).
fn links_report_itself(doc: &Path, text: &str, report: &Path) -> bool {
    LINK.captures_iter(text).any(|caps| {
        let target = caps[1].split('#').next().unwrap();
        doc.parent()
            .unwrap()
            .join(target)
            .canonicalize()
            .is_ok_and(|path| path == report || (path.parent() == Some(report) && path.is_file()))
    })
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().canonicalize().unwrap()
}

#[test]
fn every_figure_in_the_docs_comes_from_a_results_file_the_doc_cites() {
    let root = repo_root();
    let missing: Vec<String> = documents(&root).iter().flat_map(|d| unsourced(&root, d)).collect();
    assert!(
        missing.is_empty(),
        "{} figure(s) not found in any results file their document links to (quote the dated report's \
         figure, or link the file that holds it):\n{}",
        missing.len(),
        missing.join("\n")
    );
}

/// Everything the project cites lives in the project: every relative link of the documents (and of
/// the yardsticks) and every `docs/…` path a code comment names resolves to a file in the repository.
#[test]
fn every_citation_resolves_inside_the_repository() {
    let root = repo_root();
    let mut broken = Vec::new();
    let mut pages = documents(&root);
    pages.push(root.join("docs/reference/yardsticks.md"));
    for doc in &pages {
        let text = fs::read_to_string(doc).unwrap();
        for caps in LINK.captures_iter(&text) {
            let target = caps[1].split('#').next().unwrap();
            if target.is_empty() || target.contains("://") {
                continue;
            }
            if !doc.parent().unwrap().join(target).exists() {
                broken.push(format!("{}: {target}", doc.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    let doc_path = Regex::new(r"docs/[A-Za-z0-9_./-]*[A-Za-z0-9_/]").unwrap();
    for (file, n, comment) in comment_lines(&root) {
        for m in doc_path.find_iter(&comment) {
            if !root.join(m.as_str()).exists() {
                broken.push(format!("{file}:{n}: {}", m.as_str()));
            }
        }
    }
    assert!(broken.is_empty(), "citations that do not resolve inside the repository:\n{}", broken.join("\n"));
}

/// Figures in comments that are settings or API facts, not measurements.
const NOT_HARDWARE: &[(&str, &str)] = &[
    // criterion's warm-up and measurement times, set to 1 ns so it runs exactly one batch.
    ("cuda-mem-bench/src/lib.rs", "1 ns"),
    ("cuda-mem-bench/benches/families.rs", "1 ns"),
    // The size classes: 1, 1.25, 1.5 and 1.75 × 2^k.
    ("cuda-mem-cache/src/pinned/size_class.rs", "1 ×"),
    ("cuda-mem-cache/src/pinned/size_class.rs", "1.25 ×"),
    ("cuda-mem-cache/src/pinned/size_class.rs", "1.5 ×"),
    ("cuda-mem-cache/src/pinned/size_class.rs", "1.75 ×"),
];

/// Comment lines of the crates' library, example, benchmark and build code, before any
/// `#[cfg(test)]` (test fixtures do arithmetic on made-up inputs).
fn comment_lines(root: &Path) -> Vec<(String, usize, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else { return };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if !path.ends_with("bindings") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for krate in ["cuda-mem-sys", "cuda-mem", "cuda-mem-kernels", "cuda-mem-bench", "xtask"] {
        for sub in ["src", "examples", "benches", "build"] {
            walk(&root.join(krate).join(sub), &mut files);
        }
        files.push(root.join(krate).join("build.rs"));
    }
    files.sort();
    let mut lines = Vec::new();
    for file in files.iter().filter(|f| f.is_file()) {
        let name = file.strip_prefix(root).unwrap().display().to_string();
        for (n, line) in fs::read_to_string(file).unwrap().lines().enumerate() {
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            if let Some(at) = line.find("//") {
                lines.push((name.clone(), n + 1, line[at..].to_string()));
            }
        }
    }
    lines
}

#[test]
fn code_comments_carry_no_hardware_figures() {
    let root = repo_root();
    let mut found = Vec::new();
    for (file, n, comment) in comment_lines(&root) {
        for figure in figures(&comment) {
            let quoted = format!("{} {}", figure.text, figure.unit_text);
            if !NOT_HARDWARE.contains(&(file.as_str(), quoted.as_str())) {
                found.push(format!("{file}:{n}: {quoted}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "hardware figures in code comments (point to the report or a doc instead):\n{}",
        found.join("\n")
    );
}

/// The out-of-memory message README and README.zh-CN show is the one `CudaError`'s rustdoc
/// proves (its doc test compares it with what the code prints).
#[test]
fn readmes_show_the_out_of_memory_message_the_code_prints() {
    let root = repo_root();
    let error_rs = fs::read_to_string(root.join("cuda-mem/src/error.rs")).unwrap();
    // The doc test's expected string: `///     "…" \` lines up to `/// );`, a Rust literal with
    // line continuations.
    let start = error_rs.find("err.to_string(),\n").expect("error.rs: the OOM doc test's assert_eq") + 17;
    let mut literal = String::new();
    for line in error_rs[start..].lines() {
        let body = line.trim_start().trim_start_matches("///").trim();
        if body.starts_with(')') {
            break;
        }
        literal.push_str(body.trim_end_matches('\\').trim_start_matches('"').trim_end_matches('"'));
    }
    assert!(literal.starts_with("cudaMalloc of ") && literal.contains("GiB free of"), "{literal}");
    let span = Regex::new(r"`(cudaMalloc of 2199023255552[^`]*)`").unwrap();
    for readme in ["README.md", "README.zh-CN.md"] {
        let text = fs::read_to_string(root.join(readme)).unwrap();
        let shown = span.captures(&text).unwrap_or_else(|| panic!("{readme} shows no out-of-memory message"));
        // A code span may wrap across lines; Markdown reads the line break as a space.
        let shown = shown[1].split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(shown, literal, "{readme} shows a different out-of-memory message than error.rs's doc test");
    }
}

// The checker itself, on made-up documents.
mod checker {
    use super::*;

    fn tokens(text: &str) -> Vec<Token> {
        let mut t = Vec::new();
        text_tokens(text, &mut t);
        t
    }

    fn check(line: &str, source: &str) -> Vec<String> {
        let tokens = tokens(source);
        figures(line)
            .into_iter()
            .filter(|f| !tokens.iter().any(|t| quotes(f, t)))
            .map(|f| format!("{} {}", f.text, f.unit_text))
            .collect()
    }

    const REPORT: &str = "| `malloc_host_4k` | 752 | 722 |\n| `malloc_host_64m` | 28837 | 27818 |\n\
                          pinned pool hit 0.105 µs; staged 41.6 / 44.8 GB/s; read 4426 GB/s; (162×)\n\
                          cudaMallocHost pair 1236.4 us; resource 0.646 and 1.032; 64 MiB";

    #[test]
    fn figures_are_read_with_their_units_through_chains() {
        let found: Vec<String> = figures("costs 0.71–0.84 / 29–33 ms, 6.4 (H2D) / 10.4 (D2H) GB/s and 1.032× (104 倍)")
            .into_iter()
            .map(|f| format!("{} {}", f.text, f.unit_text))
            .collect();
        assert_eq!(
            found,
            ["0.71 ms", "0.84 ms", "29 ms", "33 ms", "6.4 GB/s", "10.4 GB/s", "1.032 ×", "104 倍"].map(String::from)
        );
        // Sizes, versions, hashes and hex are not figures.
        assert!(figures("256 MiB on sm_90, H200 x16, 0x9e37, commit a2e4ab7, CUDA 13.0, x86-64").is_empty());
    }

    #[test]
    fn a_figure_the_source_holds_passes_in_any_faithful_form() {
        for line in [
            "752 µs (4 KiB)",
            "28837 µs",
            "28.8 ms",         // the same in ms, three digits kept
            "0.105 µs",        // exact
            "41.6–44.8 GB/s",  // a range of two figures
            "1.032× and 162×", // ratios
            "1.24 ms",         // 1236.4 us, labelled in the source
            "4426 GB/s",
        ] {
            assert_eq!(check(line, REPORT), Vec::<String>::new(), "{line}");
        }
    }

    #[test]
    fn a_figure_the_source_does_not_hold_is_caught() {
        assert_eq!(check("a PinnedPool hit costs 0.176 µs", REPORT), ["0.176 µs"]);
        assert_eq!(check("41–44 GB/s", REPORT), ["41 GB/s", "44 GB/s"], "41.6 rounds to 42, not 41");
        assert_eq!(check("752.0 µs", REPORT), ["752.0 µs"], "more digits than the source printed");
        assert_eq!(check("64 µs", REPORT), ["64 µs"], "the source's 64 is MiB");
        assert_eq!(check("1236.4 GB/s", REPORT), ["1236.4 GB/s"], "the source's 1236.4 is a time");
        assert_eq!(check("28.9 ms", REPORT), ["28.9 ms"]);
        // Rounding that drops below three significant digits: the same row would read differently.
        assert_eq!(check("0.11 µs", REPORT), ["0.11 µs"]);
        assert_eq!(check("about 0.65 µs", REPORT), ["0.65 µs"]);
        assert_eq!(check("4.4 TB/s", REPORT), ["4.4 TB/s"]);
    }

    #[test]
    fn table_cells_take_the_unit_of_their_column_or_section() {
        let doc = "## Copies, GB/s\n\n| path | H2D | D2H |\n|---|---|---|\n| driver | 7.92 | 15.8 / 16.1 |\n\n\
                   ## Pairs\n\n| row | µs | ratio |\n|---|---|---|\n| pool | **0.105** | 1.5 |\n";
        let found: Vec<String> =
            document_figures(doc).into_iter().map(|(n, f)| format!("{n}: {} {}", f.text, f.unit_text)).collect();
        assert_eq!(found, ["5: 7.92 GB/s", "5: 15.8 GB/s", "5: 16.1 GB/s", "11: 0.105 µs"]);
    }

    #[test]
    fn a_document_may_quote_only_the_results_files_it_links() {
        let dir = std::env::temp_dir().join(format!("doc-figures-{}", std::process::id()));
        let report = dir.join("docs/bench/2026-01-01-x");
        fs::create_dir_all(&report).unwrap();
        fs::create_dir_all(dir.join("docs/measurements")).unwrap();
        fs::write(report.join("report.md"), "| row | 752 |\n").unwrap();
        fs::write(report.join("results.json"), r#"{"rows":[{"raw":98.0038175,"samples":60}]}"#).unwrap();
        fs::write(report.join("README.md"), "the README says 123 µs\n").unwrap();
        fs::write(dir.join("docs/measurements/log.txt"), "peer 390.2 GB/s\n").unwrap();
        let root = dir.canonicalize().unwrap();
        let doc = root.join("docs/a.md");

        fs::write(&doc, "See [the report](bench/2026-01-01-x/README.md): 752 µs and 98.0 µs, 390.2 GB/s.\n").unwrap();
        assert_eq!(unsourced(&root, &doc), ["docs/a.md:1: 390.2 GB/s"], "the log is not linked");

        fs::write(
            &doc,
            "[report](bench/2026-01-01-x/report.md), [log](measurements/log.txt): 752 µs, 98.00 µs, 390.2 GB/s.\n",
        )
        .unwrap();
        assert!(unsourced(&root, &doc).is_empty(), "98.00 rounds results.json's 98.0038175");

        fs::write(&doc, "[report](bench/2026-01-01-x/report.md): 60 µs, 123 µs\n").unwrap();
        assert_eq!(
            unsourced(&root, &doc),
            ["docs/a.md:1: 60 µs", "docs/a.md:1: 123 µs"],
            "sample counts are not figures, and the report folder's README is not a source"
        );

        fs::write(&doc, "no link: 752 µs\n").unwrap();
        assert_eq!(unsourced(&root, &doc).len(), 2, "{:?}", unsourced(&root, &doc));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn headline_documents_quote_the_latest_main_report_by_key_once_there_is_one() {
        let dir = std::env::temp_dir().join(format!("doc-figures-suite-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let old = dir.join("docs/bench/2026-01-01-h200");
        fs::create_dir_all(&old).unwrap();
        fs::create_dir_all(dir.join("docs/measurements")).unwrap();
        fs::write(old.join("report.md"), "| malloc_4k | 752 |\n").unwrap();
        fs::write(old.join("results.json"), r#"{"rows":[{"key":"malloc_4k","raw":752.0}]}"#).unwrap();
        fs::write(dir.join("docs/measurements/log.txt"), "pairs 0.0440 µs\n").unwrap();
        let root = dir.canonicalize().unwrap();
        let readme = root.join("README.md");
        let other = root.join("docs/reliability.md");
        let legacy =
            "[report](docs/bench/2026-01-01-h200/report.md): 752 µs; [log](docs/measurements/log.txt): 0.0440 µs\n";
        fs::write(&readme, legacy).unwrap();
        assert!(
            unsourced(&root, &readme).is_empty(),
            "before a main report, older sources hold: {:?}",
            unsourced(&root, &readme)
        );

        let suite = root.join("docs/bench/2026-02-01-h200");
        fs::create_dir_all(&suite).unwrap();
        fs::write(suite.join("report.md"), "# report\n").unwrap();
        fs::write(
            suite.join("results.json"),
            r#"{"format":"cuda-mem-bench-suite/1","date":"2026-02-01","rows":[
                {"key":"device_cache_pair_1m","unit":"us","cuda_mem":0.0494,"peer_value":0.36,"ratio":0.137222},
                {"key":"pinned_pool_pair_1m","unit":"us","cuda_mem":0.0445,"peer_value":null,"ratio":null}]}"#,
        )
        .unwrap();
        let errors = unsourced(&root, &readme);
        assert_eq!(errors.len(), 6, "three older sources, two figures they held, no source left: {errors:?}");
        assert!(errors[0].contains("cites docs/bench/2026-01-01-h200/report.md; the headline documents quote only the latest report, docs/bench/2026-02-01-h200"), "{errors:?}");
        assert!(errors.iter().any(|e| e == "README.md:1: 752 µs"), "{errors:?}");
        fs::create_dir_all(other.parent().unwrap()).unwrap();
        fs::write(&other, "[log](measurements/log.txt): 0.0440 µs\n").unwrap();
        assert!(unsourced(&root, &other).is_empty(), "only the headline documents switch");

        let key = |k: &str| format!("[{k}, 2026-02-01](docs/bench/2026-02-01-h200/report.md#{k})");
        fs::write(
            &readme,
            format!("DeviceCache 0.0494 µs against 0.360 µs ({}): 0.137×\n", key("device_cache_pair_1m")),
        )
        .unwrap();
        assert!(unsourced(&root, &readme).is_empty(), "{:?}", unsourced(&root, &readme));
        fs::write(&readme, format!("PinnedPool 0.0494 µs ({})\n", key("pinned_pool_pair_1m"))).unwrap();
        assert_eq!(
            unsourced(&root, &readme),
            ["README.md:1: 0.0494 is not a value of the rows its keys name".replace("0.0494", "0.0494 µs")]
        );
        fs::write(&readme, format!("0.0494 µs ({})\n", key("device_cache_pair_2m"))).unwrap();
        let errors = unsourced(&root, &readme);
        assert!(
            errors.contains(&"README.md:1: key device_cache_pair_2m is not a row of 2026-02-01-h200".to_string()),
            "{errors:?}"
        );
        fs::write(&readme, "[report](docs/bench/2026-02-01-h200/report.md): 0.0445 µs, 0.0450 µs\n").unwrap();
        assert_eq!(unsourced(&root, &readme), ["README.md:1: 0.0450 µs"], "a figure the latest report does not hold");
        fs::remove_dir_all(&dir).unwrap();
    }
}
