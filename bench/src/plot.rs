//! Line charts as SVG (plotters' SVG backend: text is emitted as SVG `<text>`,
//! so no system fonts or fontconfig are needed).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// Chart size in pixels.
const CHART_SIZE: (u32, u32) = (800, 480);
/// Series colours, cycled.
const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];
/// Relative head-room above the largest value.
const Y_HEADROOM: f64 = 1.1;

/// One named line.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart to draw.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Plot the x axis in log10 scale (values must be > 0).
    pub log_x: bool,
    pub series: &'a [Series],
}

/// Draws `chart` to the SVG file `path`.
pub fn line_chart(path: &Path, chart: &Chart) -> Result<()> {
    let tx = |x: f64| {
        if chart.log_x {
            x.max(f64::MIN_POSITIVE).log10()
        } else {
            x
        }
    };
    let all: Vec<(f64, f64)> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|&(x, y)| (tx(x), y)))
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let (x0, x1) = bounds(all.iter().map(|p| p.0));
    let (y0, y1) = bounds(all.iter().map(|p| p.1));
    let (y0, y1) = (y0.min(0.0), if y1 > 0.0 { y1 * Y_HEADROOM } else { 1.0 });
    let root = SVGBackend::new(path, CHART_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut ctx = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| anyhow!("{e}"))?;
    let log_x = chart.log_x;
    let fmt_x = move |v: &f64| short_number(if log_x { 10f64.powf(*v) } else { *v });
    ctx.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&|v| short_number(*v))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for (i, s) in chart.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (tx(x), y)).collect();
        ctx.draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| anyhow!("{e}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    ctx.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if (hi - lo).abs() < f64::EPSILON {
        return (lo - 0.5, hi + 0.5);
    }
    (lo, hi)
}

/// 1234 → "1.2k", 0.0123 → "0.012".
pub fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_svg_without_fonts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.svg");
        let series = [
            Series {
                name: "a".into(),
                points: vec![(1.0, 1.0), (10.0, 5.0), (100.0, 7.0)],
            },
            Series {
                name: "b".into(),
                points: vec![(1.0, 2.0), (100.0, 3.0)],
            },
        ];
        let chart = Chart {
            title: "t",
            x_label: "x",
            y_label: "y",
            log_x: true,
            series: &series,
        };
        line_chart(&path, &chart).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    }
}
