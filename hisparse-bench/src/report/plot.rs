//! SVG line charts (plotters, SVG backend only: no font or image libraries needed), returned as
//! text for the caller to write atomically. Each chart has its own title; the legend sits in a
//! column beside the plot (never over the data) and draws every line in its own style (dashed
//! lines dashed); series may carry a min..max spread per point (error bars); vertical markers
//! label where something changes along x (e.g. a new concurrency level).

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{BenchError, Result};

/// One line of a chart.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (bounds, references, the baseline).
    pub dashed: bool,
    /// Per point, the (min, max) of repeated measurements: drawn as error bars.
    pub spread: Vec<(f64, f64)>,
    /// Colour index (series with the same index share a colour; `None`: by position).
    pub color: Option<usize>,
}

/// A vertical line at `x` with a label (e.g. where a concurrency level begins).
#[derive(Debug, Clone)]
pub struct Marker {
    /// Where.
    pub x: f64,
    /// What begins there.
    pub label: String,
}

/// Axes and titles of a chart.
#[derive(Debug, Clone, Default)]
pub struct Chart<'a> {
    /// Title on top.
    pub title: &'a str,
    /// Label of the x axis.
    pub x_label: &'a str,
    /// Label of the y axis.
    pub y_label: &'a str,
    /// Logarithmic x axis (base 2 ticks).
    pub log_x: bool,
    /// Vertical markers.
    pub markers: &'a [Marker],
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

const WIDTH: u32 = 980;
const LEGEND: u32 = 260;

fn color(s: &Series, i: usize) -> RGBColor {
    COLORS[s.color.unwrap_or(i) % COLORS.len()]
}

/// A tick label: integers without decimals, others with up to two.
fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 { format!("{x:.0}") } else { format!("{x:.2}") }
}

fn draw_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Check(format!("plot: {e}"))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// The x and y ranges of `series` (spreads included); an error for no points.
fn ranges(chart: &Chart<'_>, series: &[Series]) -> Result<((f64, f64), f64)> {
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    for s in series {
        for (i, &(x, y)) in s.points.iter().enumerate() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y).max(s.spread.get(i).map_or(y, |&(_, hi)| hi));
        }
    }
    if !x0.is_finite() {
        return Err(BenchError::Check(format!("plot {}: no points", chart.title)));
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    Ok(((x0, x1), if y1 > 0.0 && y1.is_finite() { y1 * 1.08 } else { 1.0 }))
}

/// Draws one chart (title, axes, lines, error bars, markers) into `area`.
fn panel(area: &Area<'_>, chart: &Chart<'_>, series: &[Series]) -> Result<()> {
    let ((x0, x1), y1) = ranges(chart, series)?;
    let mut b = ChartBuilder::on(area);
    b.caption(chart.title, ("sans-serif", 20)).margin(14).x_label_area_size(44).y_label_area_size(70);
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
            for m in chart.markers {
                let style = BLACK.mix(0.35).stroke_width(1);
                ctx.draw_series(DashedLineSeries::new([(m.x, 0.0), (m.x, y1)], 4, 4, style)).map_err(draw_err)?;
                ctx.draw_series(std::iter::once(Text::new(m.label.clone(), (m.x, y1 * 0.98), ("sans-serif", 12))))
                    .map_err(draw_err)?;
            }
            for (i, s) in series.iter().enumerate() {
                let c = color(s, i);
                let line = s.points.iter().copied();
                if s.dashed {
                    ctx.draw_series(DashedLineSeries::new(line, 6, 4, c.stroke_width(2))).map_err(draw_err)?;
                } else {
                    ctx.draw_series(LineSeries::new(line, c.stroke_width(2))).map_err(draw_err)?;
                }
                if s.points.len() <= 60 {
                    ctx.draw_series(s.points.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled())))
                        .map_err(draw_err)?;
                }
                ctx.draw_series(
                    s.points
                        .iter()
                        .zip(&s.spread)
                        .map(|(&(x, y), &(lo, hi))| ErrorBar::new_vertical(x, lo, y, hi, c.stroke_width(1), 8)),
                )
                .map_err(draw_err)?;
            }
        }};
    }
    if chart.log_x {
        draw!(b.build_cartesian_2d((x0..x1).log_scale().base(2.0), 0f64..y1).map_err(draw_err)?);
    } else {
        draw!(b.build_cartesian_2d(x0..x1, 0f64..y1).map_err(draw_err)?);
    }
    Ok(())
}

/// The legend column: each series' line in its own style, and its label.
fn legend(area: &Area<'_>, series: &[Series], top: i32) -> Result<()> {
    for (i, s) in series.iter().enumerate() {
        let y = top + 22 * i as i32;
        let c = color(s, i);
        let style = c.stroke_width(2);
        if s.dashed {
            for k in 0..3 {
                let x = 10 + 10 * k;
                area.draw(&PathElement::new(vec![(x, y), (x + 6, y)], style)).map_err(draw_err)?;
            }
        } else {
            area.draw(&PathElement::new(vec![(10, y), (36, y)], style)).map_err(draw_err)?;
        }
        area.draw(&Text::new(s.label.clone(), (44, y - 7), ("sans-serif", 13))).map_err(draw_err)?;
    }
    Ok(())
}

/// One chart with its legend beside it, as SVG text.
pub fn line_chart(chart: &Chart<'_>, series: &[Series]) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (plot, side) = root.split_horizontally(WIDTH - LEGEND);
        panel(&plot, chart, series)?;
        legend(&side, series, 60)?;
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// Two charts stacked (sharing the legend column of the top one's series and the bottom
/// one's), as SVG text.
pub fn stacked_charts(top: (&Chart<'_>, &[Series]), bottom: (&Chart<'_>, &[Series])) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 900)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (upper, lower) = root.split_vertically(520);
        let (plot, side) = upper.split_horizontally(WIDTH - LEGEND);
        panel(&plot, top.0, top.1)?;
        legend(&side, top.1, 60)?;
        let (plot, side) = lower.split_horizontally(WIDTH - LEGEND);
        panel(&plot, bottom.0, bottom.1)?;
        legend(&side, bottom.1, 50)?;
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// The "misses per step over time" chart: one line per `(label, misses per step)`, with
/// `markers` where something changes (a new concurrency level).
pub fn misses_over_time(
    title: &str,
    lines: impl IntoIterator<Item = (String, Vec<f64>)>,
    markers: &[Marker],
) -> Result<String> {
    let series: Vec<Series> = lines
        .into_iter()
        .map(|(label, v)| Series {
            label,
            points: v.iter().enumerate().map(|(i, &m)| (i as f64, m)).collect(),
            ..Series::default()
        })
        .collect();
    let chart =
        Chart { title, x_label: "decode step", y_label: "mean misses per request and layer", log_x: false, markers };
    line_chart(&chart, &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_its_title_a_dashed_legend_entry_error_bars_and_markers() {
        let series = vec![
            Series {
                label: "resident".into(),
                points: vec![(1.0, 10.0), (2.0, 11.0)],
                dashed: true,
                ..Series::default()
            },
            Series {
                label: "hisparse".into(),
                points: vec![(1.0, 9.0), (2.0, 20.0)],
                spread: vec![(8.0, 9.5), (18.0, 21.0)],
                ..Series::default()
            },
        ];
        let markers = [Marker { x: 1.5, label: "4 requests".into() }];
        let chart =
            Chart { title: "T: glm-5.1, context 32768", x_label: "x", y_label: "y", log_x: false, markers: &markers };
        let svg = line_chart(&chart, &series).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("T: glm-5.1, context 32768"));
        assert!(svg.contains("4 requests") && svg.contains("resident") && svg.contains("hisparse"));
        assert!(line_chart(&chart, &[]).is_err(), "no points");
        let both = stacked_charts((&chart, &series), (&chart, &series)).unwrap();
        assert_eq!(both.matches("T: glm-5.1").count(), 2);
    }
}
