//! Figures as the documents print them (a number, or a chain of numbers, and a unit of time,
//! bandwidth, rate or ratio): read by `cargo xtask requote` and by tests/doc_figures.rs, which
//! includes this file, so both see the same figures.

use regex::Regex;
use std::sync::LazyLock;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Family {
    Time,
    Bandwidth,
    Rate,
    Ratio,
}

/// A unit: its family and its size in the family's base unit (µs, GB/s, M/s, ×), the units the
/// report's tables and results.json use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unit {
    pub family: Family,
    pub scale: f64,
}

pub fn unit(text: &str) -> Unit {
    let (family, scale) = match text {
        "ns" => (Family::Time, 1e-3),
        "µs" | "μs" | "us" => (Family::Time, 1.0),
        "ms" => (Family::Time, 1e3),
        "MB/s" => (Family::Bandwidth, 1e-3),
        "GB/s" => (Family::Bandwidth, 1.0),
        "TB/s" => (Family::Bandwidth, 1e3),
        "M/s" => (Family::Rate, 1.0),
        "×" | "x" | "倍" => (Family::Ratio, 1.0),
        other => unreachable!("unit {other}"),
    };
    Unit { family, scale }
}

/// A number as printed: its value and the step of its last printed digit.
#[derive(Debug, Clone, Copy)]
pub struct Number {
    pub value: f64,
    pub step: f64,
}

pub fn number(text: &str) -> Number {
    let plain = text.replace(',', "");
    let decimals = plain.split_once('.').map_or(0, |(_, frac)| frac.len());
    Number { value: plain.parse().unwrap(), step: 10f64.powi(-(decimals as i32)) }
}

pub const NUM: &str = r"\d+(?:,\d{3})*(?:\.\d+)?";

/// Numeric fields of a results row that count or describe the setup rather than measure: never a
/// figure a document quotes.
pub const NOT_MEASURED: &[&str] =
    &["k", "samples", "bytes", "target", "target_ratio", "sms", "concurrent_managed_access", "pageable_memory_access"];

/// A chain of numbers that share the unit after the last one: `A–B / C–D ms`,
/// `A (H2D) / B (D2H) GB/s`, `A vs B GB/s`, each letter a number.
pub static FIGURE: LazyLock<Regex> = LazyLock::new(|| {
    let paren = r"(?:\s*[(（][^()（）]*[)）])?";
    let sep = r"(?:\s*(?:–|—|-|/|、|,|，|对|到|至)\s*|\s+(?:to|vs\.?|and|or)\s+)";
    let unit = r"(?:\s*(µs|μs|us|ms|ns|MB/s|GB/s|TB/s|M/s|×|倍)|(x))";
    Regex::new(&format!(r"(?:^|[^A-Za-z0-9_.^])({NUM}{paren}(?:{sep}{NUM}{paren})*){unit}")).unwrap()
});
pub static NUMBER: LazyLock<Regex> = LazyLock::new(|| Regex::new(NUM).unwrap());

/// A quoted figure: one number of a chain, with the chain's unit.
#[derive(Debug, Clone)]
pub struct Figure {
    /// Byte offset in the line.
    pub at: usize,
    pub text: String,
    pub unit: Unit,
    pub unit_text: String,
}

pub fn figures(line: &str) -> Vec<Figure> {
    let mut found = Vec::new();
    for caps in FIGURE.captures_iter(line) {
        // The unit ends a word ("4 usize" and "16x86" are not figures).
        if line[caps.get(0).unwrap().end()..].chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let chain = caps.get(1).unwrap();
        let unit_text = caps.get(2).or(caps.get(3)).unwrap().as_str();
        for m in NUMBER.find_iter(chain.as_str()) {
            // Numbers inside a parenthesis of the chain ("(4 KiB)") are not this unit's figures.
            let before = &chain.as_str()[..m.start()];
            if before.matches(['(', '（']).count() > before.matches([')', '）']).count() {
                continue;
            }
            found.push(Figure {
                at: chain.start() + m.start(),
                text: m.as_str().to_string(),
                unit: unit(unit_text),
                unit_text: unit_text.to_string(),
            });
        }
    }
    found
}
