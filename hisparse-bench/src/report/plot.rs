//! SVG line charts (plotters, SVG backend only: no font or image libraries needed).

use std::path::Path;

use plotters::prelude::*;

use crate::error::{BenchError, Result};

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (bounds, references).
    pub dashed: bool,
}

/// Axes and titles of a chart.
#[derive(Debug, Clone)]
pub struct Chart<'a> {
    /// Title on top.
    pub title: &'a str,
    /// Label of the x axis.
    pub x_label: &'a str,
    /// Label of the y axis.
    pub y_label: &'a str,
    /// Logarithmic x axis (base 2 ticks).
    pub log_x: bool,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A tick label: integers without decimals, others with up to two.
fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 { format!("{x:.0}") } else { format!("{x:.2}") }
}

fn draw_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Check(format!("plot: {e}"))
}

/// Draws `series` into an 900 x 560 SVG at `path`.
pub fn line_chart(path: &Path, chart: &Chart<'_>, series: &[Series]) -> Result<()> {
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        return Err(BenchError::Check(format!("plot {}: no points", chart.title)));
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let y1 = if y1 > 0.0 { y1 * 1.08 } else { 1.0 };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut b = ChartBuilder::on(&root);
    b.caption(chart.title, ("sans-serif", 22)).margin(18).x_label_area_size(44).y_label_area_size(64);
    let style = |i: usize| COLORS[i % COLORS.len()];
    macro_rules! draw {
        ($ctx:expr) => {{
            let mut ctx = $ctx;
            ctx.configure_mesh()
                .x_desc(chart.x_label)
                .y_desc(chart.y_label)
                .x_label_formatter(&|x| number(*x))
                .y_label_formatter(&|y| number(*y))
                .light_line_style(WHITE.mix(0.0))
                .draw()
                .map_err(draw_err)?;
            for (i, s) in series.iter().enumerate() {
                let color = style(i);
                let line = s.points.iter().copied();
                let anno = if s.dashed {
                    ctx.draw_series(DashedLineSeries::new(line, 6, 4, color.stroke_width(2))).map_err(draw_err)?
                } else {
                    ctx.draw_series(LineSeries::new(line, color.stroke_width(2))).map_err(draw_err)?
                };
                anno.label(s.label.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                if s.points.len() <= 40 {
                    ctx.draw_series(s.points.iter().map(|&(x, y)| Circle::new((x, y), 3, color.filled())))
                        .map_err(draw_err)?;
                }
            }
            ctx.configure_series_labels()
                .border_style(BLACK.mix(0.3))
                .background_style(WHITE.mix(0.9))
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(draw_err)?;
        }};
    }
    if chart.log_x {
        draw!(b.build_cartesian_2d((x0..x1).log_scale().base(2.0), 0f64..y1).map_err(draw_err)?);
    } else {
        draw!(b.build_cartesian_2d(x0..x1, 0f64..y1).map_err(draw_err)?);
    }
    root.present().map_err(draw_err)?;
    Ok(())
}

/// The "misses per step over time" chart: one line per `(label, misses per step)`.
pub fn misses_over_time(path: &Path, lines: impl IntoIterator<Item = (String, Vec<f64>)>) -> Result<()> {
    let series: Vec<Series> = lines
        .into_iter()
        .map(|(label, v)| Series {
            label,
            points: v.iter().enumerate().map(|(i, &m)| (i as f64, m)).collect(),
            dashed: false,
        })
        .collect();
    let chart = Chart {
        title: "Misses per step over time",
        x_label: "decode step",
        y_label: "mean misses per request and layer",
        log_x: false,
    };
    line_chart(path, &chart, &series)
}
