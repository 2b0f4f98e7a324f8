//! SVG plots with plotters' SVG backend (text is emitted as SVG `<text>`, so no fonts are needed
//! where the report is made).

use crate::join::ReportRow;
use crate::rows::{Row, Section, section_rows};
use plotters::coord::{CoordTranslate, Shift, ranged1d::SegmentValue};
use plotters::prelude::*;

const SIZES: [(&str, &str); 3] = [("4k", "4 KiB"), ("1m", "1 MiB"), ("64m", "64 MiB")];

fn err(e: impl std::fmt::Display) -> String {
    format!("plotting failed: {e}")
}

fn find<'a>(rows: &'a [ReportRow], key: &str) -> Option<&'a ReportRow> {
    rows.iter().find(|r| r.row.key == key)
}

/// An SVG of `size` pixels, white, with what `draw` puts on it.
fn svg(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(&root)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn legend<'a, 'b: 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, CT>,
    at: SeriesLabelPosition,
) -> Result<(), String> {
    let mut labels = chart.configure_series_labels();
    labels
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 17))
        .draw()
        .map_err(err)
}

/// Latency per family and size (log scale): cuda-mem as lines, raw CUDA as circles; every family
/// measured at the three sizes.
pub fn latency_svg(rows: &[ReportRow]) -> Result<String, String> {
    let mut families: Vec<&str> = section_rows(Section::Alloc).map(Row::family).filter(|f| *f != "pool_odd").collect();
    families.dedup();
    let value = |key: String, raw: bool| find(rows, &key).and_then(|r| if raw { r.raw } else { r.cuda_mem });
    let all: Vec<f64> = families
        .iter()
        .flat_map(|f| SIZES.iter().flat_map(move |(s, _)| [(f, s, true), (f, s, false)]))
        .filter_map(|(f, s, raw)| value(format!("{f}_{s}"), raw))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).min(1.0) / 2.0;
    let hi = all.iter().copied().fold(0.0, f64::max).max(10.0) * 2.0;
    svg((960, 600), |root| {
        let mut chart = ChartBuilder::on(root)
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
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => SIZES.get(*i as usize).map_or("", |s| s.1).into(),
                SegmentValue::Last => String::new(),
            })
            .label_style(("sans-serif", 16))
            .y_desc("µs per pair (log scale)")
            .x_desc("allocation size")
            .draw()
            .map_err(err)?;
        for (index, family) in families.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            let series = |raw: bool| -> Vec<(SegmentValue<u32>, f64)> {
                let point = |(i, (s, _)): (usize, &(&str, &str))| {
                    Some((SegmentValue::CenterOf(i as u32), value(format!("{family}_{s}"), raw)?))
                };
                SIZES.iter().enumerate().filter_map(point).collect()
            };
            let (ours, raw) = (series(false), series(true));
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
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

/// Copy bandwidth per host-memory kind: raw CUDA, cuda-mem and (when present) cudarc side by side.
/// D2D is an order of magnitude above PCIe: it is named in the caption, not drawn.
pub fn bandwidth_svg(rows: &[ReportRow]) -> Result<String, String> {
    let copies: Vec<(&str, String)> = section_rows(Section::Bandwidth)
        .filter_map(|r| {
            r.key
                .split_once('_')
                .map(|(dir, kind)| (r.key, format!("{} {}", dir.to_uppercase(), kind.replace("wc", "WC"))))
        })
        .collect();
    const SLOTS: u32 = 4; // raw, cuda-mem, cudarc, gap
    type Figure = fn(&ReportRow) -> Option<f64>;
    let peers: [(&str, RGBColor, Figure); 3] = [
        ("raw C++", RGBColor(90, 90, 90), |r| r.raw),
        ("cuda-mem", RGBColor(31, 119, 180), |r| r.cuda_mem),
        ("cudarc", RGBColor(255, 127, 14), |r| r.cudarc),
    ];
    let max = copies
        .iter()
        .filter_map(|(key, _)| find(rows, key))
        .flat_map(|r| peers.iter().filter_map(move |p| (p.2)(r)))
        .fold(1.0f64, f64::max);
    let caption = match find(rows, "d2d").and_then(|r| r.cuda_mem.or(r.raw)) {
        Some(v) => format!("Copy bandwidth, 256 MiB (device to device: {v:.0} GB/s, not drawn)"),
        None => "Copy bandwidth, 256 MiB".to_string(),
    };
    let categories = copies.len() as u32;
    svg((1100, 560), |root| {
        let mut chart = ChartBuilder::on(root)
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
                    copies.get((i / SLOTS) as usize).map_or(String::new(), |c| c.1.clone())
                }
                _ => String::new(),
            })
            .label_style(("sans-serif", 16))
            .y_desc("GB/s")
            .draw()
            .map_err(err)?;
        for (slot, &(label, color, pick)) in peers.iter().enumerate() {
            let bar = |(c, (key, _)): (usize, &(&str, String))| {
                Some((c as u32 * SLOTS + slot as u32, pick(find(rows, key)?)?))
            };
            let bars: Vec<(u32, f64)> = copies.iter().enumerate().filter_map(bar).collect();
            if bars.is_empty() {
                continue;
            }
            chart
                .draw_series(Histogram::vertical(&chart).style(color.filled()).margin(1).data(bars))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}
