//! SVG plots with plotters' SVG backend (text is emitted as SVG `<text>`, so no fonts are needed
//! where the report is made).

use crate::join::{ReportRow, find};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

/// The allocation families drawn in the latency plot, with their sizes.
const FAMILIES: [&str; 9] = [
    "malloc",
    "malloc_host",
    "host_alloc_portable",
    "host_alloc_mapped",
    "host_alloc_wc",
    "managed",
    "async_default_sync",
    "async_retain_sync",
    "async_retain_nosync",
];
const SIZES: [(&str, &str); 3] = [("4k", "4 KiB"), ("1m", "1 MiB"), ("64m", "64 MiB")];

/// The copy rows drawn in the bandwidth plot, with short labels.
const COPIES: [(&str, &str); 9] = [
    ("h2d_pageable", "H2D pageable"),
    ("d2h_pageable", "D2H pageable"),
    ("h2d_pinned", "H2D pinned"),
    ("d2h_pinned", "D2H pinned"),
    ("h2d_wc", "H2D WC"),
    ("d2h_wc", "D2H WC"),
    ("h2d_registered", "H2D registered"),
    ("d2h_registered", "D2H registered"),
    ("d2d", "D2D"),
];

fn err(e: impl std::fmt::Display) -> String {
    format!("plotting failed: {e}")
}

/// Latency per family and size (log scale): cuda-mem as lines, raw CUDA as circles.
pub fn latency_svg(rows: &[ReportRow]) -> Result<String, String> {
    let value = |key: String, raw: bool| find(rows, &key).and_then(|r| if raw { r.raw } else { r.cuda_mem });
    let all: Vec<f64> = FAMILIES
        .iter()
        .flat_map(|f| SIZES.iter().flat_map(move |(s, _)| [(f, s, true), (f, s, false)]))
        .filter_map(|(f, s, raw)| value(format!("{f}_{s}"), raw))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).min(1.0) / 2.0;
    let hi = all.iter().copied().fold(0.0, f64::max).max(10.0) * 2.0;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Allocation + free pair latency (lines: cuda-mem, circles: raw CUDA)", ("sans-serif", 26))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((0u32..3u32).into_segmented(), (lo..hi).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(3)
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                    SIZES.get(*i as usize).map_or(String::new(), |s| s.1.to_string())
                }
                SegmentValue::Last => String::new(),
            })
            .label_style(("sans-serif", 16))
            .y_desc("µs per pair (log scale)")
            .x_desc("allocation size")
            .draw()
            .map_err(err)?;
        for (index, family) in FAMILIES.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            let series = |raw: bool| -> Vec<(SegmentValue<u32>, f64)> {
                SIZES
                    .iter()
                    .enumerate()
                    .filter_map(|(i, (s, _))| {
                        value(format!("{family}_{s}"), raw).map(|v| (SegmentValue::CenterOf(i as u32), v))
                    })
                    .collect()
            };
            let ours = series(false);
            let raw = series(true);
            if ours.is_empty() && raw.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(ours, color.stroke_width(2)))
                .map_err(err)?
                .label(*family)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(raw.into_iter().map(|p| Circle::new(p, 5, color.stroke_width(2)))).map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 17))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Picks one figure of a row.
type Figure = fn(&ReportRow) -> Option<f64>;

/// Copy bandwidth per host-memory kind: raw CUDA, cuda-mem and (when present) cudarc side by side.
pub fn bandwidth_svg(rows: &[ReportRow]) -> Result<String, String> {
    const SLOTS: u32 = 4; // raw, cuda-mem, cudarc, gap
    let peers: [(&str, RGBColor, Figure); 3] = [
        ("raw C++", RGBColor(90, 90, 90), |r| r.raw),
        ("cuda-mem", RGBColor(31, 119, 180), |r| r.cuda_mem),
        ("cudarc", RGBColor(255, 127, 14), |r| r.cudarc),
    ];
    // D2D is an order of magnitude above PCIe: it is left out of the bars and named in the caption.
    let host_copies = &COPIES[..8];
    let max = host_copies
        .iter()
        .filter_map(|(key, _)| find(rows, key))
        .flat_map(|r| peers.iter().filter_map(move |p| (p.2)(r)))
        .fold(1.0f64, f64::max);
    let d2d = find(rows, "d2d").and_then(|r| r.cuda_mem.or(r.raw));
    let caption = match d2d {
        Some(v) => format!("Copy bandwidth, 256 MiB (device to device: {v:.0} GB/s, not drawn)"),
        None => "Copy bandwidth, 256 MiB".to_string(),
    };

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let categories = host_copies.len() as u32;
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 26))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((0u32..categories * SLOTS).into_segmented(), 0f64..max * 1.4)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels((categories * SLOTS) as usize)
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if i % SLOTS == 1 => {
                    host_copies.get((i / SLOTS) as usize).map_or(String::new(), |c| c.1.to_string())
                }
                _ => String::new(),
            })
            .label_style(("sans-serif", 16))
            .y_desc("GB/s")
            .draw()
            .map_err(err)?;
        for (slot, (label, color, pick)) in peers.iter().enumerate() {
            let bars: Vec<(u32, f64)> = host_copies
                .iter()
                .enumerate()
                .filter_map(|(c, (key, _))| find(rows, key).and_then(pick).map(|v| (c as u32 * SLOTS + slot as u32, v)))
                .collect();
            if bars.is_empty() {
                continue;
            }
            let color = *color;
            chart
                .draw_series(Histogram::vertical(&chart).style(color.filled()).margin(1).data(bars.iter().copied()))
                .map_err(err)?
                .label(*label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 17))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::{Samples, parse_raw};
    use crate::join::join;
    use std::collections::BTreeMap;

    fn rows() -> Vec<ReportRow> {
        let raw = parse_raw(
            "{\"key\":\"malloc_4k\",\"value\":60,\"unit\":\"us\",\"detail\":\"\"}\n\
             {\"key\":\"malloc_1m\",\"value\":62,\"unit\":\"us\",\"detail\":\"\"}\n\
             {\"key\":\"async_retain_nosync_1m\",\"value\":0.8,\"unit\":\"us\",\"detail\":\"\"}\n\
             {\"key\":\"h2d_pinned\",\"value\":55.4,\"unit\":\"GB/s\",\"detail\":\"\"}\n\
             {\"key\":\"d2d\",\"value\":2055,\"unit\":\"GB/s\",\"detail\":\"\"}",
        )
        .unwrap();
        let mut ours = BTreeMap::new();
        ours.insert("malloc_4k".to_string(), Samples { iters: vec![1.0], times: vec![12.2e6] });
        ours.insert("h2d_pinned".to_string(), Samples { iters: vec![1.0], times: vec![4.9e6] });
        join(&raw, &ours, &BTreeMap::new(), false)
    }

    #[test]
    fn latency_plot_has_text_axes_and_legend() {
        let svg = latency_svg(&rows()).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("<text"), "no text elements");
        assert!(svg.contains("Allocation + free pair latency"));
        assert!(svg.contains("1 MiB"));
        assert!(svg.contains("\nmalloc\n"), "legend entry missing");
        assert!(svg.contains("<circle"));
    }

    #[test]
    fn bandwidth_plot_has_bars_labels_and_d2d_caption() {
        let svg = bandwidth_svg(&rows()).unwrap();
        assert!(svg.contains("H2D pinned"));
        assert!(svg.contains("device to device: 2055 GB/s"));
        assert!(svg.contains("cuda-mem"));
        assert!(svg.contains("<rect"));
    }
}
