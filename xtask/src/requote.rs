//! `cargo xtask requote NEW`: moves the documents from the previous main report to NEW (a dated
//! folder under docs/bench/ holding a suite `results.json`). On every line that quotes rows of the
//! previous report by key, each figure that is one of those rows' values becomes the new row's
//! value, printed to the same significant digits, and the links and their dates point to NEW. A
//! figure no key names (on a line citing the report without one, or linking nothing in a document
//! that cites it) moves by value: where the old report's rows holding it (its results.json and the
//! wrapper section's) all give one new figure. Words are not touched: it lists what a person must
//! read again (each figure moved by value, figures it could not map, lines that cite the old
//! report without a key, ratios that crossed 1), and tests/doc_figures.rs fails on whatever is
//! left stale.

use crate::figures::{Family, Figure, NOT_MEASURED, NUMBER, figures, number, unit};
use crate::util::{self, Result};
use regex::Regex;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

type Rows = BTreeMap<String, Value>;

pub fn run(new: &Path, write: bool) -> Result {
    let root = util::workspace_root();
    let bench = root.join("docs/bench");
    let new = if new.is_absolute() { new.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(new) };
    let new = new.canonicalize().map_err(|e| format!("{}: {e}", new.display()))?;
    let new_rows = suite_rows(&new).ok_or_else(|| format!("{} holds no main report (results.json)", new.display()))?;
    let old = previous_report(&bench, &new)?;
    let old_rows = suite_rows(&old).expect("previous_report returns main reports");
    let (old_name, new_name) = (folder_name(&old), folder_name(&new));
    let mut documents = vec![root.join("README.md"), root.join("README.zh-CN.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .map_err(|e| format!("docs/: {e}"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    documents.extend(docs);
    let wrapper = |report: &Path| wrapper_rows(&report.join(WRAPPER)).unwrap_or_default();
    let (old_wrapper, new_wrapper) = (wrapper(&old), wrapper(&new));
    let mut quotes = Quotes::new(&old_name, &new_name, &old_rows, &new_rows);
    quotes.tables.push(Table { file: WRAPPER, old: &old_wrapper, new: &new_wrapper });
    let mut review = Vec::new();
    for doc in documents {
        let text = fs::read_to_string(&doc).map_err(|e| format!("{}: {e}", doc.display()))?;
        let name = doc.strip_prefix(&root).unwrap_or(&doc).display().to_string();
        let mut out = Vec::new();
        // A document that cites the old report may quote it on lines that link nothing.
        let cites = quotes.report_link.is_match(&text);
        for (i, line) in text.split('\n').enumerate() {
            let mut tell = |what| review.push(format!("{name}:{}: {what}", i + 1));
            let moved = if cites && !line.contains("](") {
                quotes.unlinked_line(line, &mut tell)
            } else {
                quotes.line(line, &mut tell)
            };
            if moved != line {
                println!("{name}:{}:\n  - {line}\n  + {moved}", i + 1);
            }
            out.push(moved);
        }
        let moved = out.join("\n");
        if write && moved != text {
            fs::write(&doc, moved).map_err(|e| format!("write {}: {e}", doc.display()))?;
        }
    }
    println!("\n{} line(s) to read again:\n{}", review.len(), review.join("\n"));
    if !write {
        println!("(nothing written: pass --write)");
    }
    Ok(())
}

/// The rows of a main report, by key; `None` for a folder that is not one.
fn suite_rows(report: &Path) -> Option<Rows> {
    let json: Value = serde_json::from_str(&fs::read_to_string(report.join("results.json")).ok()?).ok()?;
    json.get("format")?.as_str()?.starts_with("cuda-mem-bench-suite/").then_some(())?;
    let rows = json.get("rows")?.as_array()?;
    Some(rows.iter().filter_map(|r| Some((r.get("key")?.as_str()?.to_string(), r.clone()))).collect())
}

/// The wrapper section's own results in a main report (bandwidths, criterion times, rows against
/// cudarc), which documents quote by value.
const WRAPPER: &str = "raw/paired/report/results.json";

/// The rows of a results file, by key.
fn wrapper_rows(file: &Path) -> Option<Rows> {
    let json: Value = serde_json::from_str(&fs::read_to_string(file).ok()?).ok()?;
    let rows = json.get("rows")?.as_array()?;
    Some(rows.iter().filter_map(|r| Some((r.get("key")?.as_str()?.to_string(), r.clone()))).collect())
}

/// The newest main report under `bench` older than `new` (folders are named by date first).
fn previous_report(bench: &Path, new: &Path) -> Result<PathBuf> {
    let mut older: Vec<PathBuf> = fs::read_dir(bench)
        .map_err(|e| format!("{}: {e}", bench.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.as_path() != new && folder_name(p) < folder_name(new) && suite_rows(p).is_some())
        .collect();
    older.sort();
    older.pop().ok_or_else(|| format!("no main report under {} older than {}", bench.display(), folder_name(new)))
}

fn folder_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The date a report folder's name starts with.
fn date_of(folder: &str) -> &str {
    folder.get(..10).unwrap_or(folder)
}

/// One results file of both reports, for figures quoted by value.
struct Table<'a> {
    file: &'static str,
    old: &'a Rows,
    new: &'a Rows,
}

struct Quotes<'a> {
    /// Where a figure no key names is looked up by value: the main rows (those keys name), then
    /// others.
    tables: Vec<Table<'a>>,
    old_name: &'a str,
    new_name: &'a str,
    key_link: Regex,
    /// Links to what every main report holds (its report, results, plots and raw section
    /// outputs), as opposed to folders of single calls kept inside one report.
    report_link: Regex,
}

impl<'a> Quotes<'a> {
    fn new(old_name: &'a str, new_name: &'a str, old: &'a Rows, new: &'a Rows) -> Self {
        let key_link = Regex::new(&format!(r"{}/report\.md#([a-z0-9_]+)", regex::escape(old_name))).unwrap();
        let report_link =
            Regex::new(&format!(r"{}/(report\.md|results\.json|raw/|[a-z]+\.svg|\))", regex::escape(old_name)))
                .unwrap();
        let tables = vec![Table { file: "results.json", old, new }];
        Self { tables, old_name, new_name, key_link, report_link }
    }

    /// The main rows of the old report, which keys name.
    fn old_rows(&self) -> &'a Rows {
        self.tables[0].old
    }

    /// The main rows of the new report.
    fn new_rows(&self) -> &'a Rows {
        self.tables[0].new
    }

    /// `line` moved to the new report, with what a person must check reported through `review`.
    fn line(&self, line: &str, review: &mut dyn FnMut(String)) -> String {
        if !self.report_link.is_match(line) {
            return line.to_string();
        }
        let keys: Vec<&str> = self.key_link.captures_iter(line).map(|c| c.get(1).unwrap().as_str()).collect();
        if keys.is_empty() {
            review(format!(
                "cites {} without a row key: its figures go by value, its table cells not at all",
                self.old_name
            ));
        }
        let moved = self.figures_moved(line, &keys, review);
        let (old_date, new_date) = (date_of(self.old_name), date_of(self.new_name));
        let moved = self.report_link.replace_all(&moved, |c: &regex::Captures| format!("{}/{}", self.new_name, &c[1]));
        moved
            .replace(&format!(", {old_date}]("), &format!(", {new_date}]("))
            .replace(&format!("report of {old_date}]("), &format!("report of {new_date}]("))
    }

    /// A line that links nothing, in a document that cites the old report: its figures by value.
    fn unlinked_line(&self, line: &str, review: &mut dyn FnMut(String)) -> String {
        self.figures_moved(line, &[], review)
    }

    /// `line` with each figure that quotes a row of the old report (by one of `keys`, else by
    /// value) printed from the new report.
    fn figures_moved(&self, line: &str, keys: &[&str], review: &mut dyn FnMut(String)) -> String {
        let mut moved = line.to_string();
        // Right to left, so that earlier offsets stay valid.
        let mut edits: Vec<(usize, usize, String)> = Vec::new();
        for figure in figures(line) {
            let what = format!("{} {}", figure.text, figure.unit_text);
            let (text, crossed) = match self.requote(keys, &figure) {
                Some(found) => found,
                None => {
                    let found = self.by_value(&figure);
                    // The same measurement may sit in several files (a main row and its wrapper
                    // row): rows that all give the same new figure agree.
                    let mut texts: Vec<&(String, bool)> = found.iter().map(|(_, _, _, moved)| moved).collect();
                    texts.sort();
                    texts.dedup();
                    match (texts.as_slice(), found.first()) {
                        ([one], Some((file, key, field, _))) => {
                            let more = if found.len() > 1 {
                                format!(" (and {} rows that agree)", found.len() - 1)
                            } else {
                                String::new()
                            };
                            review(format!(
                                "{what} matched by value to {key}.{field} of {file}{more}: now {} (check the row)",
                                one.0
                            ));
                            (*one).clone()
                        }
                        ([], _) => {
                            review(format!("{what} is no value of either report's rows: left as it is"));
                            continue;
                        }
                        _ => {
                            review(format!(
                                "{what} is the value of {} rows that now differ: left as it is",
                                found.len()
                            ));
                            continue;
                        }
                    }
                }
            };
            if crossed {
                review(format!("{what} is now {text}: a ratio that crossed 1 (read the words around it)"));
            }
            edits.push((figure.at, figure.at + figure.text.len(), text));
        }
        edits.extend(self.counts(line, keys));
        edits.sort_by_key(|e| std::cmp::Reverse(e.0));
        edits.dedup_by_key(|e| e.0);
        for (start, end, text) in edits {
            moved.replace_range(start..end, &text);
        }
        for key in keys.iter().filter(|k| !self.new_rows().contains_key(**k)) {
            review(format!("key {key} is not a row of {}", self.new_name));
        }
        moved
    }

    /// The figure printed from the new row: the first field of the keyed rows whose old value the
    /// figure quotes, and whether it is a ratio that moved across 1.
    fn requote(&self, keys: &[&str], figure: &Figure) -> Option<(String, bool)> {
        for key in keys {
            let (Some(old), Some(new)) = (self.old_rows().get(*key), self.new_rows().get(*key)) else { continue };
            for (field, factor) in fields(old, figure) {
                if let Some(found) = requoted(old, new, &field, factor, figure) {
                    return Some(found);
                }
            }
        }
        None
    }

    /// Every row value of the old report's results files that `figure` quotes, as (file, key,
    /// field, the new report's figure, whether it is a ratio that crossed 1); rows the new report
    /// lacks are left out.
    fn by_value(&self, figure: &Figure) -> Vec<(&'static str, String, String, (String, bool))> {
        let mut found = Vec::new();
        for table in &self.tables {
            for (key, old) in table.old {
                let Some(new) = table.new.get(key) else { continue };
                for (field, factor) in fields(old, figure) {
                    if let Some(moved) = requoted(old, new, &field, factor, figure) {
                        found.push((table.file, key.clone(), field, moved));
                    }
                }
            }
        }
        found
    }

    /// Bare integers of the line that are counts of the keyed rows (misses, releases), as edits.
    fn counts(&self, line: &str, keys: &[&str]) -> Vec<(usize, usize, String)> {
        let typed: Vec<usize> = figures(line).iter().map(|f| f.at).collect();
        let mut edits = Vec::new();
        for m in NUMBER.find_iter(line).filter(|m| !typed.contains(&m.start()) && !m.as_str().contains('.')) {
            if line[..m.start()].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                continue;
            }
            let printed = number(m.as_str()).value;
            let found = keys.iter().find_map(|key| {
                let (old, new) = (self.old_rows().get(*key)?, self.new_rows().get(*key)?);
                (old.get("unit")?.as_str()? == "count").then_some(())?;
                ["cuda_mem", "peer_value"]
                    .into_iter()
                    .find(|f| old[*f].as_f64() == Some(printed))
                    .and_then(|f| new[f].as_f64())
            });
            if let Some(now) = found {
                let count = format!("{now:.0}");
                edits.push((m.start(), m.end(), if m.as_str().contains(',') { grouped(&count) } else { count }));
            }
        }
        edits
    }
}

/// The fields of a row a figure may quote, with the factor from the row's unit to the figure's:
/// its ratios for a ratio, its values in the row's unit for a time, bandwidth or rate.
fn fields(row: &Value, figure: &Figure) -> Vec<(String, f64)> {
    let row_unit = match row.get("unit").and_then(Value::as_str) {
        Some(u @ ("ns" | "us" | "ms" | "GB/s" | "M/s" | "x")) => Some(unit(u)),
        _ => None,
    };
    let Some(map) = row.as_object() else { return Vec::new() };
    let numeric = map.iter().filter(|(k, v)| v.is_number() && !NOT_MEASURED.contains(&k.as_str()));
    numeric
        .filter_map(|(field, _)| {
            if field.contains("ratio") || field == "speedup" {
                (figure.unit.family == Family::Ratio).then(|| (field.clone(), 1.0))
            } else {
                let row_unit = row_unit.filter(|u| u.family == figure.unit.family)?;
                Some((field.clone(), row_unit.scale / figure.unit.scale))
            }
        })
        .collect()
}

/// The new row's `field` printed like `figure`, if `figure` quotes the old row's; and whether it
/// is a ratio that crossed 1.
fn requoted(old: &Value, new: &Value, field: &str, factor: f64, figure: &Figure) -> Option<(String, bool)> {
    let printed = number(&figure.text);
    let (was, now) = (old[field].as_f64()? * factor, new[field].as_f64()? * factor);
    ((was - printed.value).abs() <= printed.step / 2.0 + 1e-9 * printed.value.abs()).then(|| {
        let ratio = figure.unit.family == Family::Ratio;
        (print_like(now, &figure.text), ratio && (was - 1.0) * (now - 1.0) < 0.0)
    })
}

/// `value` printed with as many significant digits as `like` has (three at most where `like` is
/// a whole number, so that 16,064 may become 2,290), with thousands separators where `like` has
/// them.
fn print_like(value: f64, like: &str) -> String {
    let mut significant = like.replace([',', '.'], "").trim_start_matches('0').len().max(1) as i32;
    if !like.contains('.') {
        significant = significant.min(3);
    }
    let printed = |decimals: usize| format!("{value:.decimals$}");
    let magnitude = if value == 0.0 { 0 } else { value.abs().log10().floor() as i32 };
    let mut decimals = (significant - 1 - magnitude).max(0) as usize;
    // Rounding up may add a digit (9.996 to 10.00): one decimal fewer then.
    let digits = |s: &str| s.replace(['.', '-'], "").trim_start_matches('0').len() as i32;
    if decimals > 0 && digits(&printed(decimals)) > significant {
        decimals -= 1;
    }
    let text = printed(decimals);
    if like.contains(',') { grouped(&text) } else { text }
}

/// A printed number with thousands separators.
fn grouped(text: &str) -> String {
    let (whole, fraction) = text.split_once('.').map_or((text, None), |(w, f)| (w, Some(f)));
    let mut out = String::new();
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 && c.is_ascii_digit() {
            out.push(',');
        }
        out.push(c);
    }
    match fraction {
        Some(f) => format!("{out}.{f}"),
        None => out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows(values: &[(&str, &str, f64, f64)]) -> Rows {
        values
            .iter()
            .map(|(key, unit, cuda_mem, peer)| {
                let row = json!({"key": key, "unit": unit, "cuda_mem": cuda_mem, "peer_value": peer,
                                 "ratio": cuda_mem / peer, "speedup": peer / cuda_mem});
                (key.to_string(), row)
            })
            .collect()
    }

    #[test]
    fn figures_take_the_new_rows_values_to_the_same_digits() {
        let old = rows(&[
            ("pair_1m", "us", 0.0411, 0.771),
            ("serving", "ns", 16064.0, 2337.0),
            ("misses", "count", 1207.0, 1015.0),
        ]);
        let new = rows(&[
            ("pair_1m", "us", 0.0452, 0.848),
            ("serving", "ns", 2290.0, 2400.0),
            ("misses", "count", 980.0, 1015.0),
        ]);
        let quotes = Quotes::new("2026-12-03-h200", "2026-12-08-h200", &old, &new);
        let line = "0.0411 µs against 0.771 µs ([pair_1m, 2026-12-03](bench/2026-12-03-h200/report.md#pair_1m)); \
                    16,064 ns per op, 6.87× RMM's, misses 1207 ([serving, 2026-12-03](bench/2026-12-03-h200/report.md#serving), \
                    [misses, 2026-12-03](bench/2026-12-03-h200/report.md#misses)) on 64 MiB";
        let mut review = Vec::new();
        let moved = quotes.line(line, &mut |w| review.push(w));
        assert_eq!(
            moved,
            "0.0452 µs against 0.848 µs ([pair_1m, 2026-12-08](bench/2026-12-08-h200/report.md#pair_1m)); \
             2,290 ns per op, 0.954× RMM's, misses 980 ([serving, 2026-12-08](bench/2026-12-08-h200/report.md#serving), \
             [misses, 2026-12-08](bench/2026-12-08-h200/report.md#misses)) on 64 MiB"
        );
        assert_eq!(review.len(), 1, "{review:?}");
        assert!(review[0].contains("crossed 1"), "{review:?}");
    }

    #[test]
    fn what_it_cannot_map_is_left_and_listed() {
        let old = rows(&[("pair_1m", "us", 0.0411, 0.771)]);
        let new = rows(&[("pair_1m", "us", 0.0452, 0.848)]);
        let quotes = Quotes::new("2026-12-03-h200", "2026-12-08-h200", &old, &new);
        let mut review = Vec::new();
        let keyed = "12.5 µs ([pair_1m, 2026-12-03](bench/2026-12-03-h200/report.md#pair_1m))";
        assert_eq!(
            quotes.line(keyed, &mut |w| review.push(w)),
            "12.5 µs ([pair_1m, 2026-12-08](bench/2026-12-08-h200/report.md#pair_1m))"
        );
        let unkeyed = "| 0.0411 | see [the report of 2026-12-03](bench/2026-12-03-h200/report.md) |";
        assert_eq!(
            quotes.line(unkeyed, &mut |w| review.push(w)),
            "| 0.0411 | see [the report of 2026-12-08](bench/2026-12-08-h200/report.md) |"
        );
        assert_eq!(review.len(), 2, "{review:?}");
        assert!(
            review[0].contains("12.5 µs is no value of either") && review[1].contains("without a row key"),
            "{review:?}"
        );
        let untouched = "0.0411 µs in [another report](bench/2026-11-29-h200/report.md#pair_1m)";
        assert_eq!(quotes.line(untouched, &mut |w| review.push(w)), untouched);
        let one_call = "12.5 µs in [one call's rows](bench/2026-12-03-h200/ab-slack-slot/)";
        assert_eq!(quotes.line(one_call, &mut |w| review.push(w)), one_call);
        assert_eq!(review.len(), 2, "{review:?}");
    }

    #[test]
    fn a_figure_no_key_names_moves_by_value_when_one_row_holds_it() {
        let (old, new) = (rows(&[("pair_1m", "us", 0.0411, 0.771)]), rows(&[("pair_1m", "us", 0.0452, 0.848)]));
        let old_wrapper = rows(&[("h2d_pinned", "GB/s", 55.2, 54.9), ("d2h_pinned", "GB/s", 55.0, 55.2)]);
        let new_wrapper = rows(&[("h2d_pinned", "GB/s", 53.1, 54.0), ("d2h_pinned", "GB/s", 52.7, 54.0)]);
        let mut quotes = Quotes::new("2026-12-03-h200", "2026-12-08-h200", &old, &new);
        quotes.tables.push(Table { file: WRAPPER, old: &old_wrapper, new: &new_wrapper });
        let mut review = Vec::new();
        let line = "copies at 55.0 GB/s, 0.771 µs ([raw/paired/report](bench/2026-12-03-h200/raw/paired/report/))";
        assert_eq!(
            quotes.line(line, &mut |w| review.push(w)),
            "copies at 52.7 GB/s, 0.848 µs ([raw/paired/report](bench/2026-12-08-h200/raw/paired/report/))"
        );
        assert!(
            review.iter().any(|r| r.contains("matched by value to d2h_pinned.cuda_mem of raw/paired/report")),
            "{review:?}"
        );
        assert!(
            review.iter().any(|r| r.contains("matched by value to pair_1m.peer_value of results.json")),
            "{review:?}"
        );
        // A line that links nothing, in a document citing the report: by value too.
        assert_eq!(quotes.unlinked_line("reads at 55.0 GB/s", &mut |w| review.push(w)), "reads at 52.7 GB/s");
        // 55.2 GB/s is two rows' value (one's cuda_mem, the other's peer): left for a person.
        let ambiguous = "at 55.2 GB/s ([raw/paired/report](bench/2026-12-03-h200/raw/paired/report/))";
        assert!(quotes.line(ambiguous, &mut |w| review.push(w)).starts_with("at 55.2 GB/s"));
        assert!(review.last().unwrap().contains("is the value of 2 rows"), "{review:?}");
    }

    #[test]
    fn printing_keeps_the_significant_digits() {
        assert_eq!(print_like(0.04523, "0.0411"), "0.0452");
        assert_eq!(print_like(9.996, "9.99"), "10.0");
        assert_eq!(print_like(1.0, "1.00"), "1.00");
        assert_eq!(print_like(20013.4, "16,064"), "20,013");
        assert_eq!(print_like(123456.0, "16,064"), "123,456");
        assert_eq!(print_like(118.4, "601"), "118");
        assert_eq!(print_like(45.34, "601"), "45.3");
        assert_eq!(print_like(0.9541, "1.03"), "0.954");
    }
}
