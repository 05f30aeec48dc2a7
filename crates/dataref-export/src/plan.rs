//! Which rows and columns go out, in which order: the part every format shares.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef, SortOptions};

use crate::{ExportError, ExportOptions, Order};

/// Rows per output batch when rows are gathered in sorted order.
const GATHER_ROWS: usize = 65_536;

/// The export's rows as batches of the output schema, and where they come from.
pub(crate) struct Plan {
    /// The table's batches, projected to the exported columns (cheap: shared buffers).
    batches: Vec<RecordBatch>,
    /// Exported columns under their display names, dictionaries as their value type.
    schema: SchemaRef,
    /// Row order across all batches (global row numbers) when sorted.
    order: Option<Vec<u32>>,
    /// First row (in output order) and how many rows go out.
    offset: u64,
    rows: u64,
}

impl Plan {
    pub(crate) fn new(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        options: &ExportOptions,
    ) -> Result<Self, ExportError> {
        let available: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let find = |name: &str| {
            available
                .iter()
                .position(|c| c == name)
                .ok_or_else(|| ExportError::UnknownColumn {
                    column: name.to_owned(),
                    available: available.clone(),
                })
        };
        let indices: Vec<usize> = match &options.columns {
            Some(names) => names.iter().map(|n| find(n)).collect::<Result<_, _>>()?,
            None => (0..available.len()).collect(),
        };
        let exported: Vec<String> = indices.iter().map(|&i| available[i].clone()).collect();
        if let Some(unknown) = options.headers.keys().find(|k| !exported.contains(k)) {
            return Err(ExportError::UnknownHeader {
                column: unknown.clone(),
                exported,
            });
        }
        let mut seen = HashSet::new();
        let fields: Vec<Field> = indices
            .iter()
            .map(|&i| {
                let f = schema.field(i);
                let name = options.headers.get(f.name()).unwrap_or(f.name());
                let data_type = match f.data_type() {
                    DataType::Dictionary(_, value) => value.as_ref().clone(),
                    other => other.clone(),
                };
                Field::new(name, data_type, true)
            })
            .collect();
        for f in &fields {
            if !seen.insert(f.name().as_str()) {
                return Err(ExportError::DuplicateName {
                    name: f.name().clone(),
                });
            }
        }
        let out_schema = Arc::new(Schema::new(fields));

        let projected = batches
            .iter()
            .filter(|b| b.num_rows() > 0)
            .map(|b| b.project(&indices))
            .collect::<Result<Vec<_>, _>>()?;
        let stored: u64 = projected.iter().map(|b| b.num_rows() as u64).sum();
        let order = match (&options.rows, &options.sort) {
            (Some(rows), _) => {
                if let Some(&row) = rows.iter().find(|&&r| u64::from(r) >= stored) {
                    return Err(ExportError::NoSuchRow { row, rows: stored });
                }
                Some(rows.clone())
            }
            (None, Some(sort)) => Some(sort_order(batches, find(&sort.column)?, sort, None)?),
            (None, None) => None,
        };
        let total = order.as_ref().map_or(stored, |o| o.len() as u64);
        let offset = options.offset.min(total);
        let rows = (total - offset).min(options.limit.unwrap_or(u64::MAX));
        Ok(Self {
            batches: projected,
            schema: out_schema,
            order,
            offset,
            rows,
        })
    }

    /// The output schema: exported columns under their display names.
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    pub(crate) fn headers(&self) -> Vec<String> {
        self.schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// The rows that go out, in order, as batches of [`Plan::schema`].
    pub(crate) fn batches(&self) -> impl Iterator<Item = Result<RecordBatch, ExportError>> + '_ {
        let end = self.offset + self.rows;
        let windows: Box<dyn Iterator<Item = Result<RecordBatch, ExportError>> + '_> =
            match &self.order {
                None => {
                    let mut start = 0u64;
                    Box::new(self.batches.iter().filter_map(move |b| {
                        let (lo, hi) = (start, start + b.num_rows() as u64);
                        start = hi;
                        let (from, to) = (lo.max(self.offset), hi.min(end));
                        (from < to).then(|| Ok(b.slice((from - lo) as usize, (to - from) as usize)))
                    }))
                }
                Some(order) => {
                    let starts: Vec<u64> = self
                        .batches
                        .iter()
                        .scan(0u64, |acc, b| {
                            let s = *acc;
                            *acc += b.num_rows() as u64;
                            Some(s)
                        })
                        .collect();
                    let refs: Vec<&RecordBatch> = self.batches.iter().collect();
                    let window = &order[self.offset as usize..end as usize];
                    Box::new(window.chunks(GATHER_ROWS).map(move |chunk| {
                        let pairs: Vec<(usize, usize)> = chunk
                            .iter()
                            .map(|&g| {
                                let g = u64::from(g);
                                let b = starts.partition_point(|&s| s <= g) - 1;
                                (b, (g - starts[b]) as usize)
                            })
                            .collect();
                        Ok(arrow_select::interleave::interleave_record_batch(
                            &refs, &pairs,
                        )?)
                    }))
                }
            };
        windows.map(move |b| b.and_then(|b| self.relabel(b)))
    }

    /// A projected batch under the output schema, dictionaries unpacked.
    fn relabel(&self, batch: RecordBatch) -> Result<RecordBatch, ExportError> {
        let columns = batch
            .columns()
            .iter()
            .map(unpack_dictionary)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?)
    }
}

/// The rows of `batches` (numbered across them) in order of the column at `column`, by
/// Arrow's comparator (a total order for every type it sorts: numbers by value, floats with
/// NaN last, text by bytes), NULLs last either way, ties in stored order: all of them, or
/// only the first `limit`. A column of a type Arrow cannot order is
/// [`ExportError::Unsortable`].
pub fn sort_order(
    batches: &[RecordBatch],
    column: usize,
    sort: &crate::SortBy,
    limit: Option<usize>,
) -> Result<Vec<u32>, ExportError> {
    let parts: Vec<ArrayRef> = batches
        .iter()
        .map(|b| unpack_dictionary(b.column(column)))
        .collect::<Result<_, _>>()?;
    let total: usize = parts.iter().map(|a| a.len()).sum();
    if total == 0 {
        return Ok(Vec::new());
    }
    let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
    let values = arrow_select::concat::concat(&refs)?;
    let rows = u32::try_from(total).map_err(|_| {
        ExportError::Arrow(arrow_schema::ArrowError::InvalidArgumentError(format!(
            "{total} rows are too many to sort"
        )))
    })?;
    let options = SortOptions {
        descending: sort.order == Order::Descending,
        nulls_first: false,
    };
    let compare = arrow_ord::ord::make_comparator(values.as_ref(), values.as_ref(), options)
        .map_err(|_| ExportError::Unsortable {
            column: sort.column.clone(),
            type_name: dataref_store::type_name(values.data_type()),
        })?;
    let mut order: Vec<u32> = (0..rows).collect();
    match limit {
        Some(limit) if limit < order.len() => {
            // The stored order breaks ties, which makes the order total and the first
            // `limit` the same every time.
            let by = |a: &u32, b: &u32| compare(*a as usize, *b as usize).then(a.cmp(b));
            if limit == 0 {
                return Ok(Vec::new());
            }
            order.select_nth_unstable_by(limit, by);
            order.truncate(limit);
            order.sort_unstable_by(by);
        }
        // `sort_by` is stable: rows that tie keep the table's order.
        _ => order.sort_by(|&a, &b| compare(a as usize, b as usize)),
    }
    Ok(order)
}

/// A dictionary-encoded column (e.g. a pandas categorical) as plain values.
fn unpack_dictionary(array: &ArrayRef) -> Result<ArrayRef, ExportError> {
    if !matches!(array.data_type(), DataType::Dictionary(_, _)) {
        return Ok(array.clone());
    }
    let dict = array.as_any_dictionary();
    let keys: ScalarBuffer<u32> = dict
        .normalized_keys()
        .into_iter()
        .map(|k| u32::try_from(k).unwrap_or(0))
        .collect();
    let indices = UInt32Array::new(keys, dict.keys().logical_nulls());
    Ok(arrow_select::take::take(
        dict.values().as_ref(),
        &indices,
        None,
    )?)
}
