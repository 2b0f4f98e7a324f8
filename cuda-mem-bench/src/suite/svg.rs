//! The report's plots, written as plain SVG (text as `<text>`, no fonts needed):
//! `speed.svg` (each headline row's ratio to its peer, log scale), `threads.svg` (aggregate
//! pairs per second by thread count, cuda-mem and every peer) and `memory.svg` (peak reserved over
//! peak live per workload and allocator).

use super::Row;
use std::fmt::Write;

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 330.0;
const BAR: f64 = 18.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn document(height: f64, title: &str, body: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"20\" font-size=\"15\">{}</text>\n{body}</svg>\n",
        escape(title)
    )
}

/// Horizontal bars of `(label, value)` from `origin` (drawn as a line) on a linear or log axis.
fn bars(items: &[(String, f64)], title: &str, log: bool, origin: f64, note: &str) -> String {
    let map = |v: f64| if log { v.log10() } else { v };
    let values: Vec<f64> = items.iter().map(|(_, v)| map(*v)).chain([map(origin)]).collect();
    let (lo, hi) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
    let span = (hi - lo).max(1e-9);
    let x = |v: f64| LEFT + (map(v) - lo) / span * (WIDTH - LEFT - 80.0);
    let mut body = String::new();
    let top = 40.0;
    for (i, (label, value)) in items.iter().enumerate() {
        let y = top + i as f64 * (BAR + 4.0);
        let (a, b) = (x(origin).min(x(*value)), x(origin).max(x(*value)));
        let colour = if (*value < origin) == log { "#2b7bb9" } else { "#d9822b" };
        let _ = writeln!(
            body,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text><rect x=\"{a:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{BAR}\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{}\">{}</text>",
            LEFT - 6.0,
            y + 13.0,
            escape(label),
            (b - a).max(1.0),
            b + 4.0,
            y + 13.0,
            super::markdown::figure(*value)
        );
    }
    let bottom = top + items.len() as f64 * (BAR + 4.0);
    let _ = writeln!(
        body,
        "<line x1=\"{0:.1}\" y1=\"{top}\" x2=\"{0:.1}\" y2=\"{bottom}\" stroke=\"black\"/>\n<text x=\"10\" y=\"{1}\">{2}</text>",
        x(origin),
        bottom + 20.0,
        escape(note)
    );
    document(bottom + 30.0, title, &body)
}

/// The headline rows: those with a ratio, one per figure (no `_vs_` variants), outside the
/// wrapper table and the thread counts (plotted apart).
fn headline(rows: &[Row]) -> Vec<(String, f64)> {
    rows.iter()
        .filter(|r| !r.key.contains("_vs_") && !matches!(r.section, "paired" | "threads"))
        .filter(|r| r.unit != "count")
        .filter_map(|r| Some((format!("{} / {}", r.key, r.peer), r.ratio()?)))
        .filter(|(_, ratio)| *ratio > 0.0)
        .collect()
}

/// Lines of aggregate pairs per second over thread counts: cuda-mem's and each peer's.
fn threads(rows: &[Row]) -> Option<String> {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.section == "threads").collect();
    let count =
        |r: &Row| -> Option<f64> { r.key.strip_prefix("device_cache_threads_")?.split('_').next()?.parse().ok() };
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut add = |name: &str, n: f64, v: Option<f64>| {
        let Some(v) = v.filter(|v| *v > 0.0) else { return };
        match series.iter_mut().find(|(s, _)| s == name) {
            Some((_, points)) => {
                if !points.iter().any(|(m, _)| *m == n) {
                    points.push((n, v));
                }
            }
            None => series.push((name.to_string(), vec![(n, v)])),
        }
    };
    for r in &rows {
        let Some(n) = count(r) else { continue };
        add("cuda-mem DeviceCache", n, r.cuda_mem);
        add(&r.peer, n, r.peer_value);
    }
    if series.is_empty() {
        return None;
    }
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let max_n = points.clone().map(|(n, _)| *n).fold(1.0, f64::max);
    let (lo, hi) =
        points.map(|(_, v)| v.log10()).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = (lo.floor(), hi.ceil().max(lo.floor() + 1.0));
    let (x0, x1, y0, y1) = (80.0, WIDTH - 400.0, 440.0, 50.0);
    let x = |n: f64| x0 + (n.log2() / max_n.log2().max(1.0)) * (x1 - x0);
    let y = |v: f64| y0 - (v.log10() - lo) / (hi - lo) * (y0 - y1);
    let colours = ["#2b7bb9", "#d9822b", "#3a9e4a", "#b93b3b", "#7a52a8", "#8c6d31", "#555555"];
    let mut body = format!(
        "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/><line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"black\"/>\n"
    );
    for decade in lo as i32..=hi as i32 {
        let v = 10f64.powi(decade);
        let _ = writeln!(
            body,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            x0 - 6.0,
            y(v) + 4.0,
            super::markdown::figure(v)
        );
    }
    let mut n = 1.0;
    while n <= max_n {
        let _ = writeln!(body, "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{n}</text>", x(n), y0 + 16.0);
        n *= 2.0;
    }
    for (i, (name, mut points)) in series.into_iter().enumerate() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let colour = colours[i % colours.len()];
        let path: Vec<String> = points.iter().map(|(n, v)| format!("{:.1},{:.1}", x(*n), y(*v))).collect();
        let _ = writeln!(
            body,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/><text x=\"{}\" y=\"{}\" fill=\"{colour}\">{}</text>",
            path.join(" "),
            x1 + 16.0,
            y1 + 16.0 * i as f64,
            escape(&name)
        );
    }
    let _ = writeln!(
        body,
        "<text x=\"{x0}\" y=\"{}\">threads (a stream each); aggregate M pairs/s, log scale</text>",
        y0 + 36.0
    );
    Some(document(y0 + 50.0, "Thread scaling: 1 MiB alloc + free pairs", &body))
}

/// Bars of reserved over live, cuda-mem's and each peer's, per workload and for the loop.
fn memory(rows: &[Row]) -> Vec<(String, f64)> {
    let mut items = Vec::new();
    for r in rows.iter().filter(|r| r.key.contains("reserved_over_")) {
        let subject = r.key.split("_reserved_over_").next().unwrap_or(&r.key).to_string();
        if !r.key.contains("_vs_")
            && let Some(v) = r.cuda_mem
        {
            items.push((format!("{subject}: cuda-mem"), v));
        }
        if let Some(v) = r.peer_value {
            items.push((format!("{subject}: {}", r.peer), v));
        }
    }
    items
}

/// Every plot the rows allow, by file name.
pub fn plots(rows: &[Row]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let speed = headline(rows);
    if !speed.is_empty() {
        let note = "ratio = cuda-mem's cost over the peer's, log scale: left of the line (blue) cuda-mem is ahead";
        out.push(("speed.svg".to_string(), bars(&speed, "cuda-mem against its peers, same run", true, 1.0, note)));
    }
    if let Some(svg) = threads(rows) {
        out.push(("threads.svg".to_string(), svg));
    }
    let memory = memory(rows);
    if !memory.is_empty() {
        let note = "peak reserved / peak live (1 = no memory held beyond what is in use)";
        out.push(("memory.svg".to_string(), bars(&memory, "Memory held by each allocator", false, 1.0, note)));
    }
    out
}
