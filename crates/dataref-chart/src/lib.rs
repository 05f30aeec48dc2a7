//! Charts drawn from Arrow columns, as PNG and SVG, for a person to look at.
//!
//! - [`render`] takes a table's schema and record batches and a [`ChartSpec`] (kind, `x`,
//!   one or more `y`, an optional group column, title, sort, top N, size) and returns a
//!   [`Chart`]: PNG bytes, SVG text and how many points were drawn.
//! - Defaults a person expects: a title and axis labels, thousands separators, date axes
//!   for date and timestamp columns, many categories folded into the top N plus `other`,
//!   long series reduced to the minimum and maximum per pixel column (a million rows never
//!   become a million points), DejaVu Sans embedded (no system fonts), and the same bytes
//!   for the same input.
//! - [`ChartError`] says whether the caller can fix the request
//!   ([`ChartError::is_caller_error`]); an unknown column carries the available ones.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Float64Array, RecordBatch, StringArray};
//! use arrow_schema::{DataType, Field, Schema};
//! use dataref_chart::{ChartKind, ChartSpec, render};
//!
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("region", DataType::Utf8, false),
//!     Field::new("revenue", DataType::Float64, false),
//! ]));
//! let batch = RecordBatch::try_new(schema.clone(), vec![
//!     Arc::new(StringArray::from(vec!["north", "south"])),
//!     Arc::new(Float64Array::from(vec![1200.0, 3400.0])),
//! ]).unwrap();
//! let spec = ChartSpec::new(ChartKind::Bar, "region", vec!["revenue".into()]);
//! let chart = render(&schema, &[batch], &spec).unwrap();
//! assert!(chart.png.starts_with(b"\x89PNG"));
//! assert_eq!(chart.points, 2);
//! ```
//!
//! Owns: `plotters`, `png` and the embedded font; nothing else in the workspace draws.
//! Must not import the store, the workspace, the tools or any transport: it turns batches
//! and a spec into bytes.

mod data;
mod draw;
mod format;

pub use data::{Body, Plot, Series, XScale};

use arrow_array::RecordBatch;
use arrow_schema::Schema;

/// What kind of chart to draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChartKind {
    /// One bar per category of `x` (sum of each `y`), side by side per series.
    Bar,
    /// `y` against `x`, one line per series.
    Line,
    /// A line filled down to zero.
    Area,
    /// One dot per row (dense regions thinned to one dot per few pixels).
    Scatter,
    /// The distribution of `x` in equal-width bins.
    Histogram,
    /// Shares of the sum of one `y` per category of `x`.
    Pie,
}

impl ChartKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bar => "bar",
            Self::Line => "line",
            Self::Area => "area",
            Self::Scatter => "scatter",
            Self::Histogram => "histogram",
            Self::Pie => "pie",
        }
    }
}

/// How categories are ordered (bar, pie, and line or area over text `x`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortOrder {
    /// By `x` itself: numbers and dates ascending, text alphabetically.
    X,
    /// Smallest total first.
    Ascending,
    /// Largest total first.
    Descending,
}

/// What to draw. Build with [`ChartSpec::new`] and set the optional fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartSpec {
    pub kind: ChartKind,
    pub x: String,
    /// Value columns; empty means "count rows". Not used by histograms.
    pub y: Vec<String>,
    /// A column whose values split each `y` into one series per value.
    pub group: Option<String>,
    /// Default: made from the column names, e.g. "revenue by region".
    pub title: Option<String>,
    /// Default: largest first for text categories, by `x` for numbers and dates.
    pub sort: Option<SortOrder>,
    /// Keep this many categories (bar, pie) or groups and fold the rest into `other`.
    /// Default: 20 bars, 8 pie slices, 8 groups.
    pub top: Option<usize>,
    pub width: u32,
    pub height: u32,
}

impl ChartSpec {
    /// Default size: 1000 × 600 pixels.
    pub const DEFAULT_SIZE: (u32, u32) = (1000, 600);
    /// Smallest and largest side in pixels.
    pub const MIN_SIDE: u32 = 200;
    pub const MAX_SIDE: u32 = 4000;

    pub fn new(kind: ChartKind, x: impl Into<String>, y: Vec<String>) -> Self {
        Self {
            kind,
            x: x.into(),
            y,
            group: None,
            title: None,
            sort: None,
            top: None,
            width: Self::DEFAULT_SIZE.0,
            height: Self::DEFAULT_SIZE.1,
        }
    }
}

/// A drawn chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub png: Vec<u8>,
    pub svg: String,
    /// Marks drawn: bars, slices, line vertices, dots (after folding and downsampling).
    pub points: u64,
    /// Rows read from the table.
    pub rows: u64,
    /// Series drawn (y columns × groups).
    pub series: usize,
    /// The title as drawn.
    pub title: String,
}

/// Why a chart could not be drawn.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ChartError {
    #[error("no column `{column}`")]
    UnknownColumn {
        column: String,
        available: Vec<String>,
    },
    #[error("column `{column}` is {found}; {kind} charts need numbers here")]
    NotNumeric {
        column: String,
        found: String,
        kind: &'static str,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("the chart size {width}×{height} is outside {min}..={max} pixels per side",
        min = ChartSpec::MIN_SIDE, max = ChartSpec::MAX_SIDE)]
    BadSize { width: u32, height: u32 },
    #[error("there is nothing to draw: no row has a value in the chosen columns")]
    NoData,
    /// A fault of the drawing or encoding code, not of the request.
    #[error("drawing the chart: {0}")]
    Draw(String),
}

impl ChartError {
    /// True when the request can be fixed by the caller.
    pub fn is_caller_error(&self) -> bool {
        match self {
            Self::UnknownColumn { .. }
            | Self::NotNumeric { .. }
            | Self::Unsupported(_)
            | Self::BadSize { .. }
            | Self::NoData => true,
            Self::Draw(_) => false,
        }
    }

    /// What to do next, for the errors that have a fixed answer. `UnknownColumn` carries
    /// the available columns for the caller to suggest from.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::NotNumeric { .. } => Some(
                "pick a numeric column for `y`, leave `y` out to count rows, or use `x` for the \
                 categories"
                    .into(),
            ),
            Self::BadSize { .. } => Some(format!(
                "leave `width` and `height` out for {}×{}",
                ChartSpec::DEFAULT_SIZE.0,
                ChartSpec::DEFAULT_SIZE.1
            )),
            Self::NoData => Some("check the columns with `describe_data`".into()),
            Self::UnknownColumn { .. } | Self::Unsupported(_) | Self::Draw(_) => None,
        }
    }
}

/// What [`render`] would draw, before drawing: the same categories, folding, bins and
/// downsampling, for a view that draws the chart itself (the page, an MCP Apps host).
pub fn plot(
    schema: &Schema,
    batches: &[RecordBatch],
    spec: &ChartSpec,
) -> Result<Plot, ChartError> {
    data::prepare(schema, batches, spec)
}

/// Draws `spec` over `batches` (all of `schema`). Reads each needed column once; the work
/// after that depends on the chart's size, not on the number of rows.
pub fn render(
    schema: &Schema,
    batches: &[RecordBatch],
    spec: &ChartSpec,
) -> Result<Chart, ChartError> {
    let sides = ChartSpec::MIN_SIDE..=ChartSpec::MAX_SIDE;
    if !sides.contains(&spec.width) || !sides.contains(&spec.height) {
        return Err(ChartError::BadSize {
            width: spec.width,
            height: spec.height,
        });
    }
    let plot = data::prepare(schema, batches, spec)?;
    let title = spec.title.clone().unwrap_or_else(|| plot.default_title());
    let (png, svg) = draw::draw(&plot, &title, spec.width, spec.height)?;
    Ok(Chart {
        png,
        svg,
        points: plot.points(),
        rows: plot.rows,
        series: plot.series_count(),
        title,
    })
}

#[cfg(test)]
mod tests;
