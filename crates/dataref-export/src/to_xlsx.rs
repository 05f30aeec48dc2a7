//! XLSX through `rust_xlsxwriter` in constant-memory mode (rows stream to a temporary file
//! per sheet): numbers as numbers, dates and timestamps as Excel dates with a date format,
//! booleans as booleans, text as text cells (never formulas); a bold, frozen header row;
//! column widths from the content; more rows than a sheet holds continue on further sheets,
//! each with the header.

use std::io::Write;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal128Type, Float16Type, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use rust_xlsxwriter::{Color, Format, FormatBorder, Workbook, Worksheet};

use crate::ExportError;
use crate::plan::Plan;
use crate::text::timestamp_micros;

/// Data rows per worksheet: Excel's 1,048,576 rows less the header.
pub const MAX_DATA_ROWS_PER_SHEET: u64 = 1_048_575;
/// Columns per worksheet.
const MAX_COLUMNS: usize = 16_384;
/// Characters per cell.
const MAX_CELL_CHARS: usize = 32_767;
/// Integers beyond ±2^53 lose digits as Excel numbers; they are written as text.
const EXACT_INT: u64 = 1 << 53;
/// The Excel serial number of 1970-01-01.
const EPOCH_SERIAL: f64 = 25_569.0;
/// Excel serials below this (before 1900-03-01) are not real dates; those cells are text.
const FIRST_SAFE_SERIAL: f64 = 61.0;
/// The serial of 10000-01-01, past Excel's last date.
const END_SERIAL: f64 = 2_958_466.0;
/// Rows looked at to size the columns.
const WIDTH_SAMPLE_ROWS: usize = 10_000;

struct Styles {
    header: Format,
    date: Format,
    timestamp: Format,
}

/// Writes the workbook; returns the data rows and the number of sheets.
pub(crate) fn write<W: Write + Send>(
    plan: &Plan,
    out: W,
    interrupted: &dyn Fn() -> bool,
) -> Result<(u64, usize), ExportError> {
    let headers = plan.headers();
    if headers.len() > MAX_COLUMNS {
        return Err(ExportError::TooWideForXlsx {
            columns: headers.len(),
        });
    }
    let styles = Styles {
        header: Format::new()
            .set_bold()
            .set_background_color(Color::RGB(0xE8_EC_F1))
            .set_border_bottom(FormatBorder::Thin),
        date: Format::new().set_num_format("yyyy-mm-dd"),
        timestamp: Format::new().set_num_format("yyyy-mm-dd hh:mm:ss"),
    };
    let mut workbook = Workbook::new();
    let mut widths: Option<Vec<f64>> = None;
    let mut sheets = 0usize;
    let mut sheet: Option<&mut Worksheet> = None;
    let mut row_in_sheet = 0u64;
    let mut rows = 0u64;

    for batch in plan.batches() {
        if interrupted() {
            return Err(ExportError::Cancelled);
        }
        let batch = batch?;
        let widths = widths.get_or_insert_with(|| column_widths(&headers, &batch));
        for row in 0..batch.num_rows() {
            if sheet.is_none() || row_in_sheet == MAX_DATA_ROWS_PER_SHEET {
                sheets += 1;
                sheet = Some(new_sheet(&mut workbook, sheets, &headers, widths, &styles)?);
                row_in_sheet = 0;
            }
            if let Some(ws) = sheet.as_deref_mut() {
                // Row 0 is the header; the bound above keeps this within Excel's rows.
                let excel_row = (row_in_sheet + 1) as u32;
                write_row(ws, excel_row, &batch, row, &headers, &styles)?;
            }
            row_in_sheet += 1;
            rows += 1;
        }
    }
    if sheets == 0 {
        // An empty export is still a workbook with the header row.
        let widths = widths.unwrap_or_else(|| {
            headers
                .iter()
                .map(|h| width_of(h.chars().count()))
                .collect()
        });
        new_sheet(&mut workbook, 1, &headers, &widths, &styles)?;
        sheets = 1;
    }
    workbook.save_to_writer(out)?;
    Ok((rows, sheets))
}

fn new_sheet<'w>(
    workbook: &'w mut Workbook,
    number: usize,
    headers: &[String],
    widths: &[f64],
    styles: &Styles,
) -> Result<&'w mut Worksheet, ExportError> {
    let ws = workbook.add_worksheet_with_constant_memory()?;
    ws.set_name(if number == 1 {
        "Data".to_owned()
    } else {
        format!("Data {number}")
    })?;
    for (col, (name, width)) in headers.iter().zip(widths).enumerate() {
        let col = col as u16;
        ws.set_column_width(col, *width)?;
        ws.write_string_with_format(0, col, name.as_str(), &styles.header)?;
    }
    ws.set_freeze_panes(1, 0)?;
    Ok(ws)
}

fn write_row(
    ws: &mut Worksheet,
    excel_row: u32,
    batch: &RecordBatch,
    row: usize,
    headers: &[String],
    styles: &Styles,
) -> Result<(), ExportError> {
    for (col, array) in batch.columns().iter().enumerate() {
        if array.is_null(row) {
            continue;
        }
        let c = col as u16;
        match array.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                let s = match array.data_type() {
                    DataType::Utf8 => array.as_string::<i32>().value(row),
                    DataType::LargeUtf8 => array.as_string::<i64>().value(row),
                    _ => array.as_string_view().value(row),
                };
                text(ws, excel_row, c, s, &headers[col])?;
            }
            DataType::Boolean => {
                ws.write_boolean(excel_row, c, array.as_boolean().value(row))?;
            }
            DataType::Int8 => number(
                ws,
                excel_row,
                c,
                array.as_primitive::<Int8Type>().value(row),
            )?,
            DataType::Int16 => number(
                ws,
                excel_row,
                c,
                array.as_primitive::<Int16Type>().value(row),
            )?,
            DataType::Int32 => number(
                ws,
                excel_row,
                c,
                array.as_primitive::<Int32Type>().value(row),
            )?,
            DataType::UInt8 => number(
                ws,
                excel_row,
                c,
                array.as_primitive::<UInt8Type>().value(row),
            )?,
            DataType::UInt16 => number(
                ws,
                excel_row,
                c,
                array.as_primitive::<UInt16Type>().value(row),
            )?,
            DataType::UInt32 => number(
                ws,
                excel_row,
                c,
                array.as_primitive::<UInt32Type>().value(row),
            )?,
            DataType::Int64 => {
                let v = array.as_primitive::<Int64Type>().value(row);
                if v.unsigned_abs() <= EXACT_INT {
                    number(ws, excel_row, c, v as f64)?;
                } else {
                    ws.write_string(excel_row, c, v.to_string())?;
                }
            }
            DataType::UInt64 => {
                let v = array.as_primitive::<UInt64Type>().value(row);
                if v <= EXACT_INT {
                    number(ws, excel_row, c, v as f64)?;
                } else {
                    ws.write_string(excel_row, c, v.to_string())?;
                }
            }
            DataType::Float16 => number(
                ws,
                excel_row,
                c,
                array.as_primitive::<Float16Type>().value(row).to_f32(),
            )?,
            DataType::Float32 => number(
                ws,
                excel_row,
                c,
                array.as_primitive::<Float32Type>().value(row),
            )?,
            DataType::Float64 => number(
                ws,
                excel_row,
                c,
                array.as_primitive::<Float64Type>().value(row),
            )?,
            DataType::Decimal128(_, scale) => {
                let v = array.as_primitive::<Decimal128Type>().value(row) as f64;
                number(ws, excel_row, c, v / 10f64.powi(i32::from(*scale)))?;
            }
            DataType::Date32 => {
                let days = i64::from(array.as_primitive::<Date32Type>().value(row));
                date(ws, excel_row, c, days as f64, &styles.date, || {
                    dataref_store::format_date(days)
                })?;
            }
            DataType::Date64 => {
                let days = array
                    .as_primitive::<Date64Type>()
                    .value(row)
                    .div_euclid(86_400_000);
                date(ws, excel_row, c, days as f64, &styles.date, || {
                    dataref_store::format_date(days)
                })?;
            }
            DataType::Timestamp(unit, _) => {
                let us = timestamp_micros(array, row, *unit);
                date(
                    ws,
                    excel_row,
                    c,
                    us as f64 / 86_400e6,
                    &styles.timestamp,
                    || dataref_store::format_timestamp_micros(us),
                )?;
            }
            _ => {
                let shown = match dataref_store::cell_to_json(array, row, None).0 {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                text(ws, excel_row, c, &shown, &headers[col])?;
            }
        }
    }
    Ok(())
}

/// A number cell; NaN and infinities (which Excel cannot hold) as text.
fn number(ws: &mut Worksheet, row: u32, col: u16, v: impl Into<f64>) -> Result<(), ExportError> {
    let v: f64 = v.into();
    if v.is_finite() {
        ws.write_number(row, col, v)?;
    } else {
        ws.write_string(
            row,
            col,
            if v.is_nan() {
                "NaN"
            } else if v > 0.0 {
                "inf"
            } else {
                "-inf"
            },
        )?;
    }
    Ok(())
}

/// A date cell from days since 1970-01-01; text where Excel has no such date.
fn date(
    ws: &mut Worksheet,
    row: u32,
    col: u16,
    days: f64,
    format: &Format,
    iso: impl FnOnce() -> String,
) -> Result<(), ExportError> {
    let serial = days + EPOCH_SERIAL;
    if (FIRST_SAFE_SERIAL..END_SERIAL).contains(&serial) {
        ws.write_number_with_format(row, col, serial, format)?;
    } else {
        ws.write_string(row, col, iso())?;
    }
    Ok(())
}

/// A text cell. Written as a string, so `=cmd|…` stays text and never becomes a formula.
fn text(ws: &mut Worksheet, row: u32, col: u16, s: &str, column: &str) -> Result<(), ExportError> {
    if s.len() > MAX_CELL_CHARS {
        let chars = s.chars().count();
        if chars > MAX_CELL_CHARS {
            return Err(ExportError::CellTooLongForXlsx {
                column: column.to_owned(),
                chars,
            });
        }
    }
    ws.write_string(row, col, s)?;
    Ok(())
}

/// Excel column widths (in characters) from the header and the first rows.
fn column_widths(headers: &[String], batch: &RecordBatch) -> Vec<f64> {
    let sample = batch.num_rows().min(WIDTH_SAMPLE_ROWS);
    headers
        .iter()
        .zip(batch.columns())
        .map(|(h, array)| {
            // The header is bold: a little wider per character.
            let header = h.chars().count() + 2;
            let content = (0..sample)
                .filter(|&r| !array.is_null(r))
                .map(|r| shown_chars(array, r))
                .max()
                .unwrap_or(0);
            width_of(header.max(content))
        })
        .collect()
}

fn width_of(chars: usize) -> f64 {
    (chars.clamp(6, 60) + 2) as f64
}

/// About how many characters Excel shows for a cell.
fn shown_chars(array: &ArrayRef, row: usize) -> usize {
    match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(row).chars().count(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(row).chars().count(),
        DataType::Utf8View => array.as_string_view().value(row).chars().count(),
        DataType::Boolean => 5,
        DataType::Date32 | DataType::Date64 => 10,
        DataType::Timestamp(_, _) => 19,
        DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Decimal128(_, _) => {
            // General format shows up to 11 significant characters.
            match dataref_store::cell_to_json(array, row, None).0 {
                serde_json::Value::Number(n) => n.to_string().len().min(11),
                _ => 11,
            }
        }
        _ => match dataref_store::cell_to_json(array, row, None).0 {
            serde_json::Value::String(s) => s.chars().count(),
            other => other.to_string().len(),
        },
    }
}
