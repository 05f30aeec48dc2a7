//! Drawing a [`Plot`] with plotters, once on a bitmap (encoded as PNG) and once as SVG.

use std::sync::OnceLock;

use plotters::backend::RGBPixel;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};

use crate::ChartError;
use crate::data::{Body, Plot, Series, XScale};
use crate::format;

/// The family every text uses; DejaVu Sans is registered under it, and SVG viewers fall
/// back to their own sans-serif.
const FONT: &str = "sans-serif";

/// Tableau 10: distinct, colour-blind-friendly enough, and what people know.
const PALETTE: [RGBColor; 10] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(225, 87, 89),
    RGBColor(118, 183, 178),
    RGBColor(89, 161, 79),
    RGBColor(237, 201, 72),
    RGBColor(176, 122, 161),
    RGBColor(255, 157, 167),
    RGBColor(156, 117, 95),
    RGBColor(186, 176, 172),
];

/// Line and area series with at most this many points get a dot on each.
const MARKED_POINTS: usize = 40;

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Registers the embedded font once per process.
fn font() -> Result<(), ChartError> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the embedded DejaVu Sans regular is not a valid font")?;
            register_font(FONT, FontStyle::Bold, dejavu::sans::bold())
                .map_err(|_| "the embedded DejaVu Sans bold is not a valid font")?;
            Ok(())
        })
        .clone()
        .map_err(ChartError::Draw)
}

fn fail<E: std::fmt::Display>(e: E) -> ChartError {
    ChartError::Draw(e.to_string())
}

/// (PNG bytes, SVG text).
pub(crate) fn draw(
    plot: &Plot,
    title: &str,
    width: u32,
    height: u32,
) -> Result<(Vec<u8>, String), ChartError> {
    font()?;
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    {
        let backend = BitMapBackend::<RGBPixel>::with_buffer_and_format(&mut rgb, (width, height))
            .map_err(fail)?;
        let root = backend.into_drawing_area();
        draw_on(&root, plot, title)?;
        root.present().map_err(fail)?;
    }
    let png = encode_png(&rgb, width, height)?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        draw_on(&root, plot, title)?;
        root.present().map_err(fail)?;
    }
    Ok((png, svg))
}

fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, ChartError> {
    let mut out = Vec::with_capacity(rgb.len() / 8);
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fast);
    let mut writer = encoder.write_header().map_err(fail)?;
    writer.write_image_data(rgb).map_err(fail)?;
    writer.finish().map_err(fail)?;
    Ok(out)
}

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    plot: &Plot,
    title: &str,
) -> Result<(), ChartError> {
    root.fill(&WHITE).map_err(fail)?;
    let area = root
        .titled(title, (FONT, 22).into_font().style(FontStyle::Bold))
        .map_err(fail)?;
    match &plot.body {
        Body::Pie { slices } => pie(&area, slices),
        _ => xy(&area, plot),
    }
}

/// One axis: its range, our ticks and how they read. A plotters coordinate of its own, so
/// the ticks are ours (round numbers, month starts) and every label goes through `label`.
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    label: Box<dyn Fn(&f64) -> String>,
}

impl Ranged for Axis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        let share = if span > 0.0 {
            (value - self.lo) / span
        } else {
            0.5
        };
        let px = f64::from(limit.0) + share * f64::from(limit.1 - limit.0);
        // Far outside values are clipped by the drawing area; keep them in i32.
        px.round().clamp(-1e6, 1e6) as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

impl ValueFormatter<f64> for Axis {
    fn format_ext(&self, value: &f64) -> String {
        (self.label)(value)
    }
}

fn number_axis(lo: f64, hi: f64, target: usize) -> Axis {
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo - 1.0, hi + 1.0)
    };
    let (ticks, step) = format::nice_ticks(lo, hi, target);
    let decimals = format::decimals_for(step);
    Axis {
        lo,
        hi,
        ticks,
        label: Box::new(move |v| format::number(*v, decimals)),
    }
}

fn x_axis(scale: &XScale, lo: f64, hi: f64, target: usize) -> Axis {
    match scale {
        XScale::Number => number_axis(lo, hi, target),
        XScale::Date => {
            let (lo, hi) = if hi > lo {
                (lo, hi)
            } else {
                (lo - 1.0, hi + 1.0)
            };
            let (ticks, step) = format::date_ticks(lo, hi, target);
            Axis {
                lo,
                hi,
                ticks,
                label: Box::new(move |v| format::date(*v, step)),
            }
        }
        XScale::Category(labels) => category_axis(labels.clone(), target, 20),
    }
}

fn category_axis(labels: Vec<String>, target: usize, max_chars: usize) -> Axis {
    let n = labels.len();
    let every = n.div_ceil(target.max(1)).max(1);
    let ticks = (0..n).step_by(every).map(|i| i as f64).collect();
    Axis {
        lo: -0.5,
        hi: n as f64 - 0.5,
        ticks,
        label: Box::new(move |v| {
            let i = v.round();
            if i < 0.0 {
                return String::new();
            }
            labels
                .get(i as usize)
                .map(|l| format::short(l, max_chars))
                .unwrap_or_default()
        }),
    }
}

/// The y range of what is drawn; zero included when bars or areas rise from it.
fn y_range(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
        hi = hi.max(0.0);
    }
    let pad = (hi - lo) * 0.05;
    let lo = if from_zero && lo == 0.0 {
        0.0
    } else {
        lo - pad
    };
    (lo, hi + pad)
}

fn x_extent(series: &[Series]) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for p in series.iter().flat_map(|s| s.points.iter()) {
        lo = lo.min(p.0);
        hi = hi.max(p.0);
    }
    if lo > hi { (0.0, 1.0) } else { (lo, hi) }
}

fn xy<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, plot: &Plot) -> Result<(), ChartError> {
    let (w, h) = area.dim_in_pixel();
    let x_target = (w / 110).clamp(2, 12) as usize;
    let y_target = (h / 60).clamp(2, 10) as usize;
    // Categories that would not fit side by side are written downwards, one per bar (or
    // one per few when even that is too dense).
    let categories = match &plot.body {
        Body::Bars { categories, .. } => categories.len(),
        Body::Lines {
            x: XScale::Category(labels),
            ..
        } => labels.len(),
        _ => 0,
    };
    let rotate = categories > (w / 90).max(2) as usize;
    let (x_target, label_chars) = if rotate {
        ((w / 18).max(2) as usize, 18)
    } else {
        (x_target, 20)
    };
    let (x, y) = match &plot.body {
        Body::Bars { categories, series } => (
            category_axis(categories.clone(), x_target, label_chars),
            y_range(series.iter().flat_map(|(_, v)| v.iter().copied()), true),
        ),
        Body::Lines {
            x: scale,
            series,
            area,
        } => {
            let (lo, hi) = x_extent(series);
            let x = match scale {
                XScale::Category(labels) => category_axis(labels.clone(), x_target, label_chars),
                XScale::Number | XScale::Date => x_axis(scale, lo, hi, x_target),
            };
            (
                x,
                y_range(
                    series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
                    *area,
                ),
            )
        }
        Body::Dots { x: scale, series } => {
            let (lo, hi) = x_extent(series);
            let pad = (hi - lo) * 0.02;
            (
                x_axis(scale, lo - pad, hi + pad, x_target),
                y_range(
                    series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
                    false,
                ),
            )
        }
        Body::Histogram {
            x: scale,
            edges,
            series,
        } => {
            let lo = edges.first().copied().unwrap_or(0.0);
            let hi = edges.last().copied().unwrap_or(1.0);
            (
                x_axis(scale, lo, hi, x_target),
                y_range(
                    series.iter().flat_map(|(_, c)| c.iter().map(|v| *v as f64)),
                    true,
                ),
            )
        }
        Body::Pie { .. } => return Ok(()),
    };
    let y = number_axis(y.0, y.1, y_target);
    // The mesh centres x labels on their tick whatever their rotation, so rotated ones are
    // drawn here, starting just below the axis.
    let rotated: Vec<(f64, String)> = if rotate {
        x.ticks.iter().map(|t| (*t, (x.label)(t))).collect()
    } else {
        Vec::new()
    };
    let y_lo = y.lo;
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .margin_right(40)
        .x_label_area_size(if rotate { 150 } else { 44 })
        .y_label_area_size(84)
        .build_cartesian_2d(x, y)
        .map_err(fail)?;
    let no_label = |_: &f64| String::new();
    let mut mesh = chart.configure_mesh();
    if rotate {
        mesh.x_label_formatter(&no_label);
    }
    mesh.x_desc(plot.x_label.as_str())
        .y_desc(plot.y_label.as_str())
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(TRANSPARENT)
        .disable_x_mesh()
        .draw()
        .map_err(fail)?;
    let (base_x, base_y) = area.get_base_pixel();
    for (at, text) in &rotated {
        let (px, py) = chart.backend_coord(&(*at, y_lo));
        let style = TextStyle::from((FONT, 12).into_font())
            .transform(FontTransform::Rotate90)
            .pos(Pos::new(HPos::Left, VPos::Center));
        area.draw(&Text::new(
            text.as_str(),
            (px - base_x, py - base_y + 8),
            style,
        ))
        .map_err(fail)?;
    }

    let mut named = 0;
    match &plot.body {
        Body::Bars { series, .. } => {
            let n = series.len().max(1) as f64;
            let slot = 0.8 / n;
            for (s, (name, values)) in series.iter().enumerate() {
                let c = color(s);
                let bars = values.iter().enumerate().map(move |(i, v)| {
                    let left = i as f64 - 0.4 + slot * s as f64;
                    Rectangle::new([(left, 0.0), (left + slot * 0.95, *v)], c.filled())
                });
                let drawn = chart.draw_series(bars).map_err(fail)?;
                if series.len() > 1 {
                    named += 1;
                    drawn.label(name.as_str()).legend(move |(px, py)| {
                        Rectangle::new([(px, py - 5), (px + 12, py + 5)], c.filled())
                    });
                }
            }
        }
        Body::Lines { series, area, .. } => {
            for (s, line) in series.iter().enumerate() {
                let c = color(s);
                // Few points are marked, so a single one (or a sparse series) still shows.
                if line.points.len() <= MARKED_POINTS {
                    chart
                        .draw_series(
                            line.points
                                .iter()
                                .map(move |p| Circle::new(*p, 3, c.filled())),
                        )
                        .map_err(fail)?;
                }
                let drawn = if *area {
                    chart
                        .draw_series(
                            AreaSeries::new(line.points.iter().copied(), 0.0, c.mix(0.25))
                                .border_style(c.stroke_width(2)),
                        )
                        .map_err(fail)?
                } else {
                    chart
                        .draw_series(LineSeries::new(
                            line.points.iter().copied(),
                            c.stroke_width(2),
                        ))
                        .map_err(fail)?
                };
                if series.len() > 1 {
                    named += 1;
                    drawn.label(line.name.as_str()).legend(move |(px, py)| {
                        PathElement::new(vec![(px, py), (px + 14, py)], c.stroke_width(2))
                    });
                }
            }
        }
        Body::Dots { series, .. } => {
            for (s, dots) in series.iter().enumerate() {
                let c = color(s);
                let drawn = chart
                    .draw_series(
                        dots.points
                            .iter()
                            .map(move |p| Circle::new(*p, 2, c.mix(0.7).filled())),
                    )
                    .map_err(fail)?;
                if series.len() > 1 {
                    named += 1;
                    drawn
                        .label(dots.name.as_str())
                        .legend(move |(px, py)| Circle::new((px + 6, py), 4, c.filled()));
                }
            }
        }
        Body::Histogram { edges, series, .. } => {
            let alpha = if series.len() > 1 { 0.55 } else { 1.0 };
            for (s, (name, counts)) in series.iter().enumerate() {
                let c = color(s);
                let bars = counts.iter().enumerate().map(move |(i, n)| {
                    // A hairline gap, so neighbouring bins read as bins.
                    let gap = (edges[i + 1] - edges[i]) * 0.03;
                    Rectangle::new(
                        [(edges[i] + gap, 0.0), (edges[i + 1] - gap, *n as f64)],
                        c.mix(alpha).filled(),
                    )
                });
                let drawn = chart.draw_series(bars).map_err(fail)?;
                if series.len() > 1 {
                    named += 1;
                    drawn.label(name.as_str()).legend(move |(px, py)| {
                        Rectangle::new([(px, py - 5), (px + 12, py + 5)], c.mix(alpha).filled())
                    });
                }
            }
        }
        Body::Pie { .. } => {}
    }
    if named > 0 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font((FONT, 13))
            .draw()
            .map_err(fail)?;
    }
    Ok(())
}

fn pie<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    slices: &[(String, f64)],
) -> Result<(), ChartError> {
    let (w, h) = area.dim_in_pixel();
    let total: f64 = slices.iter().map(|s| s.1).sum();
    let (cx, cy) = (f64::from(w) / 2.0, f64::from(h) / 2.0);
    let r = f64::from(w.min(h)) * 0.36;
    let point = |angle: f64, radius: f64| -> (i32, i32) {
        (
            (cx + radius * angle.cos()).round() as i32,
            (cy + radius * angle.sin()).round() as i32,
        )
    };
    // Clockwise from twelve o'clock.
    let mut start = -std::f64::consts::FRAC_PI_2;
    for (i, (name, value)) in slices.iter().enumerate() {
        let sweep = value / total * std::f64::consts::TAU;
        if sweep <= 0.0 {
            continue;
        }
        let steps = ((sweep.to_degrees() / 2.0).ceil() as usize).max(2);
        let mut poly = vec![point(0.0, 0.0)];
        poly.extend((0..=steps).map(|k| point(start + sweep * k as f64 / steps as f64, r)));
        area.draw(&Polygon::new(poly, color(i).filled()))
            .map_err(fail)?;
        area.draw(&PathElement::new(
            vec![point(0.0, 0.0), point(start, r)],
            WHITE.stroke_width(2),
        ))
        .map_err(fail)?;
        let mid = start + sweep / 2.0;
        let share = value / total * 100.0;
        let text = format!(
            "{} {}%",
            format::short(name, 24),
            format::number(share, usize::from(share < 10.0))
        );
        let h_pos = if mid.cos() >= 0.0 {
            HPos::Left
        } else {
            HPos::Right
        };
        let style = TextStyle::from((FONT, 14).into_font())
            .color(&BLACK)
            .pos(Pos::new(h_pos, VPos::Center));
        area.draw(&Text::new(text, point(mid, r + 14.0), style))
            .map_err(fail)?;
        start += sweep;
    }
    Ok(())
}
