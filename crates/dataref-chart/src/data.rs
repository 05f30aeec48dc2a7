//! From Arrow columns to what is drawn: categories summed and folded to the top N, series
//! merged by `x` and reduced per pixel column, histogram bins, pie slices.

use std::collections::HashMap;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal128Type, Float16Type, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Schema, TimeUnit};

use crate::format;
use crate::{ChartError, ChartKind, ChartSpec, SortOrder};

/// Categories beyond this on a line or area over text `x` are refused: such an axis is
/// unreadable, and a date or number `x` would be downsampled instead.
const MAX_LINE_CATEGORIES: usize = 2_000;
const DEFAULT_TOP_BARS: usize = 20;
const DEFAULT_TOP_SLICES: usize = 8;
const DEFAULT_TOP_GROUPS: usize = 8;

/// What the `x` axis measures.
#[derive(Debug, Clone, PartialEq)]
pub enum XScale {
    Number,
    /// Days since the epoch, with a fraction for the time of day.
    Date,
    /// One position per label, at 0, 1, 2, …
    Category(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// `values[series][category]`.
    Bars {
        categories: Vec<String>,
        series: Vec<(String, Vec<f64>)>,
    },
    Lines {
        x: XScale,
        series: Vec<Series>,
        area: bool,
    },
    Dots {
        x: XScale,
        series: Vec<Series>,
    },
    Histogram {
        x: XScale,
        edges: Vec<f64>,
        series: Vec<(String, Vec<u64>)>,
    },
    Pie {
        slices: Vec<(String, f64)>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    pub body: Body,
    pub x_label: String,
    pub y_label: String,
    pub rows: u64,
}

impl Plot {
    pub fn points(&self) -> u64 {
        let n = match &self.body {
            Body::Bars { categories, series } => categories.len() * series.len(),
            Body::Lines { series, .. } | Body::Dots { series, .. } => {
                series.iter().map(|s| s.points.len()).sum()
            }
            Body::Histogram { edges, series, .. } => edges.len().saturating_sub(1) * series.len(),
            Body::Pie { slices } => slices.len(),
        };
        n as u64
    }

    pub fn series_count(&self) -> usize {
        match &self.body {
            Body::Bars { series, .. } => series.len(),
            Body::Lines { series, .. } | Body::Dots { series, .. } => series.len(),
            Body::Histogram { series, .. } => series.len(),
            Body::Pie { .. } => 1,
        }
    }

    pub fn default_title(&self) -> String {
        match &self.body {
            Body::Histogram { .. } => format!("distribution of {}", self.x_label),
            Body::Dots { .. } => format!("{} vs {}", self.y_label, self.x_label),
            Body::Bars { .. } | Body::Lines { .. } | Body::Pie { .. } => {
                format!("{} by {}", self.y_label, self.x_label)
            }
        }
    }
}

/// A hashable cell of a key column (`x` categories, groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key<'a> {
    Null,
    Text(&'a str),
    /// The bits of an `f64` (numbers, or days for dates).
    Num(u64),
}

/// A column read as keys or as numbers.
enum Column<'a> {
    Utf8(&'a arrow_array::StringArray),
    LargeUtf8(&'a arrow_array::LargeStringArray),
    Utf8View(&'a arrow_array::StringViewArray),
    Bool(&'a arrow_array::BooleanArray),
    /// Numbers or days; NaN for NULL.
    Num(Vec<f64>),
}

impl<'a> Column<'a> {
    fn key(&self, row: usize) -> Key<'a> {
        match self {
            Self::Utf8(a) => text_key(*a, row, |a, r| a.value(r)),
            Self::LargeUtf8(a) => text_key(*a, row, |a, r| a.value(r)),
            Self::Utf8View(a) => text_key(*a, row, |a, r| a.value(r)),
            Self::Bool(a) => {
                if a.is_null(row) {
                    Key::Null
                } else if a.value(row) {
                    Key::Text("true")
                } else {
                    Key::Text("false")
                }
            }
            Self::Num(v) => {
                let x = v[row];
                if x.is_nan() {
                    Key::Null
                } else {
                    // One key for 0 and -0.
                    Key::Num((x + 0.0).to_bits())
                }
            }
        }
    }
}

fn text_key<'a, A: Array>(a: &'a A, row: usize, value: fn(&'a A, usize) -> &'a str) -> Key<'a> {
    if a.is_null(row) {
        Key::Null
    } else {
        Key::Text(value(a, row))
    }
}

/// The kind of values a column holds, as far as charts care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ValueKind {
    Text,
    Number,
    Date,
}

fn value_kind(dt: &DataType) -> Option<ValueKind> {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Boolean => {
            Some(ValueKind::Text)
        }
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal128(_, _) => Some(ValueKind::Number),
        DataType::Date32 | DataType::Date64 | DataType::Timestamp(_, _) => Some(ValueKind::Date),
        _ => None,
    }
}

fn type_label(dt: &DataType) -> String {
    match value_kind(dt) {
        Some(ValueKind::Text) => "text".into(),
        Some(ValueKind::Number) => "numeric".into(),
        Some(ValueKind::Date) => "a date".into(),
        None => format!("`{dt}`").to_lowercase(),
    }
}

/// Numbers (or days since the epoch for dates) with NaN for NULL, NaN and infinities;
/// `None` for other types.
fn numbers(array: &ArrayRef) -> Option<Vec<f64>> {
    fn prim<T: arrow_array::ArrowPrimitiveType>(
        a: &ArrayRef,
        f: impl Fn(T::Native) -> f64,
    ) -> Vec<f64> {
        let a = a.as_primitive::<T>();
        (0..a.len())
            .map(|i| {
                // Infinities are as undrawable as NULLs.
                let v = if a.is_null(i) {
                    f64::NAN
                } else {
                    f(a.value(i))
                };
                if v.is_finite() { v } else { f64::NAN }
            })
            .collect()
    }
    const MS_PER_DAY: f64 = 86_400_000.0;
    let v = match array.data_type() {
        DataType::Int8 => prim::<Int8Type>(array, f64::from),
        DataType::Int16 => prim::<Int16Type>(array, f64::from),
        DataType::Int32 => prim::<Int32Type>(array, f64::from),
        DataType::Int64 => prim::<Int64Type>(array, |v| v as f64),
        DataType::UInt8 => prim::<UInt8Type>(array, f64::from),
        DataType::UInt16 => prim::<UInt16Type>(array, f64::from),
        DataType::UInt32 => prim::<UInt32Type>(array, f64::from),
        DataType::UInt64 => prim::<UInt64Type>(array, |v| v as f64),
        DataType::Float16 => prim::<Float16Type>(array, f64::from),
        DataType::Float32 => prim::<Float32Type>(array, f64::from),
        DataType::Float64 => prim::<Float64Type>(array, |v| v),
        DataType::Decimal128(_, scale) => {
            let div = 10f64.powi(i32::from(*scale));
            prim::<Decimal128Type>(array, |v| v as f64 / div)
        }
        DataType::Date32 => prim::<Date32Type>(array, f64::from),
        DataType::Date64 => prim::<Date64Type>(array, |v| v as f64 / MS_PER_DAY),
        DataType::Timestamp(unit, _) => match unit {
            TimeUnit::Second => prim::<TimestampSecondType>(array, |v| v as f64 / 86_400.0),
            TimeUnit::Millisecond => {
                prim::<TimestampMillisecondType>(array, |v| v as f64 / MS_PER_DAY)
            }
            TimeUnit::Microsecond => {
                prim::<TimestampMicrosecondType>(array, |v| v as f64 / (MS_PER_DAY * 1e3))
            }
            TimeUnit::Nanosecond => {
                prim::<TimestampNanosecondType>(array, |v| v as f64 / (MS_PER_DAY * 1e6))
            }
        },
        _ => return None,
    };
    Some(v)
}

fn column<'a>(array: &'a ArrayRef) -> Option<Column<'a>> {
    Some(match array.data_type() {
        DataType::Utf8 => Column::Utf8(array.as_string::<i32>()),
        DataType::LargeUtf8 => Column::LargeUtf8(array.as_string::<i64>()),
        DataType::Utf8View => Column::Utf8View(array.as_string_view()),
        DataType::Boolean => Column::Bool(array.as_boolean()),
        _ => Column::Num(numbers(array)?),
    })
}

/// A column of the chart, resolved against the schema.
struct Col {
    name: String,
    index: usize,
    kind: ValueKind,
}

fn resolve<'s>(schema: &'s Schema, name: &str) -> Result<(usize, &'s DataType), ChartError> {
    schema
        .index_of(name)
        .map(|i| (i, schema.field(i).data_type()))
        .map_err(|_| ChartError::UnknownColumn {
            column: name.to_owned(),
            available: schema.fields().iter().map(|f| f.name().clone()).collect(),
        })
}

fn key_col(schema: &Schema, name: &str, kind: ChartKind) -> Result<Col, ChartError> {
    let (index, dt) = resolve(schema, name)?;
    let vk = value_kind(dt).ok_or_else(|| {
        ChartError::Unsupported(format!(
            "column `{name}` is {}, which {} charts cannot use",
            type_label(dt),
            kind.as_str()
        ))
    })?;
    Ok(Col {
        name: name.to_owned(),
        index,
        kind: vk,
    })
}

fn value_col(schema: &Schema, name: &str, kind: ChartKind) -> Result<Col, ChartError> {
    let (index, dt) = resolve(schema, name)?;
    match value_kind(dt) {
        Some(vk @ ValueKind::Number) => Ok(Col {
            name: name.to_owned(),
            index,
            kind: vk,
        }),
        _ => Err(ChartError::NotNumeric {
            column: name.to_owned(),
            found: type_label(dt),
            kind: kind.as_str(),
        }),
    }
}

/// Interned keys in order of first appearance (so output never depends on hash order).
#[derive(Default)]
struct Interner<'a> {
    index: HashMap<Key<'a>, usize>,
    keys: Vec<Key<'a>>,
}

impl<'a> Interner<'a> {
    fn id(&mut self, key: Key<'a>) -> usize {
        let next = self.keys.len();
        *self.index.entry(key).or_insert_with(|| {
            self.keys.push(key);
            next
        })
    }

    fn label(&self, id: usize, kind: ValueKind) -> String {
        match self.keys.get(id) {
            Some(Key::Text(s)) => (*s).to_owned(),
            Some(Key::Num(bits)) => {
                let v = f64::from_bits(*bits);
                match kind {
                    ValueKind::Date => format::date_full(v),
                    ValueKind::Number | ValueKind::Text => format::number_auto(v),
                }
            }
            Some(Key::Null) | None => "(null)".into(),
        }
    }

    /// The value to sort by `x`: the number for numbers and dates.
    fn num(&self, id: usize) -> Option<f64> {
        match self.keys.get(id) {
            Some(Key::Num(bits)) => Some(f64::from_bits(*bits)),
            _ => None,
        }
    }
}

/// Builds what [`crate::draw`] draws.
pub(crate) fn prepare(
    schema: &Schema,
    batches: &[RecordBatch],
    spec: &ChartSpec,
) -> Result<Plot, ChartError> {
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    let x = key_col(schema, &spec.x, spec.kind)?;
    let group = spec
        .group
        .as_deref()
        .map(|g| key_col(schema, g, spec.kind))
        .transpose()?;
    let ys = match spec.kind {
        ChartKind::Histogram => Vec::new(),
        _ => spec
            .y
            .iter()
            .map(|y| value_col(schema, y, spec.kind))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let y_label = match spec.kind {
        ChartKind::Histogram => "rows".to_owned(),
        _ if ys.is_empty() => "rows".to_owned(),
        _ => ys
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let reader = Reader {
        batches,
        x: &x,
        group: group.as_ref(),
        ys: &ys,
    };
    let body = match spec.kind {
        ChartKind::Bar => bars(&reader, spec)?,
        ChartKind::Pie => pie(&reader, spec)?,
        ChartKind::Line | ChartKind::Area => match x.kind {
            ValueKind::Text => category_lines(&reader, spec)?,
            ValueKind::Number | ValueKind::Date => lines(&reader, spec)?,
        },
        ChartKind::Scatter => dots(&reader, spec)?,
        ChartKind::Histogram => histogram(&reader, spec)?,
    };
    Ok(Plot {
        body,
        x_label: x.name.clone(),
        y_label,
        rows,
    })
}

struct Reader<'r> {
    batches: &'r [RecordBatch],
    x: &'r Col,
    group: Option<&'r Col>,
    ys: &'r [Col],
}

/// The per-row view of one batch.
struct BatchView<'a> {
    x: Column<'a>,
    group: Option<Column<'a>>,
    /// Numbers per `y`; empty: count rows.
    ys: Vec<Vec<f64>>,
    rows: usize,
}

impl<'r> Reader<'r> {
    fn view(&self, batch: &'r RecordBatch) -> Result<BatchView<'r>, ChartError> {
        let col = |c: &Col| -> Result<Column<'r>, ChartError> {
            column(batch.column(c.index)).ok_or_else(|| {
                ChartError::Draw(format!("column `{}` changed type between batches", c.name))
            })
        };
        let ys = self
            .ys
            .iter()
            .map(|c| {
                numbers(batch.column(c.index)).ok_or_else(|| {
                    ChartError::Draw(format!("column `{}` is not numeric in a batch", c.name))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BatchView {
            x: col(self.x)?,
            group: self.group.map(col).transpose()?,
            ys,
            rows: batch.num_rows(),
        })
    }

    fn y_names(&self) -> Vec<String> {
        if self.ys.is_empty() {
            vec!["rows".into()]
        } else {
            self.ys.iter().map(|c| c.name.clone()).collect()
        }
    }

    /// Series names for (group id, y index) once groups are known.
    fn series_name(&self, groups: &Interner<'_>, g: usize, y: usize) -> String {
        let ys = self.y_names();
        match self.group {
            None => ys[y].clone(),
            Some(gc) if ys.len() == 1 => groups.label(g, gc.kind),
            Some(gc) => format!("{} · {}", groups.label(g, gc.kind), ys[y]),
        }
    }
}

impl BatchView<'_> {
    /// The value of `y` number `j` in `row` (1 when counting rows); NaN for NULL.
    fn y(&self, j: usize, row: usize) -> f64 {
        match self.ys.get(j) {
            Some(v) => v[row],
            None => 1.0,
        }
    }

    fn y_count(&self) -> usize {
        self.ys.len().max(1)
    }
}

/// Sums per (series, category): `sums[series][category]`, series = group × y.
struct CategorySums<'a> {
    cats: Interner<'a>,
    groups: Interner<'a>,
    sums: Vec<Vec<f64>>,
    y_count: usize,
}

fn category_sums<'a>(reader: &Reader<'a>) -> Result<CategorySums<'a>, ChartError> {
    let mut cats = Interner::default();
    let mut groups = Interner::default();
    let y_count = reader.ys.len().max(1);
    let mut sums: Vec<Vec<f64>> = Vec::new();
    for batch in reader.batches {
        let view = reader.view(batch)?;
        for row in 0..view.rows {
            let c = cats.id(view.x.key(row));
            let g = match &view.group {
                Some(gc) => groups.id(gc.key(row)),
                None => 0,
            };
            for j in 0..view.y_count() {
                let v = view.y(j, row);
                if v.is_nan() {
                    continue;
                }
                let s = g * y_count + j;
                if sums.len() <= s {
                    sums.resize_with(s + 1, Vec::new);
                }
                let col = &mut sums[s];
                if col.len() <= c {
                    col.resize(c + 1, 0.0);
                }
                col[c] += v;
            }
        }
    }
    for col in &mut sums {
        col.resize(cats.keys.len(), 0.0);
    }
    if cats.keys.is_empty() {
        return Err(ChartError::NoData);
    }
    Ok(CategorySums {
        cats,
        groups,
        sums,
        y_count,
    })
}

/// Folds groups beyond `top` (by total absolute value) into `other`, returning named
/// series of per-category sums.
fn fold_groups(reader: &Reader<'_>, cs: &CategorySums<'_>, top: usize) -> Vec<(String, Vec<f64>)> {
    let n_groups = cs.groups.keys.len().max(1);
    let n_cats = cs.cats.keys.len();
    let series_of = |g: usize, j: usize| cs.sums.get(g * cs.y_count + j);
    let total = |g: usize| -> f64 {
        (0..cs.y_count)
            .filter_map(|j| series_of(g, j))
            .flat_map(|v| v.iter())
            .map(|v| v.abs())
            .sum()
    };
    let mut order: Vec<usize> = (0..n_groups).collect();
    let folding = reader.group.is_some() && n_groups > top;
    if folding {
        let totals: Vec<f64> = order.iter().map(|g| total(*g)).collect();
        order.sort_by(|a, b| totals[*b].total_cmp(&totals[*a]).then(a.cmp(b)));
    }
    let kept = if folding { top } else { n_groups };
    let mut out = Vec::new();
    for &g in &order[..kept] {
        for j in 0..cs.y_count {
            let values = series_of(g, j)
                .cloned()
                .unwrap_or_else(|| vec![0.0; n_cats]);
            out.push((reader.series_name(&cs.groups, g, j), values));
        }
    }
    if folding {
        let ys = reader.y_names();
        for (j, y) in ys.iter().enumerate() {
            let mut values = vec![0.0; n_cats];
            for &g in &order[kept..] {
                if let Some(s) = series_of(g, j) {
                    for (acc, v) in values.iter_mut().zip(s) {
                        *acc += v;
                    }
                }
            }
            let name = if ys.len() == 1 {
                format!("other ({} more)", n_groups - kept)
            } else {
                format!("other · {y}")
            };
            out.push((name, values));
        }
    }
    out
}

/// Keeps the `top` categories by total (the rest summed into `other`), ordered by `sort`.
fn fold_categories(
    cs: &CategorySums<'_>,
    x_kind: ValueKind,
    series: Vec<(String, Vec<f64>)>,
    top: Option<usize>,
    sort: SortOrder,
) -> (Vec<String>, Vec<(String, Vec<f64>)>) {
    let n = cs.cats.keys.len();
    let totals: Vec<f64> = (0..n)
        .map(|c| series.iter().map(|(_, v)| v[c]).sum())
        .collect();
    let labels: Vec<String> = (0..n).map(|c| cs.cats.label(c, x_kind)).collect();
    let by_x = |a: &usize, b: &usize| match (cs.cats.num(*a), cs.cats.num(*b)) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => labels[*a].cmp(&labels[*b]),
    };
    let mut ids: Vec<usize> = (0..n).collect();
    let mut folded = Vec::new();
    if let Some(top) = top.filter(|t| n > *t) {
        ids.sort_by(|a, b| {
            totals[*b]
                .abs()
                .total_cmp(&totals[*a].abs())
                .then_with(|| by_x(a, b))
        });
        folded = ids.split_off(top);
    }
    match sort {
        SortOrder::X => ids.sort_by(by_x),
        SortOrder::Descending => {
            ids.sort_by(|a, b| totals[*b].total_cmp(&totals[*a]).then_with(|| by_x(a, b)))
        }
        SortOrder::Ascending => {
            ids.sort_by(|a, b| totals[*a].total_cmp(&totals[*b]).then_with(|| by_x(a, b)))
        }
    }
    let mut out_labels: Vec<String> = ids.iter().map(|c| labels[*c].clone()).collect();
    let out_series = series
        .into_iter()
        .map(|(name, values)| {
            let mut kept: Vec<f64> = ids.iter().map(|c| values[*c]).collect();
            if !folded.is_empty() {
                kept.push(folded.iter().map(|c| values[*c]).sum());
            }
            (name, kept)
        })
        .collect();
    if !folded.is_empty() {
        out_labels.push(format!("other ({} more)", folded.len()));
    }
    (out_labels, out_series)
}

fn default_sort(x: ValueKind) -> SortOrder {
    match x {
        ValueKind::Text => SortOrder::Descending,
        ValueKind::Number | ValueKind::Date => SortOrder::X,
    }
}

fn bars(reader: &Reader<'_>, spec: &ChartSpec) -> Result<Body, ChartError> {
    let cs = category_sums(reader)?;
    let series = fold_groups(reader, &cs, spec.top.unwrap_or(DEFAULT_TOP_GROUPS).max(1));
    let top = spec.top.unwrap_or(DEFAULT_TOP_BARS).max(1);
    let sort = spec.sort.unwrap_or(default_sort(reader.x.kind));
    let (categories, series) = fold_categories(&cs, reader.x.kind, series, Some(top), sort);
    Ok(Body::Bars { categories, series })
}

fn pie(reader: &Reader<'_>, spec: &ChartSpec) -> Result<Body, ChartError> {
    if reader.ys.len() > 1 {
        return Err(ChartError::Unsupported(
            "a pie shows one `y`; pass a single column (or none to count rows)".into(),
        ));
    }
    if reader.group.is_some() {
        return Err(ChartError::Unsupported(
            "a pie has no groups; use `bar` with `group`, or leave `group` out".into(),
        ));
    }
    let cs = category_sums(reader)?;
    let series = fold_groups(reader, &cs, 1);
    let top = spec.top.unwrap_or(DEFAULT_TOP_SLICES).max(1);
    let sort = spec.sort.unwrap_or(SortOrder::Descending);
    let (labels, series) = fold_categories(&cs, reader.x.kind, series, Some(top), sort);
    let values = series
        .into_iter()
        .next()
        .map(|(_, v)| v)
        .unwrap_or_default();
    if values.iter().any(|v| *v < 0.0) {
        return Err(ChartError::Unsupported(format!(
            "a pie needs sums of `{}` that are not negative; use `bar` for signed values",
            reader.y_names().join(", ")
        )));
    }
    let slices: Vec<(String, f64)> = labels.into_iter().zip(values).collect();
    if slices.iter().all(|(_, v)| *v == 0.0) {
        return Err(ChartError::NoData);
    }
    Ok(Body::Pie { slices })
}

fn category_lines(reader: &Reader<'_>, spec: &ChartSpec) -> Result<Body, ChartError> {
    let cs = category_sums(reader)?;
    if cs.cats.keys.len() > MAX_LINE_CATEGORIES {
        return Err(ChartError::Unsupported(format!(
            "`{}` has {} distinct text values, too many for a line; use a date or number `x`, \
             or a `bar` chart (which keeps the top N)",
            reader.x.name,
            cs.cats.keys.len()
        )));
    }
    let series = fold_groups(reader, &cs, spec.top.unwrap_or(DEFAULT_TOP_GROUPS).max(1));
    let sort = spec.sort.unwrap_or(SortOrder::X);
    let (labels, series) = fold_categories(&cs, reader.x.kind, series, spec.top, sort);
    let series = series
        .into_iter()
        .map(|(name, values)| Series {
            name,
            points: values
                .into_iter()
                .enumerate()
                .map(|(i, v)| (i as f64, v))
                .collect(),
        })
        .collect();
    Ok(Body::Lines {
        x: XScale::Category(labels),
        series,
        area: spec.kind == ChartKind::Area,
    })
}

/// Raw (x, y) pairs per series (group × y), NULLs skipped, groups beyond `top` merged
/// into `other`.
fn pairs(reader: &Reader<'_>, top: usize) -> Result<Vec<Series>, ChartError> {
    let mut groups = Interner::default();
    let y_count = reader.ys.len().max(1);
    let mut raw: Vec<Vec<(f64, f64)>> = Vec::new();
    for batch in reader.batches {
        let view = reader.view(batch)?;
        let Column::Num(xs) = &view.x else {
            return Err(ChartError::Draw("x is not numeric".into()));
        };
        for (row, &x) in xs.iter().enumerate() {
            if x.is_nan() {
                continue;
            }
            let g = match &view.group {
                Some(gc) => groups.id(gc.key(row)),
                None => 0,
            };
            for j in 0..y_count {
                let y = view.y(j, row);
                if y.is_nan() {
                    continue;
                }
                let s = g * y_count + j;
                if raw.len() <= s {
                    raw.resize_with(s + 1, Vec::new);
                }
                raw[s].push((x, y));
            }
        }
    }
    if raw.iter().all(Vec::is_empty) {
        return Err(ChartError::NoData);
    }
    let n_groups = groups.keys.len().max(1);
    raw.resize_with(n_groups * y_count, Vec::new);
    let mut order: Vec<usize> = (0..n_groups).collect();
    let folding = reader.group.is_some() && n_groups > top;
    if folding {
        let totals: Vec<usize> = (0..n_groups)
            .map(|g| (0..y_count).map(|j| raw[g * y_count + j].len()).sum())
            .collect();
        order.sort_by(|a, b| totals[*b].cmp(&totals[*a]).then(a.cmp(b)));
    }
    let kept = if folding { top } else { n_groups };
    let mut out = Vec::new();
    for &g in &order[..kept] {
        for j in 0..y_count {
            out.push(Series {
                name: reader.series_name(&groups, g, j),
                points: std::mem::take(&mut raw[g * y_count + j]),
            });
        }
    }
    if folding {
        let ys = reader.y_names();
        for (j, y) in ys.iter().enumerate() {
            let mut points = Vec::new();
            for &g in &order[kept..] {
                points.append(&mut raw[g * y_count + j]);
            }
            let name = if ys.len() == 1 {
                format!("other ({} more)", n_groups - kept)
            } else {
                format!("other · {y}")
            };
            out.push(Series { name, points });
        }
    }
    Ok(out)
}

fn x_scale(kind: ValueKind) -> XScale {
    match kind {
        ValueKind::Date => XScale::Date,
        ValueKind::Number | ValueKind::Text => XScale::Number,
    }
}

fn lines(reader: &Reader<'_>, spec: &ChartSpec) -> Result<Body, ChartError> {
    let mut series = pairs(reader, spec.top.unwrap_or(DEFAULT_TOP_GROUPS).max(1))?;
    // Bucket count: one per pixel column of the whole image (the plot is a little
    // narrower, so a bucket is at most one pixel wide).
    let buckets = spec.width as usize;
    for s in &mut series {
        let merged = merge_by_x(std::mem::take(&mut s.points));
        s.points = downsample(merged, buckets);
    }
    Ok(Body::Lines {
        x: x_scale(reader.x.kind),
        series,
        area: spec.kind == ChartKind::Area,
    })
}

/// Sorted by `x`, rows with the same `x` summed (several sales on one day are that day's
/// total).
fn merge_by_x(mut points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    points.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(points.len());
    for (x, y) in points {
        match out.last_mut() {
            Some(last) if last.0 == x => last.1 += y,
            _ => out.push((x, y)),
        }
    }
    out
}

/// At most two points per bucket of `x` (its minimum and maximum, in `x` order), so the
/// drawn line keeps every peak and trough a pixel column can show. `points` is sorted by
/// `x`; a series short enough is returned as it is.
pub(crate) fn downsample(points: Vec<(f64, f64)>, buckets: usize) -> Vec<(f64, f64)> {
    if points.len() <= 2 * buckets.max(1) {
        return points;
    }
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return points;
    };
    let (lo, hi) = (first.0, last.0);
    let width = (hi - lo) / buckets as f64;
    let mut out = Vec::with_capacity(2 * buckets);
    /// The bucket being filled: its index and its lowest and highest point.
    struct Bucket {
        index: usize,
        min: (f64, f64),
        max: (f64, f64),
    }
    let flush = |b: Bucket, out: &mut Vec<(f64, f64)>| {
        if b.min == b.max {
            out.push(b.min);
        } else if b.min.0 <= b.max.0 {
            out.extend([b.min, b.max]);
        } else {
            out.extend([b.max, b.min]);
        }
    };
    let mut current: Option<Bucket> = None;
    for p in points {
        let index = (((p.0 - lo) / width) as usize).min(buckets - 1);
        match &mut current {
            Some(b) if b.index == index => {
                if p.1 < b.min.1 {
                    b.min = p;
                }
                if p.1 > b.max.1 {
                    b.max = p;
                }
            }
            _ => {
                if let Some(b) = current.take() {
                    flush(b, &mut out);
                }
                current = Some(Bucket {
                    index,
                    min: p,
                    max: p,
                });
            }
        }
    }
    if let Some(b) = current {
        flush(b, &mut out);
    }
    out
}

fn dots(reader: &Reader<'_>, spec: &ChartSpec) -> Result<Body, ChartError> {
    if reader.x.kind == ValueKind::Text {
        return Err(ChartError::Unsupported(format!(
            "a scatter needs numbers or dates on `x`, and `{}` is text; use `bar` or `line`",
            reader.x.name
        )));
    }
    if reader.ys.is_empty() {
        return Err(ChartError::Unsupported(
            "a scatter needs at least one `y` column".into(),
        ));
    }
    let mut series = pairs(reader, spec.top.unwrap_or(DEFAULT_TOP_GROUPS).max(1))?;
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for p in series.iter().flat_map(|s| s.points.iter()) {
        x0 = x0.min(p.0);
        x1 = x1.max(p.0);
        y0 = y0.min(p.1);
        y1 = y1.max(p.1);
    }
    // One dot per 3×3-pixel cell and series: a denser cloud looks the same.
    let (cols, rows) = (
        (spec.width / 3).max(1) as usize,
        (spec.height / 3).max(1) as usize,
    );
    let (dx, dy) = (
        (x1 - x0).max(f64::MIN_POSITIVE),
        (y1 - y0).max(f64::MIN_POSITIVE),
    );
    for s in &mut series {
        if s.points.len() <= cols * rows / 8 {
            continue;
        }
        let mut seen = vec![false; cols * rows];
        s.points.retain(|p| {
            let c = (((p.0 - x0) / dx * cols as f64) as usize).min(cols - 1);
            let r = (((p.1 - y0) / dy * rows as f64) as usize).min(rows - 1);
            let cell = &mut seen[r * cols + c];
            !std::mem::replace(cell, true)
        });
    }
    Ok(Body::Dots {
        x: x_scale(reader.x.kind),
        series,
    })
}

fn histogram(reader: &Reader<'_>, spec: &ChartSpec) -> Result<Body, ChartError> {
    if reader.x.kind == ValueKind::Text {
        return Err(ChartError::Unsupported(format!(
            "a histogram needs numbers or dates on `x`, and `{}` is text; use `bar` (it counts \
             rows per value when `y` is left out)",
            reader.x.name
        )));
    }
    // Values per group.
    let mut groups = Interner::default();
    let mut values: Vec<Vec<f64>> = Vec::new();
    for batch in reader.batches {
        let view = reader.view(batch)?;
        let Column::Num(xs) = &view.x else {
            return Err(ChartError::Draw("x is not numeric".into()));
        };
        for (row, &x) in xs.iter().enumerate() {
            if x.is_nan() {
                continue;
            }
            let g = match &view.group {
                Some(gc) => groups.id(gc.key(row)),
                None => 0,
            };
            if values.len() <= g {
                values.resize_with(g + 1, Vec::new);
            }
            values[g].push(x);
        }
    }
    let n: usize = values.iter().map(Vec::len).sum();
    if n == 0 {
        return Err(ChartError::NoData);
    }
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.iter().flatten() {
        lo = lo.min(*v);
        hi = hi.max(*v);
    }
    if hi <= lo {
        lo -= 0.5;
        hi += 0.5;
    }
    let bins = ((n as f64).sqrt().ceil() as usize).clamp(5, 50);
    let width = (hi - lo) / bins as f64;
    let edges: Vec<f64> = (0..=bins).map(|i| lo + width * i as f64).collect();
    let top = spec.top.unwrap_or(DEFAULT_TOP_GROUPS).max(1);
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|a, b| values[*b].len().cmp(&values[*a].len()).then(a.cmp(b)));
    let mut series = Vec::new();
    let mut other = vec![0u64; bins];
    let mut others = 0;
    for (rank, g) in order.into_iter().enumerate() {
        let mut counts = vec![0u64; bins];
        for v in &values[g] {
            let b = (((v - lo) / width) as usize).min(bins - 1);
            counts[b] += 1;
        }
        if rank < top {
            let name = match reader.group {
                Some(gc) => groups.label(g, gc.kind),
                None => "rows".into(),
            };
            series.push((name, counts));
        } else {
            others += 1;
            for (acc, c) in other.iter_mut().zip(counts) {
                *acc += c;
            }
        }
    }
    if others > 0 {
        series.push((format!("other ({others} more)"), other));
    }
    Ok(Body::Histogram {
        x: x_scale(reader.x.kind),
        edges,
        series,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downsampling_keeps_extremes_per_bucket() {
        let points: Vec<(f64, f64)> = (0..1_000_000i64)
            .map(|i| (i as f64, ((i * 7919) % 1000) as f64))
            .collect();
        let out = downsample(points, 500);
        assert!(out.len() <= 1000, "{}", out.len());
        assert!(out.len() >= 500);
        assert!(out.iter().any(|p| p.1 == 999.0));
        assert!(out.iter().any(|p| p.1 == 0.0));
        assert!(out.windows(2).all(|w| w[0].0 <= w[1].0), "x order kept");
    }

    #[test]
    fn merging_sums_equal_x() {
        let out = merge_by_x(vec![(2.0, 1.0), (1.0, 5.0), (2.0, 3.0)]);
        assert_eq!(out, vec![(1.0, 5.0), (2.0, 4.0)]);
    }
}
